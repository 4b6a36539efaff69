#!/usr/bin/env bash
# sim_vs_train.sh: does the simulator predict this machine?
#
#   1. profile this machine for the model (`bytescale profile`, 2 ranks: compute, memory, link, tier);
#   2. train STEPS steps of 2-rank HDP under each policy, planning with that profile and writing every
#      step's plan (`train --cost PROFILE --save-plans DIR`);
#   3. simulate each of those plans with the same profile (`simulate --plan FILE --cost PROFILE`) and
#      compare with the step time the trainer measured.
# Prints a table per policy (median measured, median simulated, the largest per-step difference) and
# leaves everything in OUT. The first step is a warm-up and is left out. A step in which some rank
# did not have its core (core_share < 0.9 in the metrics: another process took turns on it) measures
# the machine's load, not the plan: the last columns repeat the comparison over the steps where every
# rank had its core, and say how many those were.
#
# With PP=2 the two ranks are one pipeline of 2 stages (train --pp 2, one HDP rank: no rings, so the
# context defaults to the capacity) and the plans are PP-Balance's; the simulator replays their 1F1B
# schedule with the same profile, each stage running its half of the layers and sending its
# activations (stage_bw, stage_lat) to the next. With TP=2 the two ranks are one tensor-parallel group
# (train --tp 2, one HDP rank): each computes half of every layer and all-reduces the residual stream
# four times per layer (tp_bw, tp_lat; the backward two behind the weight gradients), as the
# simulator charges them. The profile measures both on the same two ranks (docs/profile.md, "3D").
# TP x PP is at most NP, the job's processes (NP=2 by default; NP=1 trains on one process, where
# every item is a pack).
#
# POLICIES (default "static naive balance") picks the planners: `flexsp` plans all-to-all (Ulysses)
# groups, so NP=2 POLICIES=flexsp covers the a2a item. Beside each policy the table counts the items
# of each kind in the plans it compared (packs / rings / all-to-all groups / hybrids); a hybrid (a ring
# of Ulysses groups) needs 4 ranks or more, which a 2-core machine cannot time.
#
# PROFILE=FILE uses that profile instead of measuring one (it must be of MODEL on this machine under
# mpirun -np 2: the TP=2 and PP=2 runs can share one).
#
# Usage: scripts/sim_vs_train.sh [BUILD_DIR]   (env: OUT, STEPS, DATA, MODEL, CONTEXT, CAPACITY, TOKENS, PP,
#                                               TP, NP, POLICIES, PROFILE, MPIRUN)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN="$BUILD/bytescale"
OUT=${OUT:-out/sim-vs-train}
STEPS=${STEPS:-20}
DATA=${DATA:-data/go-byte}
MODEL=${MODEL:-tiny}
PP=${PP:-1}
TP=${TP:-1}
NP=${NP:-2}
POLICIES=${POLICIES:-static naive balance}
CAPACITY=${CAPACITY:-8K}
if [ $((TP * PP)) -gt "$NP" ] || [ $((NP % (TP * PP))) -ne 0 ]; then
    echo "sim_vs_train.sh: TP=$TP x PP=$PP does not divide the job's NP=$NP processes" >&2
    exit 2
fi
# one HDP rank (TP or PP takes every process, or one process): no rings, so the context is the capacity
if [ $((TP * PP)) -eq "$NP" ]; then CONTEXT=${CONTEXT:-$CAPACITY}; else CONTEXT=${CONTEXT:-16K}; fi
TOKENS=${TOKENS:-32K}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 BS_QUIET=1
# MPIRUN="taskset -c 1" runs an NP=1 job on core 1 without mpirun (the machine's other core left to others)
MPIRUN=${MPIRUN:-mpirun -np $NP --bind-to core}

[ -x "$BIN" ] || { echo "sim_vs_train.sh: $BIN not found: run make first" >&2; exit 1; }
[ -f "$DATA/index.bin" ] || { echo "sim_vs_train.sh: no dataset in $DATA: run $BIN prepare first" >&2; exit 1; }
mkdir -p "$OUT"

# one number from a flat JSON text: the value after "key":
# (sed reads all of its input and prints the first match: no `| head -1`, whose early exit can kill the
# writer with SIGPIPE under pipefail)
json_num() { sed -n "s/.*\"$1\":[[:space:]]*\([-0-9.eE+]*\).*/\1/p" | sed -n 1p; }

if [ -n "${PROFILE:-}" ]; then
    [ -f "$PROFILE" ] || { echo "sim_vs_train.sh: PROFILE=$PROFILE is not a file" >&2; exit 1; }
    echo "== profile: $PROFILE (not measured again)" >&2
    [ "$PROFILE" -ef "$OUT/profile.json" ] || cp "$PROFILE" "$OUT/profile.json"
else
    echo "== profile ($MODEL, $NP ranks; tp $TP, pp $PP)" >&2
    $MPIRUN "$BIN" profile --model "$MODEL" --lengths 256,512,1K,2K,4K,8K,12K,16K --out "$OUT/profile.json" \
        >"$OUT/profile.txt"
fi

printf '%-8s %6s %12s %13s %10s %16s %12s %16s  %s\n' policy steps "measured s" "simulated s" "diff" "max step diff" \
    "core steps" "max diff there" "items: pack/ring/a2a/hybrid"
for policy in $POLICIES; do
    echo "== train: $policy, $((STEPS + 1)) steps" >&2
    rm -rf "${OUT:?}/$policy" "$OUT/$policy.jsonl"
    $MPIRUN "$BIN" train --data "$DATA" --model "$MODEL" --context "$CONTEXT" --capacity "$CAPACITY" \
        --tokens "$TOKENS" --policy "$policy" --steps $((STEPS + 1)) --cost "$OUT/profile.json" --pp "$PP" --tp "$TP" \
        --save-plans "$OUT/$policy" --metrics "$OUT/$policy.jsonl" >/dev/null
    : >"$OUT/$policy-steps.txt"
    : >"$OUT/$policy-kinds.txt"
    for step in $(seq 2 $((STEPS + 1))); do
        plan=$(printf '%s/%s/plan-%06d.json' "$OUT" "$policy" "$step")
        sim=$("$BIN" simulate --plan "$plan" --cost "$OUT/profile.json" --model "$MODEL" --hardware cpu --tp "$TP" --json |
              json_num step_time)
        line=$(sed -n "/\"step\":$step,/p" "$OUT/$policy.jsonl")
        meas=$(echo "$line" | sed -n 's/.*"seconds":\([-0-9.eE+]*\).*/\1/p')
        share=$(echo "$line" | grep -o '"core_share":[-0-9.eE+]*' | cut -d: -f2 | sort -g | sed -n 1p)
        echo "$step $meas $sim $share" >>"$OUT/$policy-steps.txt"
        # the plan's items by kind: one rank a pack, "a2a": 1 an all-to-all group, "ulysses" a hybrid
        sed -n '/"items"/,$p' "$plan" | grep '"ranks"' |
            awk '{ if ($0 ~ /"ulysses": *[1-9]/) h++; else if ($0 ~ /"a2a": *1/) a++;
                   else if ($0 ~ /"ranks": *\[[0-9]+\]/) p++; else r++ }
                 END { printf "%d %d %d %d\n", p, r, a, h }' >>"$OUT/$policy-kinds.txt"
    done
    # medians and the largest per-step relative difference (simulated vs measured)
    med() { cut -d' ' -f"$1" "$OUT/$policy-steps.txt" | sort -g |
            awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
    mm=$(med 2)
    ms=$(med 3)
    kinds=$(awk '{ for (i = 1; i <= 4; i++) k[i] += $i } END { printf "%d/%d/%d/%d", k[1], k[2], k[3], k[4] }' \
            "$OUT/$policy-kinds.txt")
    awk -v p="$policy" -v mm="$mm" -v ms="$ms" -v kinds="$kinds" '
        { d = ($3 - $2) / $2; if (d < 0) d = -d; if (d > worst) worst = d
          if ($4 >= 0.9) { quiet++; if (d > qworst) qworst = d } }
        END { printf "%-8s %6d %12.3f %13.3f %+9.1f%% %15.1f%% %12d %15.1f%%  %s\n", p, NR, mm, ms, 100 * (ms - mm) / mm,
                     100 * worst, quiet, 100 * qworst, kinds }' \
        "$OUT/$policy-steps.txt"
done
echo "per-step figures: $OUT/<policy>-steps.txt (step, measured s, simulated s, least core share); plans: $OUT/<policy>/" >&2
