"""Parquet corpora into a prepared dataset: pyarrow reads the files a row group at a time and streams
their text column, as JSONL, into `bytescale prepare --input -`, which tokenizes and writes the
dataset (docs/datasets.md, "Parquet"). The dataset is the one the same rows give as a JSONL file:
the same tokens, documents and shards; only its sources say <parquet file>:<row> (row from 1).

    from bytescale.parquet import prepare_parquet
    prepare_parquet(["train-00000.parquet"], "data/corpus-cl100k", tokenizer="cl100k")

    python -m bytescale.parquet train-00000.parquet --out data/corpus-cl100k --tokenizer cl100k

Memory stays flat: one record batch of the text column at a time, whatever the file's size. A null
or non-string value stops the run like a bad JSONL line ("<file>:<row>: field "text" is null, not a
string"), or is skipped and counted with skip_bad_lines.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
from typing import Iterable, List, Optional, Sequence, Union

PathLike = Union[str, os.PathLike]


def find_command() -> str:
    """The `bytescale` command: $BS_BINARY, else on the PATH, else build/bytescale of this checkout."""
    env = os.environ.get("BS_BINARY")
    if env:
        return env
    found = shutil.which("bytescale")
    if found:
        return found
    here = pathlib.Path(__file__).resolve().parents[2] / "build" / "bytescale"
    if here.exists():
        return str(here)
    raise FileNotFoundError("the bytescale command was not found: set BS_BINARY, put it on the PATH, or build it (make)")


def jsonl_lines(path: PathLike, column: str, batch_rows: int = 4096) -> Iterable[bytes]:
    """Each row of `column` as one JSONL line {column: value} (UTF-8 bytes, newline included). A null
    stays null, for prepare to refuse or skip; the column must exist."""
    import pyarrow.parquet as pq

    f = pq.ParquetFile(path)
    if column not in f.schema_arrow.names:
        raise ValueError(f"{path}: no column {column!r} (columns: {', '.join(f.schema_arrow.names)})")
    for batch in f.iter_batches(batch_size=batch_rows, columns=[column]):
        for value in batch.column(0).to_pylist():
            yield (json.dumps({column: value}, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass")


def prepare_parquet(paths: Sequence[PathLike], out: PathLike, tokenizer: str = "byte", text_field: str = "text",
                    bpe_ranks: Optional[PathLike] = None, threads: Optional[int] = None,
                    skip_bad_lines: bool = False, shard_size: Optional[str] = None,
                    command: Optional[str] = None) -> str:
    """Prepare the rows of `paths` (parquet files, in order) into the dataset `out`; returns what
    prepare printed. One prepare run for all the files: with several, rows are numbered across them
    and the sources say "<first file>+<n> more:<row>". Raises RuntimeError with prepare's message on
    failure (the dataset already in `out`, if any, is left as it was)."""
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ValueError("no parquet files given")
    name = paths[0] if len(paths) == 1 else f"{paths[0]}+{len(paths) - 1} more"
    args: List[str] = [command or find_command(), "prepare", "--input", "-", "--stdin-name", name,
                       "--out", os.fspath(out), "--tokenizer", tokenizer, "--text-field", text_field]
    if bpe_ranks:
        args += ["--bpe-ranks", os.fspath(bpe_ranks)]
    if threads:
        args += ["--threads", str(threads)]
    if shard_size:
        args += ["--shard-size", str(shard_size)]
    if skip_bad_lines:
        args.append("--skip-bad-lines")
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    import threading

    # prepare's output is read while rows are written, so neither side can fill a pipe and wait
    outs = {}
    readers = [threading.Thread(target=lambda k, s: outs.__setitem__(k, s.read()), args=(k, s))
               for k, s in (("out", proc.stdout), ("err", proc.stderr))]
    for r in readers:
        r.start()
    try:
        for p in paths:
            for line in jsonl_lines(p, text_field):
                proc.stdin.write(line)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # prepare stopped early (a bad row): its message says why
    proc.wait()
    for r in readers:
        r.join()
    if proc.returncode != 0:
        raise RuntimeError(outs["err"].decode(errors="replace").strip() or f"bytescale prepare exited {proc.returncode}")
    return outs["out"].decode()


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bytescale.parquet", description=__doc__.split("\n")[0])
    ap.add_argument("parquet", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", default="byte")
    ap.add_argument("--text-field", default="text")
    ap.add_argument("--bpe-ranks")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--shard-size")
    ap.add_argument("--skip-bad-lines", action="store_true")
    a = ap.parse_args(argv)
    try:
        print(prepare_parquet(a.parquet, a.out, a.tokenizer, a.text_field, a.bpe_ranks, a.threads, a.skip_bad_lines,
                              a.shard_size), end="")
    except (RuntimeError, ValueError, FileNotFoundError) as e:
        print(f"bytescale.parquet: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
