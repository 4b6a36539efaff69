"""bench/tokenizer_speed.py: tokens per second of `bytescale prepare` against tiktoken's and the Hugging Face
tokenizers library's batch encoders, on the same CPU, the same input and in one run, with 1 and 2
cores (docs/tokenizers.md, "Speed").

    .venv/bin/python bench/tokenizer_speed.py [--corpus /usr/share/go-1.19/src] [--every 1] [--cores 1,2]
        [--reps 3] [--hf-reps 1] [--families gpt2,cl100k,o200k,qwen2] [--bytescale build/bytescale]

The input: the corpus's .go files (every EVERY-th, in path order), one document each. bytescale
reads them as one JSONL file (its JSON parsing and its dataset writing, fsync included, are in its
time); tiktoken gets the same texts as a list for encode_ordinary_batch(num_threads=N); the HF
library gets them for encode_batch(add_special_tokens=False) with RAYON_NUM_THREADS=N, each library
in a fresh process. Every contender runs pinned to the first N cores (sched_setaffinity), and the
best of --reps runs counts (other jobs on a shared machine only ever slow a run down; the HF library,
the slowest by far, runs --hf-reps times). Tokens/s is
each encoder's own count over its wall time: the encodings are equal (tests/data/test_tokenizer.c),
save bytescale's end-of-document token per document, which it counts.

Families, each with its tokenizer.json from scripts/hf_tokenizers.py (make tokenizer):
    gpt2    tiktoken r50k_base, HF hf-gpt2.json, bytescale gpt2 and hf:hf-gpt2.json
    cl100k  tiktoken cl100k_base, HF hf-llama3.json (cl100k's ranks, LLaMA-3's regex), bytescale
            cl100k and hf:hf-llama3.json
    o200k   tiktoken o200k_base, HF hf-o200k.json, bytescale o200k and hf:hf-o200k.json
    qwen2   HF hf-qwen2.json (Qwen2's shape: NFC, added tokens matched in text) and bytescale
            hf:hf-qwen2.json; no tiktoken encoding gives its ids, so "vs tiktoken" is blank

(Not named tokenize.py: a script run from bench/ has bench/ first on sys.path, and that name hid the
standard library's tokenize from the other scripts there, bench/torch_failures.py among them.)
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "tiktoken"
sys.path.insert(0, str(ROOT / "scripts"))

FAMILIES = {"gpt2": ("r50k_base", "hf-gpt2.json"), "cl100k": ("cl100k_base", "hf-llama3.json"),
            "o200k": ("o200k_base", "hf-o200k.json"), "qwen2": (None, "hf-qwen2.json")}

# run in a fresh process: encode the texts of a JSONL file, print "<tokens> <seconds>"
LIBRARY_RUN = r"""
import json, os, sys, time
kind, arg, path, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
os.sched_setaffinity(0, set(range(n)))
texts = [json.loads(l)["text"] for l in open(path, encoding="utf-8")]
if kind == "tiktoken":
    sys.path.insert(0, sys.argv[5])
    import tempfile, tiktoken_vectors as tv
    enc = tv.reference_encoding(arg, os.path.dirname(sys.argv[6]), tempfile.mkdtemp())
    t0 = time.perf_counter()
    out = enc.encode_ordinary_batch(texts, num_threads=n)
else:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(arg)
    tok.encode_special_tokens = True
    t0 = time.perf_counter()
    out = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
dt = time.perf_counter() - t0
print(sum(len(x) for x in out), dt)
"""


def corpus_jsonl(corpus, every, path):
    import tiktoken_vectors as tv

    n = size = 0
    with open(path, "w", encoding="utf-8") as f:
        for _, text in tv.go_documents(corpus, every):
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
            n += 1
            size += len(text.encode())
    return n, size


def library(kind, arg, path, cores):
    env = dict(os.environ, RAYON_NUM_THREADS=str(cores), TOKENIZERS_PARALLELISM="true")
    cmd = [sys.executable, "-c", LIBRARY_RUN, kind, str(arg), str(path), str(cores), str(ROOT / "scripts"),
           str(DATA / "x")]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    tokens, seconds = r.stdout.split()
    return int(tokens), float(seconds)


def bytescale(binary, tokenizer, path, cores, out):
    args = [binary, "prepare", "--input", str(path), "--tokenizer", tokenizer, "--out", out, "--threads", str(cores)]
    t0 = time.perf_counter()
    r = subprocess.run(args, capture_output=True, text=True, env=dict(os.environ, BS_QUIET="1"),
                       preexec_fn=lambda: os.sched_setaffinity(0, set(range(cores))), check=True)
    dt = time.perf_counter() - t0
    tokens = int(r.stdout.split(" documents, ")[1].split(" tokens")[0])
    return tokens, dt


def best(fn, reps):
    runs = [fn() for _ in range(reps)]
    return min(runs, key=lambda x: x[1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default="/usr/share/go-1.19/src")
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--cores", default="1,2")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--hf-reps", type=int, default=1)
    ap.add_argument("--families", default="gpt2,cl100k,o200k,qwen2")
    ap.add_argument("--bytescale", default=os.environ.get("BS_BINARY", str(ROOT / "build" / "bytescale")))
    a = ap.parse_args()
    cores = [int(c) for c in a.cores.split(",")]
    if max(cores) > len(os.sched_getaffinity(0)):
        sys.exit(f"tokenizer_speed.py: {max(cores)} cores asked, {len(os.sched_getaffinity(0))} available")
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "corpus.jsonl"
        n_docs, size = corpus_jsonl(a.corpus, a.every, path)
        cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
        print(f"input: {n_docs} .go files of {a.corpus} (every {a.every}), {size / 1e6:.1f} MB; CPU: {cpu}; "
              f"best of {a.reps} (HF: {a.hf_reps})")
        print(f"| family | encoder | cores | tokens | seconds | tokens/s | vs tiktoken | vs HF |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for fam in a.families.split(","):
            enc, hf_json = FAMILIES[fam]
            for c in cores:
                rows = [("HF tokenizers " + hf_json, best(lambda: library("hf", DATA / hf_json, path, c), a.hf_reps)),
                        ("bytescale hf:" + hf_json,
                         best(lambda: bytescale(a.bytescale, f"hf:{DATA / hf_json}", path, c, f"{tmp}/o"), a.reps))]
                if enc:
                    rows[:0] = [("tiktoken " + enc, best(lambda: library("tiktoken", enc, path, c), a.reps))]
                    rows[2:2] = [("bytescale " + fam, best(lambda: bytescale(a.bytescale, fam, path, c, f"{tmp}/o"),
                                                           a.reps))]
                rate = {name: tok / sec for name, (tok, sec) in rows}
                tk = rows[0][0] if enc else None
                hf = "HF tokenizers " + hf_json
                for name, (tok, sec) in rows:
                    vs_tk = f"{rate[name] / rate[tk]:.2f}x" if tk else ""
                    print(f"| {fam} | {name} | {c} | {tok:,} | {sec:.2f} | {rate[name] / 1e6:.2f}M | "
                          f"{vs_tk} | {rate[name] / rate[hf]:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
