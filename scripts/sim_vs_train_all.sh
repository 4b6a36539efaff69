#!/usr/bin/env bash
# sim_vs_train_all.sh: scripts/sim_vs_train.sh over the layouts and item kinds of issue 41, one table.
#
# For each model in MODELS (default "tiny small"): one profile of this machine on 1 process and one on
# 2 (`bytescale profile`, measured once each and shared by every run of that process count), then
#   1 process          balance          packs only
#   2 processes        static, balance  rings (static rings every micro-batch over both), packs
#   2 processes        flexsp           all-to-all (Ulysses) groups of 2
#   tp 2, pp 2         balance          one HDP rank: packs, with the TP all-reduces / the 1F1B pipeline
# each step's plan simulated with the profile its job planned with (`simulate --plan --cost`) and set
# beside the step time `bytescale train` measured. A hybrid (a ring of Ulysses groups) needs 4 ranks,
# which 2 cores cannot time: it is not in the table. Prints a markdown table; each run's own table and
# per-step figures stay under OUT/<model>-<layout>/.
#
# Usage: scripts/sim_vs_train_all.sh [BUILD_DIR]   (env: OUT (default out/sim-vs-train-all), STEPS
#        (default 8), MODELS, LAYOUTS, and sim_vs_train.sh's DATA, TOKENS, CAPACITY). Run it on a quiet machine:
#        it takes about 10 minutes a model for tiny, longer for small.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
OUT=${OUT:-out/sim-vs-train-all}
export STEPS=${STEPS:-8}
MODELS=${MODELS:-tiny small}
LAYOUTS=${LAYOUTS:-np1 np2 a2a tp2 pp2}  # a subset runs only those (a2a, tp2 and pp2 need np2's profile)
mkdir -p "$OUT"

# one run of sim_vs_train.sh: $1 tag, $2 layout words for the table, then env assignments
run() {
    local tag=$1 layout=$2
    shift 2
    echo "== $tag" >&2
    env "$@" OUT="$OUT/$tag" scripts/sim_vs_train.sh "$BUILD" >"$OUT/$tag.txt"
    # its rows: policy steps measured simulated diff max-step-diff core-steps max-there kinds
    awk -v tag="$tag" -v layout="$layout" 'NR > 1 && NF >= 9 {
        printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", tag, layout, $1, $9, $3, $4, $5, $6 }' "$OUT/$tag.txt" \
        >>"$OUT/table.md"
}

printf '| run | layout | policy | items (pack/ring/a2a/hybrid) | median measured s | median simulated s | difference | largest step difference |\n' \
    >"$OUT/table.md"
printf '|---|---|---|---|---:|---:|---:|---:|\n' >>"$OUT/table.md"
has() { case " $LAYOUTS " in *" $1 "*) return 0 ;; esac; return 1; }
for model in $MODELS; do
    if has np1; then run "$model-np1" "1 process" MODEL="$model" NP=1 POLICIES=balance; fi
    has np2 || continue  # the other layouts share the 2-process profile that this run measures
    run "$model-np2" "2 processes, hdp 2" MODEL="$model" NP=2 POLICIES="static balance"
    p2="$OUT/$model-np2/profile.json"
    if has a2a; then run "$model-np2-a2a" "2 processes, hdp 2" MODEL="$model" NP=2 POLICIES=flexsp PROFILE="$p2"; fi
    if has tp2; then run "$model-tp2" "tp 2" MODEL="$model" NP=2 TP=2 POLICIES=balance PROFILE="$p2"; fi
    if has pp2; then run "$model-pp2" "pp 2" MODEL="$model" NP=2 PP=2 POLICIES=balance PROFILE="$p2"; fi
done
cat "$OUT/table.md"
