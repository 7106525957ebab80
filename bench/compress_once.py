#!/usr/bin/env python3
"""compress_once.py — "compress once, answer many" (issue 22; not a test).

A ~3.5K-token document from data/longctx/cont_3.5k.jsonl is read once and
its cache saved; 20 questions are then answered from it. Measured:

  1. bytes on disk of the saved cache by policy x storage type at one budget,
     against the full f16 cache's file (`ekv run --kv-save`);
  2. time to first token from the saved compressed cache (`ekv run --kv-load
     FILE -p QUESTION`: loading + reading the question) against reading the
     document and the question again (`ekv run -p DOCUMENT+QUESTION`), the
     ekv run's own time_to_first_token_seconds (model loading excluded);
  3. the server's prefix reuse (`ekv serve --prefix-cache`): time to first
     streamed byte of a miss (reads the document, then the question) against
     hits (only the question), measured by the client; then the prefix is
     saved with POST /slots/{id}?action=save, a fresh server restores it,
     and its 20 answers must equal the first server's (from memory) word for
     word, at temperature 0.

Prints a Markdown report (and --json FILE writes everything). Needs
python3 and a built ekv. Example (docs/server.md's numbers):

  python3 bench/compress_once.py -m models/ekv-ref-28m-q8_0.gguf -t 2
"""
import argparse
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def log(msg):
    print(f"compress_once: {msg}", file=sys.stderr, flush=True)


def run_json(ekv, args):
    p = subprocess.run([ekv, "run", "--json", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"ekv run {' '.join(args[:6])}...: {p.stderr.strip()[-400:]}")
    return json.loads(p.stdout)


def questions(doc, n):
    """n short questions about the document: its own lines as cues."""
    lines = [l.strip() for l in doc.splitlines() if 20 <= len(l.strip()) <= 80]
    step = max(1, len(lines) // n)
    qs = [f"\n\n/* Question {i + 1}: where does the line \"{lines[(i * step) % len(lines)]}\" come in? */\n"
          for i in range(n)]
    return qs


class Server:
    def __init__(self, ekv, flags):
        self.p = subprocess.Popen([ekv, "serve", "--port", "0", *flags], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
        line = self.p.stdout.readline()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if not m:
            self.p.kill()
            raise RuntimeError(f"ekv serve did not start: {line!r}")
        self.port = int(m.group(1))

    def post(self, path, body):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, json.loads(data)

    def get(self, path):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request("GET", path)
        r = c.getresponse()
        data = r.read()
        c.close()
        return json.loads(data)

    def stream(self, body):
        """(seconds to the first content byte, the whole text, cached_tokens)."""
        body = dict(body, stream=True, stream_options={"include_usage": True})
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        t0 = time.perf_counter()
        c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        first, text, cached = None, "", None
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            ev = json.loads(line[6:])
            for ch in ev.get("choices", []):
                piece = ch.get("delta", {}).get("content")
                if piece:
                    if first is None:
                        first = time.perf_counter() - t0
                    text += piece
            if ev.get("usage"):
                cached = ev["usage"].get("prompt_tokens_details", {}).get("cached_tokens")
        c.close()
        return first if first is not None else time.perf_counter() - t0, text, cached

    def stop(self):
        self.p.terminate()
        self.p.wait(timeout=60)


def bench_bytes(a, ekv, doc_file, tmp):
    rows = []
    full = os.path.join(tmp, "full.ekvc")
    run_json(ekv, ["-m", a.model, "-t", str(a.threads), "-f", doc_file, "-n", "0", "--kv-type", "f16",
                   "--kv-save", full])
    full_bytes = os.path.getsize(full)
    for pol in a.policies.split(","):
        for typ in a.types.split(","):
            f = os.path.join(tmp, "x.ekvc")
            r = run_json(ekv, ["-m", a.model, "-t", str(a.threads), "-f", doc_file, "-n", "0", "--kv-policy", pol,
                               "--kv-budget", str(a.budget), "--kv-type", typ, "--kv-save", f])
            size = os.path.getsize(f)
            rows.append({"policy": pol, "type": typ, "budget": a.budget, "file_bytes": size,
                         "cache_bytes": r["kv"]["bytes"], "of_full_f16_file": size / full_bytes})
            log(f"bytes: {pol} {typ}: {size} B on disk, {size / full_bytes:.4f} of the full f16 file")
    return full_bytes, rows


def bench_ttft(a, ekv, doc, doc_file, qs, tmp):
    saved = os.path.join(tmp, "doc.ekvc")
    kv = ["--kv-policy", a.ttft_policy, "--kv-budget", str(a.budget), "--kv-type", a.ttft_type]
    r = run_json(ekv, ["-m", a.model, "-t", str(a.threads), "-f", doc_file, "-n", "0", *kv, "--kv-save", saved])
    n_doc = r["prompt_tokens"]
    reread, load, same = [], [], 0
    for i, q in enumerate(qs):  # interleaved: one of each per question
        qf = os.path.join(tmp, "q.txt")
        with open(qf, "w") as f:
            f.write(doc + q)
        full = run_json(ekv, ["-m", a.model, "-t", str(a.threads), "-f", qf, "-n", str(a.n_gen), "--temp", "0",
                              *kv])
        with open(qf, "w") as f:
            f.write(q)
        fast = run_json(ekv, ["-m", a.model, "-t", str(a.threads), "-f", qf, "-n", str(a.n_gen), "--temp", "0",
                              "--kv-load", saved])
        reread.append(full["time_to_first_token_seconds"])
        load.append(fast["time_to_first_token_seconds"])
        log(f"ttft {i + 1}/{len(qs)}: re-read {reread[-1] * 1e3:.1f} ms, from the file {load[-1] * 1e3:.1f} ms")
    return {"doc_tokens": n_doc, "file_bytes": os.path.getsize(saved), "policy": a.ttft_policy,
            "type": a.ttft_type, "budget": a.budget, "reread_ms": [x * 1e3 for x in reread],
            "load_ms": [x * 1e3 for x in load],
            "median_reread_ms": statistics.median(reread) * 1e3, "median_load_ms": statistics.median(load) * 1e3}


def bench_server(a, ekv, doc, qs, tmp):
    slots = os.path.join(tmp, "slots")
    os.makedirs(slots, exist_ok=True)
    flags = ["-m", a.model, "-t", str(a.threads), "--prefix-cache", "256", "--slot-save-path", slots, "--temp", "0",
             "--kv-policy", a.ttft_policy, "--kv-budget", str(a.budget), "--kv-type", a.ttft_type]

    def body(q):
        return {"messages": [{"role": "system", "content": doc}, {"role": "user", "content": q}],
                "max_tokens": a.n_gen, "temperature": 0}

    s = Server(ekv, flags)
    try:
        ttft, texts, cached = [], [], []
        for i, q in enumerate(qs):
            t, txt, c = s.stream(body(q))
            ttft.append(t)
            texts.append(txt)
            cached.append(c)
            log(f"server {i + 1}/{len(qs)}: {t * 1e3:.1f} ms to the first byte, cached_tokens {c}")
        slot = s.get("/slots")[0]["id"]
        st, saved = s.post(f"/slots/{slot}?action=save", {"filename": "doc.ekvc"})
        if st != 200:
            raise RuntimeError(f"slot save: {saved}")
    finally:
        s.stop()
    s = Server(ekv, flags)
    try:
        st, rest = s.post("/slots/0?action=restore", {"filename": "doc.ekvc"})
        if st != 200:
            raise RuntimeError(f"slot restore: {rest}")
        texts2, ttft2 = [], []
        for q in qs:
            t, txt, c = s.stream(body(q))
            texts2.append(txt)
            ttft2.append(t)
    finally:
        s.stop()
    equal = sum(x == y for x, y in zip(texts, texts2))
    return {"miss_ms": ttft[0] * 1e3, "hit_ms": [x * 1e3 for x in ttft[1:]],
            "median_hit_ms": statistics.median(ttft[1:]) * 1e3, "cached_tokens": cached,
            "restore_ms": rest["timings"]["restore_ms"], "slot_file_bytes": saved["n_written"],
            "restored_median_ms": statistics.median(ttft2) * 1e3, "answers_equal": equal, "answers": len(qs)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=os.path.join(REPO, "models/ekv-ref-28m-q8_0.gguf"))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--data", default=os.path.join(REPO, "data/longctx/cont_3.5k.jsonl"))
    ap.add_argument("--item", type=int, default=0, help="which document of --data (default 0)")
    ap.add_argument("--questions", type=int, default=20)
    ap.add_argument("--n-gen", type=int, default=16, help="tokens per answer")
    ap.add_argument("--budget", type=float, default=0.2)
    ap.add_argument("--policies", default="full,snapkv,h2o,elastic-v2,local")
    ap.add_argument("--types", default="f16,q8_0,q4_0,kivi4,kivi2")
    ap.add_argument("--ttft-policy", default="snapkv")
    ap.add_argument("--ttft-type", default="kivi4")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: bytes,ttft,server")
    ap.add_argument("--json", help="also write the results as JSON to this file")
    ap.add_argument("--ekv", default=os.environ.get("EKV", os.path.join(REPO, "build/ekv")))
    a = ap.parse_args()
    with open(a.data) as f:
        items = [json.loads(l) for l in f if l.strip()]
    doc = items[a.item]["instruction"]
    qs = questions(doc, a.questions)
    tmp = tempfile.mkdtemp(prefix="compress_once.")
    try:
        doc_file = os.path.join(tmp, "doc.txt")
        with open(doc_file, "w") as f:
            f.write(doc)
        out = {"model": a.model, "document": items[a.item].get("source"), "threads": a.threads}
        skip = set(a.skip.split(","))
        if "bytes" not in skip:
            out["full_f16_file_bytes"], out["bytes"] = bench_bytes(a, a.ekv, doc_file, tmp)
        if "ttft" not in skip:
            out["ttft"] = bench_ttft(a, a.ekv, doc, doc_file, qs, tmp)
        if "server" not in skip:
            out["server"] = bench_server(a, a.ekv, doc, qs, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"# compress once, answer many: {os.path.basename(a.model)}, {a.threads} threads\n")
    if "bytes" in out:
        print(f"Saved cache of the document, bytes on disk (budget {a.budget}; full f16: "
              f"{out['full_f16_file_bytes']} B):\n")
        print("| policy | type | file bytes | of full f16 |\n|---|---|--:|--:|")
        for r in out["bytes"]:
            print(f"| {r['policy']} | {r['type']} | {r['file_bytes']} | {r['of_full_f16_file']:.4f} |")
    if "ttft" in out:
        t = out["ttft"]
        print(f"\nTime to first token, {t['doc_tokens']}-token document, {len(qs)} questions, {t['policy']} "
              f"{t['budget']} {t['type']} ({t['file_bytes']} B file): re-reading {t['median_reread_ms']:.1f} ms, "
              f"from the saved cache {t['median_load_ms']:.1f} ms (medians): "
              f"{t['median_reread_ms'] / t['median_load_ms']:.1f}x")
    if "server" in out:
        s = out["server"]
        print(f"\nServer prefix reuse: miss {s['miss_ms']:.1f} ms, hits {s['median_hit_ms']:.1f} ms (median of "
              f"{len(s['hit_ms'])}): {s['miss_ms'] / s['median_hit_ms']:.1f}x; slot file {s['slot_file_bytes']} B "
              f"restored in {s['restore_ms']:.1f} ms, then {s['restored_median_ms']:.1f} ms per question; answers "
              f"equal to the first server's: {s['answers_equal']}/{s['answers']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    ok = "server" not in out or out["server"]["answers_equal"] == out["server"]["answers"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
