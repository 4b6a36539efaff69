#!/bin/sh
# demo.sh: the planner on the paper's case study (PAPER.md section 7): LLaMA-7B on 1,024 GPUs
# (512 HDP ranks of TP 2, C = 8K tokens), 2M context, a 32M-token global batch of the Byted
# dataset. Compares the three policies, then prints the balanced plan's summary and writes it.
#   usage: scripts/demo.sh [build-dir]      (make demo)
set -eu
BUILD=${1:-build}
BIN="$BUILD/bytescale"
if [ ! -x "$BIN" ]; then
    echo "demo: $BIN not found; build first (make)" >&2
    exit 1
fi
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}

echo "== the three policies on one global batch (estimated step compute time vs the lower bound)"
"$BIN" plan --policy all
echo
echo "== the balanced plan"
"$BIN" plan --policy balance --out "$BUILD/demo-plan.json"
