#!/usr/bin/env python3
"""make_longctx.py — long-context evaluation sets for ekv-ref-28m, cut from
held-out documents with token-exact boundaries under ekv's own tokenizer.

Input: a JSONL file of {"source": ..., "text": ...} documents that the model
never saw in training (../shared/data/longctx/heldout_dev.jsonl, or any other
held-out file of the same form). Output, in --out (default data/longctx/):

  cont_1k.jsonl, cont_2k.jsonl, cont_3.5k.jsonl   continuation: the first
      1024 / 2048 / 3584 tokens of a document are the prompt, its next 256
      tokens the answer (PPL, KL; ROUGE-L of greedy answers).
  recall.jsonl    recall: about 3,000 tokens of a document, then a 32-token
      cue copied from a line that starts between 5% and 30% of the context;
      the answer is the 64 tokens that followed the cue there, so predicting
      it means copying from ~2,000+ tokens back (PPL, KL).
  retrieval.jsonl retrieval (C sources only): three invented function names
      w1_w2_w3 (words from a fixed list, absent from the document), each
      called three times ("\\tname(arg);" lines) at line starts between 60%
      and 75% of a ~3,000-token context; the answer is one of the calls,
      "\\tw1_w2_w3(", after the context. Its tab and first two words are a
      cue, fed but not scored ("score_from": their token count), so that
      the cue and the third word are both read through the compressed
      cache. The names share no two-word prefix, so the cue names one
      function; guessing gives about 1/34 (scored as exact-match accuracy
      of the greedy third-word tokens: `ekv eval --metric acc`).

Token-exact: every prompt and answer is a byte range of the document (plus
the inserted lines for retrieval) whose tokenization by `ekv tokenize` is
checked: tokenize(prompt) followed by tokenize(answer) equals
tokenize(prompt + answer), and the prompt has the stated number of tokens
(continuation cuts move down by a token or two when a cut would split a
character or merge across the boundary). Items record n_prompt and
n_answer. Selection is deterministic (--seed); documents are sorted by
source first.

usage: data/longctx/make_longctx.py [--ekv build/ekv]
           [--model ../shared/models/ekv-ref-28m-f16.gguf]
           [--src ../shared/data/longctx/heldout_dev.jsonl] [--out data/longctx]
           [--seed 10] [--n-cont 16] [--n-recall 24] [--n-retrieval 48]
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys

WORDS = ("dev buf lock irq page node port link queue ring slot timer clk pwr reset init mode flag hash "
         "table entry count limit size base addr data cache inode file sock skb task work event state "
         "ctrl stat mask").split()
ARGS = ["dev", "priv", "ctx", "data"]


class Tok:
    """ekv tokenize through the command line, with a cache."""

    def __init__(self, ekv, model):
        self.ekv, self.model, self.cache = ekv, model, {}

    def __call__(self, data: bytes):
        if data in self.cache:
            return self.cache[data]
        r = subprocess.run([self.ekv, "tokenize", "-m", self.model, "-f", "-", "--json", "--no-bos"],
                           input=data, capture_output=True, check=True)
        j = json.loads(r.stdout)
        out = (j["ids"], j["offsets"])
        if len(self.cache) < 4096:
            self.cache[data] = out
        return out

    def ids(self, data: bytes):
        return self(data)[0]


def is_text(b: bytes):
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def clean_split(tok, prompt: bytes, answer: bytes):
    """True when the prompt and answer tokenize apart as they do together."""
    return is_text(prompt) and is_text(answer) and tok.ids(prompt) + tok.ids(answer) == tok.ids(prompt + answer)


def item(task, src, idx, prompt: bytes, answer: bytes, tok):
    return {"id": "%s-%03d" % (task, idx), "task": task, "source": src,
            "instruction": prompt.decode("utf-8"), "answer": answer.decode("utf-8"),
            "n_prompt": len(tok.ids(prompt)), "n_answer": len(tok.ids(answer))}


def continuation(docs, tok, P, A, n, rng, name):
    elig = [d for d in docs if len(d["ids"]) >= P + A]
    rng.shuffle(elig)
    out = []
    for d in elig:
        if len(out) >= n:
            break
        b, off, ids = d["bytes"], d["off"], d["ids"]
        for p in range(P, P - 16, -1):  # the cut moves down until it is clean
            prompt, answer = b[:off[p]], b[off[p]:off[p + A] if p + A < len(off) else len(b)]
            if tok.ids(prompt) == ids[:p] and tok.ids(answer) == ids[p:p + A] and clean_split(tok, prompt, answer):
                out.append(item(name, d["source"], len(out), prompt, answer, tok))
                break
    return out


def line_starts(b: bytes, lo: int, hi: int):
    return [i + 1 for i in range(max(lo - 1, 0), min(hi, len(b)) - 1) if b[i] == 0x0A]


def context_cut(d, P):
    """Byte offset of the last line end at or before token P."""
    b, off = d["bytes"], d["off"]
    return b.rfind(b"\n", 0, off[P]) + 1


def recall(docs, tok, P, n, rng, cue_len=32, ans_len=64):
    elig = [d for d in docs if len(d["ids"]) >= P + 8]
    rng.shuffle(elig)
    out = []
    for d in elig:
        if len(out) >= n:
            break
        b, off, ids = d["bytes"], d["off"], d["ids"]
        cut = context_cut(d, P)
        ctx = b[:cut]
        # token indices of line starts in [5%, 30%] of the context
        tok_at = {o: i for i, o in enumerate(off)}
        starts = [tok_at[s] for s in line_starts(b, off[int(P * 0.05)], off[int(P * 0.30)]) if s in tok_at]
        rng.shuffle(starts)
        for s in starts[:20]:
            if s + cue_len + ans_len >= len(off) or off[s + cue_len + ans_len] > cut:
                continue
            cue, ans = b[off[s]:off[s + cue_len]], b[off[s + cue_len]:off[s + cue_len + ans_len]]
            if ctx.count(cue + ans) != 1 or len(ans.strip()) < 20 or len(set(ans.split())) < 4:
                continue
            prompt = ctx + cue
            if not is_text(prompt) or not is_text(ans):
                continue
            if tok.ids(prompt) != tok.ids(ctx) + ids[s:s + cue_len] or tok.ids(ans) != ids[s + cue_len:s + cue_len + ans_len]:
                continue
            if not clean_split(tok, prompt, ans):
                continue
            it = item("recall", d["source"], len(out), prompt, ans, tok)
            it["distance"] = len(tok.ids(ctx)) - s  # tokens between the snippet and the cue
            out.append(it)
            break
    return out


def retrieval(docs, tok, P, n, rng, reps=3, n_names=3, lo_f=0.60, hi_f=0.75):
    elig = [d for d in docs if d["source"].endswith((".c", ".h")) and len(d["ids"]) >= P + 8]
    elig.sort(key=lambda d: d["source"])
    rng.shuffle(elig)
    out = []
    rounds = 0
    while len(out) < n and rounds < 4 and elig:  # more than one item per document only when needed
        for d in elig:
            if len(out) >= n:
                break
            b, off = d["bytes"], d["off"]
            cut = context_cut(d, P)
            names = []
            while len(names) < n_names:
                w = rng.sample(WORDS, 3)
                nm = "_".join(w)
                if nm.encode() in b or any(w[:2] == x.split("_")[:2] for x in names):
                    continue
                if ("_".join(w[:2]) + "_").encode() in b:  # the cue must name only our function
                    continue
                names.append(nm)
            starts = line_starts(b, off[int(P * lo_f)], off[int(P * hi_f)])
            if len(starts) < reps * n_names:
                continue
            at = sorted(rng.sample(starts, reps * n_names))
            lines = [("\t%s(%s);\n" % (nm, rng.choice(ARGS))).encode() for nm in names for _ in range(reps)]
            rng.shuffle(lines)
            ctx, last = b"", 0
            for p, ln in zip(at, lines):
                ctx += b[last:p] + ln
                last = p
            ctx += b[last:cut]
            target = names[0]
            w = target.split("_")
            # the cue "w1_w2_" opens the answer, so it is read through the
            # compressed cache like the third word it asks for; only the
            # third word is scored (score_from: the cue's tokens)
            prompt = ctx
            cue = ("\t%s_%s_" % (w[0], w[1])).encode()
            ans = cue + ("%s(" % w[2]).encode()
            if not is_text(prompt) or not clean_split(tok, prompt, ans) or not clean_split(tok, cue, ans[len(cue):]):
                continue
            it = item("retrieval", d["source"], len(out), prompt, ans, tok)
            it["target"] = target
            it["distractors"] = names[1:]
            it["score_from"] = len(tok.ids(cue))
            out.append(it)
        rounds += 1
    return out


def common_args(doc, seed):
    """The options every set maker takes: the ekv binary, the model whose
    tokenizer cuts the sets, the held-out documents, the output folder, the seed."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--ekv", default=os.path.join(root, "build", "ekv"))
    ap.add_argument("--model", default=os.path.join(root, "..", "shared", "models", "ekv-ref-28m-f16.gguf"))
    ap.add_argument("--src", default=os.path.join(root, "..", "shared", "data", "longctx", "heldout_dev.jsonl"))
    ap.add_argument("--out", default=here)
    ap.add_argument("--seed", type=int, default=seed)
    return ap


def write_set(out, name, items, who):
    """Writes one set as out/name.jsonl and says so on stderr."""
    path = os.path.join(out, name + ".jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps(it, ensure_ascii=False) + "\n")
    np = [it["n_prompt"] for it in items]
    print("%s: %-22s %3d items, prompts %d-%d tokens -> %s" %
          (who, name, len(items), min(np) if np else 0, max(np) if np else 0, path), file=sys.stderr)


def main():
    ap = common_args(__doc__, 10)
    ap.add_argument("--n-cont", type=int, default=16)
    ap.add_argument("--n-recall", type=int, default=24)
    ap.add_argument("--n-retrieval", type=int, default=48)
    a = ap.parse_args()
    tok = Tok(a.ekv, a.model)
    docs = []
    with open(a.src, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            d = json.loads(line)
            b = d["text"].encode("utf-8")
            ids, off = tok(b)
            docs.append({"source": d["source"], "bytes": b, "ids": ids, "off": off + [len(b)]})
    docs.sort(key=lambda d: d["source"])
    print("make_longctx: %d documents from %s" % (len(docs), a.src), file=sys.stderr)
    sets = {}
    for P, name in ((1024, "cont_1k"), (2048, "cont_2k"), (3584, "cont_3.5k")):
        sets[name] = continuation(docs, tok, P, 256, a.n_cont, random.Random(a.seed * 1000 + P), name)
    sets["recall"] = recall(docs, tok, 3000, a.n_recall, random.Random(a.seed * 1000 + 1))
    sets["retrieval"] = retrieval(docs, tok, 2920, a.n_retrieval, random.Random(a.seed * 1000 + 2))
    os.makedirs(a.out, exist_ok=True)
    for name, items in sets.items():
        write_set(a.out, name, items, "make_longctx")


if __name__ == "__main__":
    main()
