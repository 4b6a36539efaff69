#!/bin/sh
# offload_pp_budget.sh: what offloading under pipeline stages buys (docs/model.md, "Offloading").
# Model base (8 layers) in 2 stages on 2 processes (one HDP rank), sequences of S = 4C tokens, two
# per step, so that stage 0 holds both at once as 1F1B does in its steady state. For each of "offloading" (--offload-tier file) and "resident" (--offload-tier off) it
# finds the smallest --mem-budget that trains such a step, by bisection over real 1-step runs of
# `mpirun -np 2 bytescale train --pp 2` (a budget trains when the run exits 0; a budget that does
# not is refused up front, so failed probes cost little). The budget is per process and shared by
# the 2 micro-batches 1F1B keeps in flight on stage 0 (cost_pipe_in_flight; a step of one sequence
# needs the same budget, and holds half of it). Then the step time: the offloading run at its smallest budget, the same plans kept
# resident (--offload-tier resident at its capacity, no budget), and the resident run at its own
# smallest budget; medians of the steps after the first. Prints a markdown table.
#   usage: scripts/offload_pp_budget.sh [build-dir] [C] [steps]    (defaults: build 128 4)
# Needs mpirun; runs as root with the OMPI_ALLOW_RUN_AS_ROOT variables set. Scratch in $TMPDIR.
set -eu
BUILD=${1:-build}
C=${2:-128}
STEPS=${3:-4}
BIN="$BUILD/bytescale"
[ -x "$BIN" ] || { echo "offload_pp_budget: no $BIN; build first (make)" >&2; exit 1; }
S=$((4 * C))
export OPENBLAS_NUM_THREADS=1 BS_QUIET=1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/offload-pp-budget-XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# documents longer than S tokens (byte tokenizer: one token per byte), so every sequence is S long
mkdir -p "$WORK/in"
i=0
while [ $i -lt 8 ]; do
    awk -v n=$((S + 100 + 37 * i)) -v seed=$i 'BEGIN { srand(seed); s = "";
        split("func return if err != nil { } x := for range i package main ( ) int", w, " ");
        while (length(s) < n) s = s w[int(rand() * 17) + 1] (rand() < 0.2 ? "\n" : " ");
        printf "%s", substr(s, 1, n) }' > "$WORK/in/f$i.go"
    i=$((i + 1))
done
"$BIN" prepare --input "$WORK/in" --out "$WORK/data" > /dev/null

COMMON="--data $WORK/data --model base --pp 2 --context $S --tokens $((2 * S)) --policy balance --warmup 1 --lr 1e-3"

# run NAME STEPS ARGS...: mpirun -np 2 bytescale train, metrics to $WORK/NAME.jsonl, output to
# $WORK/NAME.out; the exit status of the job
run() {
    name=$1 steps=$2
    shift 2
    mpirun -np 2 --oversubscribe "$BIN" train $COMMON --steps "$steps" --metrics "$WORK/$name.jsonl" "$@" \
        > "$WORK/$name.out" 2>&1
}

# smallest TIER: the smallest budget in MiB / 16 (64 KiB) that trains one step with that tier
smallest() {
    tier=$1
    hi=16  # 1 MiB, doubled until a step trains
    while ! run probe 1 --offload-tier "$tier" --mem-budget $((hi * 65536)); do
        hi=$((hi * 2))
        [ $hi -le 1048576 ] || { echo "offload_pp_budget: no budget up to 64 GiB trains ($tier):" >&2; tail -3 "$WORK/probe.out" >&2; exit 1; }
    done
    lo=$((hi / 2))  # lo fails (or is below the first probe), hi trains
    while [ $((hi - lo)) -gt 1 ]; do
        mid=$(((lo + hi) / 2))
        if run probe 1 --offload-tier "$tier" --mem-budget $((mid * 65536)); then hi=$mid; else lo=$mid; fi
    done
    echo $((hi * 65536))
}

# median_seconds NAME: the median step time of the steps after the first
median_seconds() {
    sed -n 's/.*"step":\([0-9]*\),.*"seconds":\([0-9.e+-]*\),.*/\1 \2/p' "$WORK/$1.jsonl" | awk '$1 > 1 { print $2 }' |
        sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}

# peak NAME: the largest per-process act_peak_bytes of the run; moved NAME: offload bytes per step
peak() { grep -o '"act_peak_bytes":[0-9]*' "$WORK/$1.jsonl" | cut -d: -f2 | sort -g | tail -1; }
moved() { grep -o '"offload_bytes":[0-9]*' "$WORK/$1.jsonl" | cut -d: -f2 | awk '{ s += $1 } END { print s / '"$STEPS"' }'; }
waited() { grep -o '"offload_wait":[0-9.e+-]*' "$WORK/$1.jsonl" | cut -d: -f2 | awk '{ s += $1 } END { printf "%.4f", s / '"$STEPS"' }'; }
share() { grep -o '"core_share":[0-9.]*' "$WORK/$1.jsonl" | cut -d: -f2 | sort -g | head -1; }
losses() { grep -o '"loss":[0-9.e+-]*' "$WORK/$1.jsonl" | cut -d: -f2 | tr '\n' ' '; }
capacity() { sed -n 's/.*capacity \([0-9]*\),.*/\1/p' "$WORK/$1.out" | head -1; }

echo "offload_pp_budget: bisecting the budget with offloading (file tier)..." >&2
B_OFF=$(smallest file)
echo "offload_pp_budget: bisecting the budget without offloading..." >&2
B_RES=$(smallest off)
echo "offload_pp_budget: timing $STEPS steps of each..." >&2
run off "$STEPS" --offload-tier file --mem-budget "$B_OFF"
C_OFF=$(capacity off)
run kept "$STEPS" --offload-tier resident --capacity "$C_OFF"
run res "$STEPS" --offload-tier off --mem-budget "$B_RES"
C_RES=$(capacity res)
T_OFF=$(median_seconds off)
T_KEPT=$(median_seconds kept)
T_RES=$(median_seconds res)
SAME=no
[ "$(losses off)" = "$(losses kept)" ] && SAME=yes

mib() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1048576 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
echo "## Offloading under pp = 2 on 2 processes: model base, sequences of 4C = $S tokens, two per step (C = $C)"
echo
echo "Smallest --mem-budget per process that trains the step (bisection to 64 KiB; stage 0's share is half);"
echo "step times: medians of steps 2..$STEPS, provisional; waited: seconds per step the processes blocked on the"
echo "tier (copies not hidden); core share: the least CPU share a process had (below 1: other work shared its core)."
echo
echo "| run | smallest budget MiB | capacity | peak MiB per process | moved MiB/step | waited s/step | least core share | median step s | step / same plans resident |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
echo "| offloading (file tier) | $(mib "$B_OFF") | $C_OFF | $(mib "$(peak off)") | $(mib "$(moved off)") | $(waited off) | $(share off) | $T_OFF | $(ratio "$T_OFF" "$T_KEPT") |"
echo "| the same plans kept resident | - | $C_OFF | $(mib "$(peak kept)") | 0 | 0 | $(share kept) | $T_KEPT | 1.00 |"
echo "| without offloading | $(mib "$B_RES") | $C_RES | $(mib "$(peak res)") | 0 | 0 | $(share res) | $T_RES | - |"
echo
echo "Budget with / without offloading: $(ratio "$B_OFF" "$B_RES"); step time offloaded / resident at its own"
echo "smallest budget: $(ratio "$T_OFF" "$T_RES"). Losses of the offloading run bitwise those of the same plans kept"
echo "resident: $SAME."
