#!/usr/bin/env bash
# all_in_one.sh: every feature of the engine in one job, with the figures that show it works.
#
#   mpirun -np 9 bytescale train --tp 2 --pp 2 --servers 1 --offload-tier file --mem-budget B
#                                --policy elastic
#
# is 2 HDP ranks, each a pipeline of 2 stages of 2 tensor-parallel processes, and 1 data server. The
# `base` model (8 layers: 4 per stage, so each stage has layers to offload), context 1K: every
# sequence is longer than what 2 ranks hold without offloading at the budget's capacity, so the steps
# run rings whose members offload. The script prints:
#   1. the losses of STEPS steps beside one process's (no rings, tp, stages, tier or server), with the
#      relative difference (the target: 1e-5);
#   2. per step, every process's peak activation bytes against B, its rings and tier bytes, and what
#      came from the server;
#   3. kill -9 of the data server, and of a stage-1 process, after the first checkpoint: seconds from
#      the kill to the end of mpirun, and the line that names the process;
#   4. the newest checkpoint of the killed run resumed on the same layout: its losses against the
#      uninterrupted run's, bit for bit.
# Usage: scripts/all_in_one.sh [BUILD_DIR]   (env: DATA, STEPS, BUDGET, CONTEXT, TOKENS, OUT, VENV)
# Runs as root with the OMPI_ALLOW_RUN_AS_ROOT variables (set here); 9 processes on a 2-core machine
# are oversubscribed: this checks what runs, not how fast.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN="$BUILD/bytescale"
DATA=${DATA:-data/go-byte}
STEPS=${STEPS:-5}
BUDGET=${BUDGET:-112M}
CONTEXT=${CONTEXT:-1K}
TOKENS=${TOKENS:-4K}
OUT=${OUT:-out/all-in-one}
# the summary at the end runs in the project's Python environment (docs/python.md, "The environment");
# checked first, not after the minutes of the runs
PY=${VENV:-.venv}/bin/python
[ -x "$BIN" ] || { echo "all_in_one: no $BIN; build first (make)" >&2; exit 1; }
[ -d "$DATA" ] || { echo "all_in_one: no dataset $DATA; run $BIN prepare first" >&2; exit 1; }
[ -x "$PY" ] || { echo "all_in_one: no $PY; make the Python environment first (make venv, or make deps)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 BS_QUIET=1
rm -rf "$OUT" && mkdir -p "$OUT"
COMMON="--data $DATA --model base --context $CONTEXT --tokens $TOKENS --warmup 1 --lr 3e-3"
ALL="--tp 2 --pp 2 --servers 1 --offload-tier file --offload-dir $OUT --mem-budget $BUDGET --policy elastic"
MPI="mpirun -np 9 --oversubscribe"

echo "all_in_one: [1/5] one process, $STEPS steps" >&2
"$BIN" train $COMMON --steps "$STEPS" --metrics "$OUT/one.jsonl" > "$OUT/one.out"
echo "all_in_one: [2/5] 9 processes, everything, $STEPS steps" >&2
$MPI "$BIN" train $COMMON $ALL --steps "$STEPS" --ckpt-dir "$OUT/ck" --ckpt-every 1 --ckpt-keep 0 \
    --metrics "$OUT/all.jsonl" > "$OUT/all.out"
grep -E "^train: (model|layout|1 data server|offloading|[0-9]+ ranks)" "$OUT/all.out"

# killed RANK NAME: the same job, kill -9 of world rank RANK once the first checkpoint is written;
# prints the seconds from the kill to mpirun's end and the line of mpirun's message naming it
killed() {
    local rank=$1 name=$2 dir="$OUT/$2"
    mkdir -p "$dir"
    $MPI "$BIN" train $COMMON $ALL --steps "$STEPS" --ckpt-dir "$dir/ck" --ckpt-every 1 --ckpt-keep 0 \
        --metrics "$dir/m.jsonl" > "$dir/out" 2> "$dir/err" &
    local job=$! victim=""
    while [ -z "$victim" ]; do
        sleep 0.2
        kill -0 "$job" 2>/dev/null || { echo "all_in_one: the job ended before the kill" >&2; return 1; }
        [ -f "$dir/ck/ckpt-000001.bin" ] || continue
        for p in $(pgrep -P "$job"); do
            env_of=$(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null || true)
            if grep -qx "OMPI_COMM_WORLD_RANK=$rank" <<< "$env_of"; then victim=$p; fi
        done
    done
    local t0 t1
    t0=$(date +%s.%N)
    kill -9 "$victim"
    wait "$job" || true
    t1=$(date +%s.%N)
    printf '| kill -9 of %s (world rank %s) | %.2f s | %s |\n' "$name" "$rank" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
        "$(grep -m1 -E "rank $rank|exited on signal" "$dir/err" | sed 's/|/\\|/g')"
}
echo "all_in_one: [3/5] kill -9 of the data server" >&2
echo "all_in_one: [4/5] kill -9 of a stage-1 process" >&2
{
    echo
    echo "| what | kill to the job's end | the message |"
    echo "|---|---:|---|"
    killed 8 server
    killed 5 stage1
} > "$OUT/kills.md"

echo "all_in_one: [5/5] the stage-1 kill's newest checkpoint resumed" >&2
newest=$(ls "$OUT/stage1/ck" | sort | tail -1)
$MPI "$BIN" train $ALL --resume "$OUT/stage1/ck/$newest" --steps "$STEPS" --ckpt-dir "$OUT/resumed-ck" \
    --metrics "$OUT/resumed.jsonl" > "$OUT/resumed.out"

"$PY" - "$OUT" "$BUDGET" "$newest" <<'EOF'
import json, sys
out, budget, newest = sys.argv[1], sys.argv[2], sys.argv[3]
units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
b = int(budget[:-1]) * units[budget[-1]] if budget[-1] in units else int(budget)
def load(p): return {o["step"]: o for o in map(json.loads, open(p))}
one, allj, res = load(f"{out}/one.jsonl"), load(f"{out}/all.jsonl"), load(f"{out}/resumed.jsonl")
print("\n| step | loss, one process | loss, everything | relative difference | rings (all processes) | peak act bytes, most of a process / budget | tier bytes, least of a process | fetched from the server |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|")
worst = 0.0
for s in sorted(allj):
    a, o = allj[s], one[s]
    d = abs(a["loss"] - o["loss"]) / abs(o["loss"])
    worst = max(worst, d)
    r = a["ranks"]
    peak = max(x["act_peak_bytes"] for x in r)
    print(f"| {s} | {o['loss']:.8f} | {a['loss']:.8f} | {d:.1e} | {sum(x['rings'] for x in r)} | "
          f"{peak / 2**20:.1f} MiB / {b / 2**20:.0f} MiB ({peak / b:.0%}) | "
          f"{min(x['offload_bytes'] for x in r) / 2**20:.1f} MiB | {sum(x['fetch_bytes'] for x in r) / 1024:.1f} KiB |")
print(f"\nlargest relative difference: {worst:.1e} (target 1e-5)")
print(open(f"{out}/kills.md").read())
same = all(res[s]["loss"] == allj[s]["loss"] for s in res)
print(f"resumed from {newest}: steps {min(res)}..{max(res)} {'bit-identical to' if same else 'DIFFER from'} the uninterrupted run")
EOF
