#!/usr/bin/env python3
"""Builds data/tinystories_eval.jsonl, ekv's in-domain evaluation set for the
bundled stories260K model, from the TinyStories sample in ../shared/data.

Each story (stories are separated by "<|endoftext|>") gives one item per
split fraction f in FRACTIONS (30%, 40%, 50%, 60%):
  instruction = its opening sentences, cut at the first sentence end at or
                after f of the story's characters that is not inside a
                quotation;
  answer      = the rest of the story (its continuation).
Two fractions landing on the same cut give one item (the first fraction's).

Items the model itself reproduces are dropped: the script runs the bundled
stories260K greedily (`ekv run --temp 0`) on each instruction and drops an
item when the first 20 words of the model's continuation equal the first 20
words of its answer (whitespace-separated, compared verbatim). The verdicts
go to stderr (data/README.md records them).
Text is kept byte for byte (curly quotes, paragraph newlines); only the
whitespace around the cut and around the story is removed. Output is
deterministic: run it again and the file is identical.

Usage: python3 data/make_tinystories_eval.py [--ekv BUILD/ekv] [--model GGUF] [SAMPLE] [OUT]
(defaults: build/ekv and models/stories260K.gguf of this repository)
"""
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = os.path.join(HERE, "..", "..", "shared", "data", "perplexity", "tinystories_sample.txt")
OUT = os.path.join(HERE, "tinystories_eval.jsonl")
FRACTIONS = (0.30, 0.40, 0.50, 0.60)
CHECK_WORDS = 20
EKV = os.path.join(HERE, "..", "build", "ekv")
MODEL = os.path.join(HERE, "..", "models", "stories260K.gguf")

# a sentence ends after . ! or ? plus any closing quotes, before whitespace
SENTENCE_END = re.compile(r'[.!?]["\u201d\u2019\']*(?=\s)')


def inside_quote(prefix):
    """True if prefix ends inside a quotation (curly or straight quotes)."""
    depth = prefix.count("\u201c") - prefix.count("\u201d")
    return depth > 0 or prefix.count('"') % 2 == 1


def split_story(story, fraction):
    target = fraction * len(story)
    for m in SENTENCE_END.finditer(story):
        if m.end() >= target and not inside_quote(story[:m.end()]):
            return story[:m.end()].rstrip(), story[m.end():].strip()
    return None


def greedy(ekv, model, prompt):
    """The model's greedy continuation of prompt (ekv run --temp 0 --json)."""
    out = subprocess.run([ekv, "run", "-m", model, "--temp", "0", "-n", "128", "-t", "1", "--json",
                          "-p", prompt], check=True, capture_output=True, text=True).stdout
    return json.loads(out)["text"]


def main():
    args = sys.argv[1:]
    ekv, model = EKV, MODEL
    while args and args[0] in ("--ekv", "--model"):
        if args[0] == "--ekv":
            ekv = args[1]
        else:
            model = args[1]
        args = args[2:]
    sample = args[0] if len(args) > 0 else SAMPLE
    out = args[1] if len(args) > 1 else OUT
    with open(sample, encoding="utf-8") as f:
        text = f.read()
    stories = [s.strip() for s in text.split("<|endoftext|>") if s.strip()]
    items, dropped = [], []
    for i, story in enumerate(stories, 1):
        seen = set()
        for fraction in FRACTIONS:
            cut = split_story(story, fraction)
            if cut is None or not cut[1] or cut[0] in seen:
                continue
            seen.add(cut[0])
            item = {"id": "tinystories-sample-%d-%d" % (i, round(fraction * 100)),
                    "instruction": cut[0], "answer": cut[1]}
            want = cut[1].split()[:CHECK_WORDS]
            got = greedy(ekv, model, cut[0]).split()[:CHECK_WORDS]
            same = 0
            while same < min(len(want), len(got)) and want[same] == got[same]:
                same += 1
            verbatim = same >= CHECK_WORDS
            print("%-26s cut at %4.1f%%: %2d of the first %d answer words reproduced verbatim%s"
                  % (item["id"], 100.0 * len(cut[0]) / len(story), same, CHECK_WORDS,
                     " -> dropped" if verbatim else ""), file=sys.stderr)
            (dropped if verbatim else items).append(item)
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        for item in items:
            f.write(json.dumps(item, ensure_ascii=False) + "\n")
    print("%s: %d items from %d stories, %d dropped as reproduced by the model"
          % (out, len(items), len(stories), len(dropped)), file=sys.stderr)


if __name__ == "__main__":
    main()
