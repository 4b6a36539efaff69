"""go_jsonl.py: a JSONL corpus from the Go sources, one line per .go file: {"path": ..., "text": ...}
(the shape of RedPajama's and SlimPajama's shards), optionally the whole corpus several times over,
for prepare's JSONL route, its memory figure and the bench (docs/datasets.md).

    .venv/bin/python scripts/go_jsonl.py --out /tmp/go.jsonl [--repeat N] [--every K]
    zstd -q --rm /tmp/go.jsonl            # -> /tmp/go.jsonl.zst

Files are taken in path order (as prepare walks a directory); a file that is not UTF-8 is left out,
as tiktoken could not take it.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiktoken_vectors as tv  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--corpus", default="/usr/share/go-1.19/src")
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    docs = list(tv.go_documents(a.corpus, a.every))
    lines = [json.dumps({"path": p, "text": t}, ensure_ascii=False) + "\n" for p, t in docs]
    size = 0
    with open(a.out, "w", encoding="utf-8") as f:
        for _ in range(a.repeat):
            for line in lines:
                f.write(line)
                size += len(line.encode())
    print(f"go_jsonl.py: {len(docs)} files x {a.repeat} = {len(docs) * a.repeat} lines, {size / 1e6:.1f} MB -> {a.out}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
