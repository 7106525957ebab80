#!/usr/bin/env python3
"""Builds data/tinystories_eval.jsonl, ekv's in-domain evaluation set for the
bundled stories260K model, from the TinyStories sample in ../shared/data.

Each story (stories are separated by "<|endoftext|>") becomes one item:
  instruction = its opening sentences, cut at the first sentence end at or
                after 40% of the story's characters that is not inside a
                quotation;
  answer      = the rest of the story (its continuation).
Text is kept byte for byte (curly quotes, paragraph newlines); only the
whitespace around the cut and around the story is removed. Output is
deterministic: run it again and the file is identical.

Usage: python3 data/make_tinystories_eval.py [SAMPLE] [OUT]
"""
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = os.path.join(HERE, "..", "..", "shared", "data", "perplexity", "tinystories_sample.txt")
OUT = os.path.join(HERE, "tinystories_eval.jsonl")
FRACTION = 0.40

# a sentence ends after . ! or ? plus any closing quotes, before whitespace
SENTENCE_END = re.compile(r'[.!?]["\u201d\u2019\']*(?=\s)')


def inside_quote(prefix):
    """True if prefix ends inside a quotation (curly or straight quotes)."""
    depth = prefix.count("\u201c") - prefix.count("\u201d")
    return depth > 0 or prefix.count('"') % 2 == 1


def split_story(story):
    target = FRACTION * len(story)
    for m in SENTENCE_END.finditer(story):
        if m.end() >= target and not inside_quote(story[:m.end()]):
            return story[:m.end()].rstrip(), story[m.end():].strip()
    return None


def main():
    sample = sys.argv[1] if len(sys.argv) > 1 else SAMPLE
    out = sys.argv[2] if len(sys.argv) > 2 else OUT
    with open(sample, encoding="utf-8") as f:
        text = f.read()
    stories = [s.strip() for s in text.split("<|endoftext|>") if s.strip()]
    n = 0
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        for i, story in enumerate(stories, 1):
            cut = split_story(story)
            if cut is None or not cut[1]:
                continue
            item = {"id": "tinystories-sample-%d" % i, "instruction": cut[0], "answer": cut[1]}
            f.write(json.dumps(item, ensure_ascii=False) + "\n")
            n += 1
    print("%s: %d items from %d stories" % (out, n, len(stories)), file=sys.stderr)


if __name__ == "__main__":
    main()
