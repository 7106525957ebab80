#!/usr/bin/env python3
"""make_ruler.py — query-aware long-context sets for ekv-ref-28m: the question
comes after the context (so a policy that scores the prompt by its last
queries, SnapKV, sees it), cut from held-out documents with token-exact
boundaries under ekv's own tokenizer (the Tok class and checks of
make_longctx.py).

Output, in --out (default data/longctx/):

  retrieval_q.jsonl  retrieval with the question at the end (C sources only):
      three invented functions w1_w2_w3 (words from make_longctx's list,
      absent from the document), each called three times ("\\tname(arg);"
      lines) at line starts within +-5 % of the item's depth (10, 30, 50,
      70 or 90 % of a ~3,000-token context, cycled, so every depth has the
      same number of items); the prompt ends with a question line naming the
      cue, "/* call: w1_w2 */"; the answer is "\\tw1_w2_w3(": its cue
      "\\tw1_w2_" is fed but not scored ("score_from"), the third word and
      "(" are scored. Guessing among the 34 words: about 1/34.
  ruler_niah_single.jsonl   RULER single needle: one line "// key w1_w2 = N"
      (N: 4 digits) at the item's depth (10-90 %, cycled) in a document (C
      or text); the prompt ends with "// what is key w1_w2?"; answer "// key
      w1_w2 = N\\n", cue "// key w1_w2 =" fed, " N\\n" scored (chance ~0).
  ruler_niah_multikey.jsonl RULER multi-key: four such lines with different
      keys and numbers (the asked one at the item's depth, the others at
      random in 10-90 %), one asked.

Made only on request (--sets), not shipped: the full cache answers none of
their pilot items (README.md):

  ruler_niah_multivalue.jsonl  one key with two numbers at two depths; the
      answer gives both in the order they occur: "// key w1_w2 = N1, N2\\n".
  ruler_vt.jsonl     variable tracking: a chain "int a = N;" ... "int b =
      a;" ... "int c = b;" (identifiers w1_w2) and a distractor chain with
      another number, spread through the document; the prompt ends with
      "/* trace c */"; the answer walks the chain back to its value: "// c =
      b = a = N;" (cue "// c =" fed; the names and the number scored).
  ruler_cwe.jsonl    common-word extraction: a C array of ~450 quoted
      identifiers taken from a held-out C file, one occurring 40 times,
      three 10 times, the rest once or twice, in random order; the prompt
      ends with "/* the most frequent word in words[] */"; answer "static
      const char *most_frequent = \\"w\\";\\n" (cue up to the quote fed).

Every item records depth (fraction of the context where its asked needle
starts, where that applies), score_from, and the make_longctx fields.
Deterministic (--seed); documents sorted by source first; rerunning gives
byte-identical files; smaller counts give a prefix of the same sets.

usage: data/longctx/make_ruler.py [--ekv build/ekv]
           [--model ../shared/models/ekv-ref-28m-f16.gguf]
           [--src ../shared/data/longctx/heldout_dev.jsonl] [--out data/longctx]
           [--seed 21] [--n-retrieval-q 45] [--n-ruler 32] [--sets a,b,...]
"""
import json
import os
import random
import re
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_longctx import WORDS, ARGS, Tok, common_args, write_set, is_text, clean_split, item, line_starts, context_cut  # noqa: E402

DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
P_CTX = 2920  # haystack tokens before insertions (prompts end up at ~3,000)


def load_docs(tok, src, min_bytes=8000):
    docs = []
    with open(src, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            d = json.loads(line)
            b = d["text"].encode("utf-8")
            if len(b) < min_bytes:  # cannot hold a ~3,000-token context
                continue
            ids, off = tok(b)
            docs.append({"source": d["source"], "bytes": b, "ids": ids, "off": off + [len(b)]})
    docs.sort(key=lambda d: d["source"])
    return docs


def is_c(d):
    return d["source"].endswith((".c", ".h"))


def new_name(rng, b, taken, n=2):
    """w1_w2 (n words) absent from the document and sharing no prefix with taken names."""
    while True:
        nm = "_".join(rng.sample(WORDS, n))
        if nm.encode() in b or any(nm.startswith(t) or t.startswith(nm) for t in taken):
            continue
        return nm


def insert_lines(b, cut, at_lines):
    """b[:cut] with lines inserted before the given byte offsets (line starts)."""
    ctx, last = b"", 0
    for p, ln in sorted(at_lines, key=lambda x: x[0]):
        ctx += b[last:p] + ln
        last = p
    return ctx + b[last:cut]


def starts_near(d, P, f, half=0.05):
    off = d["off"]
    return line_starts(d["bytes"], off[int(P * max(f - half, 0.02))], off[int(P * min(f + half, 0.98))])


def finish(task, d, idx, prompt, cue, scored, tok, **extra):
    """The item when prompt | cue+scored and cue | scored are clean token splits, else None."""
    ans = cue + scored
    if not is_text(prompt) or not clean_split(tok, prompt, ans) or not clean_split(tok, cue, scored):
        return None
    it = item(task, d["source"], idx, prompt, ans, tok)
    it.update(extra)
    it["score_from"] = len(tok.ids(cue))
    return it


def doc_cycle(elig, n, rounds=4):
    """Documents in order, reused in later rounds only when there are fewer than needed."""
    for r in range(rounds):
        for d in elig:
            yield r, d


def retrieval_q(docs, tok, n, rng, reps=3, n_names=3):
    elig = [d for d in docs if is_c(d) and len(d["ids"]) >= P_CTX + 8]
    rng.shuffle(elig)
    out = []
    for r, d in doc_cycle(elig, n):
        if len(out) >= n:
            break
        depth = DEPTHS[len(out) % len(DEPTHS)]
        b = d["bytes"]
        cut = context_cut(d, P_CTX)
        names = []
        while len(names) < n_names:
            w = rng.sample(WORDS, 3)
            nm = "_".join(w)
            if nm.encode() in b or any(w[:2] == x.split("_")[:2] for x in names):
                continue
            if ("_".join(w[:2]) + "_").encode() in b:  # the cue names only our function
                continue
            names.append(nm)
        starts = starts_near(d, P_CTX, depth)
        if len(starts) < reps * n_names:
            continue
        at = sorted(rng.sample(starts, reps * n_names))
        lines = [("\t%s(%s);\n" % (nm, rng.choice(ARGS))).encode() for nm in names for _ in range(reps)]
        rng.shuffle(lines)
        ctx = insert_lines(b, cut, list(zip(at, lines)))
        w = names[0].split("_")
        prompt = ctx + ("/* call: %s_%s */\n" % (w[0], w[1])).encode()
        cue, scored = ("\t%s_%s_" % (w[0], w[1])).encode(), ("%s(" % w[2]).encode()
        it = finish("retrieval_q", d, len(out), prompt, cue, scored, tok,
                    depth=depth, target=names[0], distractors=names[1:], reuse=r)
        if it:
            out.append(it)
    return out


def number(rng, taken=()):
    while True:
        v = str(rng.randrange(1000, 10000))
        if v not in taken:
            return v


# needle line, question line, cue (the answer's fed part); value kind. Pilot
# (10 single-needle items, full cache): key 2/10, word 2/10, define 0/10,
# defword 0/10; "key" is used.
NIAH_FMT = {
    "key": ("// key %s = %s\n", "// what is key %s?\n", "// key %s =", "num"),
    "define": ("#define %s %s\n", "/* %s? */\n", "#define %s", "num"),
    "word": ("// key %s = %s\n", "// what is key %s?\n", "// key %s =", "word"),
    "defword": ("#define %s %s\n", "/* %s? */\n", "#define %s", "word"),
}


def niah(docs, tok, n, rng, task, n_keys=1, n_values=1, fmt="key"):
    elig = [d for d in docs if len(d["ids"]) >= P_CTX + 8]
    rng.shuffle(elig)
    out = []
    for r, d in doc_cycle(elig, n):
        if len(out) >= n:
            break
        b = d["bytes"]
        cut = context_cut(d, P_CTX)
        keys = []
        for _ in range(n_keys):
            keys.append(new_name(rng, b, keys))
        nfmt, qfmt, cfmt, kind = NIAH_FMT[fmt]
        vals = []
        for _ in range(n_keys * n_values):
            vals.append(number(rng, vals) if kind == "num" else new_name(rng, b, keys + vals))
        depth = DEPTHS[len(out) % len(DEPTHS)]
        # the asked needle at the item's depth, the others anywhere in 10-90 %
        needles = []  # (depth, key, value)
        for k in range(n_keys):
            for v in range(n_values):
                f = depth if (k == 0 and v == 0) else rng.uniform(0.1, 0.9)
                needles.append((f, keys[k], vals[k * n_values + v]))
        at, used, ok = [], set(), True
        for f, key, val in needles:
            s = [p for p in starts_near(d, P_CTX, f, 0.02) if p not in used]
            if not s:
                ok = False
                break
            p = rng.choice(s)
            used.add(p)
            at.append((p, (nfmt % (key, val)).encode()))
        if not ok:
            continue
        if n_values > 1:  # the asked needle's values, in the order they occur
            order = sorted(range(n_values), key=lambda v: at[v][0])
            asked = ", ".join(vals[v] for v in order)
            depth = min(needles[v][0] for v in range(n_values))
        else:
            asked = vals[0]
        ctx = insert_lines(b, cut, at)
        prompt = ctx + (qfmt % keys[0]).encode()
        cue, scored = (cfmt % keys[0]).encode(), (" %s\n" % asked).encode()
        it = finish(task, d, len(out), prompt, cue, scored, tok, depth=round(depth, 3),
                    key=keys[0], value=asked, distractors=keys[1:], reuse=r)
        if it:
            out.append(it)
    return out


def vt(docs, tok, n, rng, hops=2):
    elig = [d for d in docs if len(d["ids"]) >= P_CTX + 8]
    rng.shuffle(elig)
    out = []
    for r, d in doc_cycle(elig, n):
        if len(out) >= n:
            break
        b = d["bytes"]
        cut = context_cut(d, P_CTX)
        taken = []
        chains = []
        for c in range(2):  # the asked chain and a distractor chain
            names = []
            for _ in range(hops + 1):
                nm = new_name(rng, b, taken)
                taken.append(nm)
                names.append(nm)
            chains.append(names)
        vals = [number(rng)]
        vals.append(number(rng, vals))
        # each chain's lines in order, at increasing depths spread over 10-90 %
        at, used, ok = [], set(), True
        first_depth = None
        for c, names in enumerate(chains):
            fs = sorted(rng.uniform(0.1, 0.9) for _ in names)
            for i, (f, nm) in enumerate(zip(fs, names)):
                rhs = vals[c] if i == 0 else names[i - 1]
                s = [p for p in starts_near(d, P_CTX, f, 0.02) if p not in used]
                if not s:
                    ok = False
                    break
                p = rng.choice(s)
                used.add(p)
                at.append((p, ("\tint %s = %s;\n" % (nm, rhs)).encode()))
                if c == 0 and i == 0:
                    first_depth = f
            if not ok:
                break
        if not ok:
            continue
        names = chains[0]
        ctx = insert_lines(b, cut, at)
        prompt = ctx + ("/* trace %s */\n" % names[-1]).encode()
        cue = ("// %s =" % names[-1]).encode()
        scored = ("".join(" %s =" % nm for nm in reversed(names[:-1])) + " %s;\n" % vals[0]).encode()
        it = finish("ruler_vt", d, len(out), prompt, cue, scored, tok, depth=round(first_depth, 3),
                    chain=names, value=vals[0], distractor_chain=chains[1], reuse=r)
        if it:
            out.append(it)
    return out


def cwe(docs, tok, n, rng, top=40, freq=10, n_freq=3, target_tokens=3000):
    elig = [d for d in docs if is_c(d)]
    rng.shuffle(elig)
    out = []
    for d in elig:
        if len(out) >= n:
            break
        idents = sorted(set(re.findall(rb"\b[a-z][a-z0-9_]{3,15}\b", d["bytes"])))
        if len(idents) < 320:
            continue
        rng.shuffle(idents)
        common = idents[:1 + n_freq]
        rest = idents[1 + n_freq:]
        lst = [common[0]] * top + [w for w in common[1:] for _ in range(freq)]
        # fill with words once or twice until the prompt is about target_tokens
        per = 4.5  # tokens per entry, refined below
        k = 0
        while True:
            m = int((target_tokens - 40) / per) - len(lst)
            fill = []
            for i, w in enumerate(rest[:max(m, 0)]):
                fill += [w] * (1 + (i % 2))
            entries = lst + fill
            rr = random.Random(rng.random())
            rr.shuffle(entries)
            body = b"static const char *words[] = {\n" + b"".join(b'\t"' + w + b'",\n' for w in entries) + b"};\n"
            prompt = body + b"/* the most frequent word in words[] */\n"
            nt = len(tok.ids(prompt))
            k += 1
            if abs(nt - target_tokens) <= 60 or k >= 4:
                break
            per *= nt / target_tokens
        if len(fill) == 0 or max(fill.count(w) for w in fill) >= freq:
            continue
        cue, scored = b'static const char *most_frequent = "', common[0] + b'";\n'
        it = finish("ruler_cwe", d, len(out), prompt, cue, scored, tok, word=common[0].decode(),
                    frequent=[w.decode() for w in common[1:]], n_entries=len(entries),
                    n_distinct=len(set(entries)))
        if it:
            out.append(it)
    return out


def main():
    ap = common_args(__doc__, 21)
    ap.add_argument("--n-retrieval-q", type=int, default=45)
    ap.add_argument("--n-ruler", type=int, default=32)
    # ruler_niah_multivalue, ruler_vt and ruler_cwe are made only on request:
    # the full cache answers none of them (README), so they are not shipped
    ap.add_argument("--sets", default="retrieval_q,ruler_niah_single,ruler_niah_multikey")
    a = ap.parse_args()
    tok = Tok(a.ekv, a.model)
    docs = load_docs(tok, a.src)
    print("make_ruler: %d documents of 8,000+ bytes from %s" % (len(docs), a.src), file=sys.stderr)
    want = a.sets.split(",")
    S = a.seed * 1000
    makers = {
        "retrieval_q": lambda: retrieval_q(docs, tok, a.n_retrieval_q, random.Random(S + 1)),
        "ruler_niah_single": lambda: niah(docs, tok, a.n_ruler, random.Random(S + 2), "ruler_niah_single"),
        "ruler_niah_multikey": lambda: niah(docs, tok, a.n_ruler, random.Random(S + 3), "ruler_niah_multikey", n_keys=4),
        "ruler_niah_multivalue": lambda: niah(docs, tok, a.n_ruler, random.Random(S + 4), "ruler_niah_multivalue",
                                              n_values=2),
        "ruler_vt": lambda: vt(docs, tok, a.n_ruler, random.Random(S + 5)),
        "ruler_cwe": lambda: cwe(docs, tok, a.n_ruler, random.Random(S + 6)),
    }
    os.makedirs(a.out, exist_ok=True)
    for name in want:
        write_set(a.out, name, makers[name](), "make_ruler")


if __name__ == "__main__":
    main()
