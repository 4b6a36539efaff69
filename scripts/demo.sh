#!/bin/sh
# demo.sh: the planner on the paper's case study (docs/planner.md): LLaMA-7B on 1,024 GPUs
# (512 HDP ranks of TP 2, C = 8K tokens), 2M context, a 32M-token global batch of the Byted
# dataset. Compares every policy, then prints the balanced plan's summary and writes it.
# Then HDP training for real on this machine, on 2 MPI ranks (docs/runtime.md): the Go standard
# library, byte-level, prepared into data/go-byte if it is not there yet; the tiny model with
# contexts up to 16K tokens and a capacity of 8K per rank, so long files train as 2-rank rings with
# ring attention while short ones are packed; 60 steps of 32K tokens (about 3 minutes on 2 cores);
# metrics, checkpoints, the loss plot and a Perfetto trace under out/demo/. Last, a short measured
# comparison of the three policies on the same batches, at C = 8K and C = 16K (about 3 minutes).
#   usage: scripts/demo.sh [build-dir]      (make demo)
set -eu
BUILD=${1:-build}
BIN="$BUILD/bytescale"
if [ ! -x "$BIN" ]; then
    echo "demo: $BIN not found; build first (make)" >&2
    exit 1
fi
if ! command -v mpirun >/dev/null; then
    echo "demo: mpirun not found (apt-get install openmpi-bin, or make deps)" >&2
    exit 1
fi
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# one rank per core; a one-core machine still runs the demo, oversubscribed
MPIRUN="mpirun -np 2 --bind-to core"
if [ "$(nproc)" -lt 2 ]; then MPIRUN="mpirun -np 2 --oversubscribe"; fi

echo "== every policy on one global batch (estimated step compute time vs the lower bound)"
"$BIN" plan --policy all
echo
echo "== the balanced plan"
"$BIN" plan --policy balance --out "$BUILD/demo-plan.json"

echo
echo "== HDP training on 2 ranks: the tiny model on the Go standard library (bytes), contexts up to 16K,"
echo "   capacity 8K per rank: files longer than 8K train as 2-rank rings, shorter ones are packed"
DATA_DIR=data/go-byte
OUT=out/demo
if [ ! -f "$DATA_DIR/index.bin" ]; then
    "$BIN" prepare --out "$DATA_DIR"
fi
rm -rf "$OUT/ckpt"  # a fresh run: no checkpoints of an earlier demo left beside the new ones
mkdir -p "$OUT"
# flags common to both runs below; each run adds its own (a flag may be given only once)
TRAIN="$BIN train --data $DATA_DIR --model tiny --context 16K --lr 3e-3 --warmup 10"
$MPIRUN $TRAIN --capacity 8K --tokens 32K --steps 60 --ckpt-dir "$OUT/ckpt" --ckpt-every 30 --metrics "$OUT/metrics.jsonl" \
    --plot "$OUT/loss" --trace "$OUT/trace.json"

echo
echo "== the three policies measured on this machine: the same 5 batches of 64K tokens each, 2 ranks"
echo "   C = 8K: the static mesh is one 2-rank ring (d_cp 2, d_dp 1), balanced by construction;"
echo "   C = 16K: the static mesh is 2-way data parallel, and its packs leave ranks unequal work"
printf '%-9s %-8s %10s %10s %15s\n' capacity policy "tokens/s" "vs static" "rings per step"
for cap in 8K 16K; do
    base=""
    for policy in static naive balance; do
        m="$OUT/policy-$policy-$cap.jsonl"
        BS_QUIET=1 $MPIRUN $TRAIN --tokens 64K --capacity "$cap" --policy "$policy" --steps 5 --metrics "$m" >/dev/null
        # steps 2..5 (the first includes start-up): the batch's tokens over the step's seconds
        line=$(awk '
            { match($0, /"tokens":[0-9]+/); t = substr($0, RSTART + 9, RLENGTH - 9)
              match($0, /"seconds":[0-9.e+-]+/); s = substr($0, RSTART + 10, RLENGTH - 10)
              match($0, /"plan_rings":[0-9]+/); r = substr($0, RSTART + 13, RLENGTH - 13)
              if (NR > 1) { tok += t; sec += s; rings += r; n++ } }
            END { if (sec > 0) printf "%.0f %.1f", tok / sec, rings / n }' "$m")
        tps=${line% *}
        rings=${line#* }
        if [ -z "$base" ]; then base=$tps; fi
        printf '%-9s %-8s %10s %9sx %15s\n' "$cap" "$policy" "$tps" \
            "$(awk -v a="$tps" -v b="$base" 'BEGIN { printf "%.2f", a / b }')" "$rings"
    done
done
echo
echo "== where everything went"
echo "  plan of the case study:   $BUILD/demo-plan.json"
echo "  dataset:                  $DATA_DIR"
echo "  metrics (one JSON/step):  $OUT/metrics.jsonl  (every rank's compute / comm / wait seconds)"
echo "  checkpoints:              $OUT/ckpt/  (continue on any number of ranks: $MPIRUN $BIN train --resume $OUT/ckpt/ckpt-000060.bin --steps 90)"
echo "  loss plot:                $OUT/loss.png, $OUT/loss.svg"
echo "  trace (Perfetto):         $OUT/trace.json  (ui.perfetto.dev or chrome://tracing, one track per rank)"
echo "  per-policy metrics:       $OUT/policy-<policy>-<capacity>.jsonl"
