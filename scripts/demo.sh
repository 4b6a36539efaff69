#!/bin/sh
# demo.sh: the planner on the paper's case study (PAPER.md section 7): LLaMA-7B on 1,024 GPUs
# (512 HDP ranks of TP 2, C = 8K tokens), 2M context, a 32M-token global batch of the Byted
# dataset. Compares the three policies, then prints the balanced plan's summary and writes it.
# Then training for real on this machine (docs/training.md): the Go standard library, byte-level,
# prepared into data/go-byte if it is not there yet; the tiny model trained for 100 steps of 16K
# tokens with contexts up to 4K (about 3 minutes on one core); metrics, checkpoints and the loss
# plot under out/demo/.
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

echo
echo "== training: the tiny model on the Go standard library (bytes), contexts up to 4K tokens"
DATA_DIR=data/go-byte
OUT=out/demo
if [ ! -f "$DATA_DIR/index.bin" ]; then
    "$BIN" prepare --out "$DATA_DIR"
fi
rm -rf "$OUT/ckpt"  # a fresh run: no checkpoints of an earlier demo left beside the new ones
mkdir -p "$OUT"
"$BIN" train --data "$DATA_DIR" --model tiny --context 4K --capacity 4K --tokens 16K --steps 100 \
    --lr 3e-3 --warmup 10 --ckpt-dir "$OUT/ckpt" --ckpt-every 50 --metrics "$OUT/metrics.jsonl" --plot "$OUT/loss"
echo
echo "== where everything went"
echo "  plan of the case study:   $BUILD/demo-plan.json"
echo "  dataset:                  $DATA_DIR"
echo "  metrics (one JSON/step):  $OUT/metrics.jsonl"
echo "  checkpoints:              $OUT/ckpt/  (continue with: $BIN train --resume $OUT/ckpt/ckpt-000100.bin --steps 150)"
echo "  loss plot:                $OUT/loss.png, $OUT/loss.svg"
