#!/bin/sh
# bench.sh: run every benchmark the build produced (bench_* executables), one after another, each
# printing its own tables. A failing benchmark is reported and the rest still run; the exit status
# says whether any failed.
#   usage: scripts/bench.sh [build-dir]      (make bench)
set -u
BUILD=${1:-build}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
found=0
failed=""
for b in "$BUILD"/bench_*; do
    [ -f "$b" ] && [ -x "$b" ] || continue
    found=1
    echo "==> $(basename "$b")"
    if ! "$b"; then
        failed="$failed $(basename "$b")"
    fi
    echo
done
# the Python ones that compare with other libraries: tokenizers (bench/tokenizer_speed.py, a quarter of the
# Go corpus; docs/tokenizers.md "Speed" has the whole one)
if [ -x .venv/bin/python ] && [ -f data/tiktoken/hf-o200k.json ]; then
    echo "==> bench/tokenizer_speed.py"
    BS_BINARY="$BUILD/bytescale" .venv/bin/python bench/tokenizer_speed.py --every 4 --reps 1 || failed="$failed bench/tokenizer_speed.py"
    echo
fi
# the engine's kernels and training step beside PyTorch's on one core (bench/torch_kernels.py,
# docs/kernels.md "Against PyTorch 2.13"; --quick: attention to 4K tokens, one round)
if [ -x .venv/bin/python ] && [ -x "$BUILD/bench_kernels" ]; then
    echo "==> bench/torch_kernels.py --quick"
    .venv/bin/python bench/torch_kernels.py --quick --bench "$BUILD/bench_kernels" || failed="$failed bench/torch_kernels.py"
    echo
fi
if [ "$found" = 0 ]; then
    echo "bench: no bench_* executables in $BUILD; build first (make)" >&2
    exit 1
fi
if [ -n "$failed" ]; then
    echo "bench: failed:$failed" >&2
    exit 1
fi
