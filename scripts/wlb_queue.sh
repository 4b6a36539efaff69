#!/bin/sh
# wlb_queue.sh: wlb's outlier queue over a 64-step run (docs/peers.md, "wlb": "The queue over a run").
# For each scenario (default 7b-1024-byted-2m and 7b-1024-github-256k) runs bench_wlb_queue, which
# plans and simulates wlb for STEPS steps (each step's delayed documents first into the next, the last
# flushing) and fails unless every document is trained exactly once; writes OUT/<scenario>.csv (one
# row a step) and OUT/wlb-queue.png: the delayed documents after each step, split into the outliers
# waiting in the queue and the short documents Algorithm 1 could not fit ("remained").
#   usage: scripts/wlb_queue.sh [build-dir] [out-dir] [steps] [scenario ...]
#          (defaults: build out/wlb-queue 64 7b-1024-byted-2m 7b-1024-github-256k)
set -eu
BUILD=${1:-build}
OUT=${2:-out/wlb-queue}
STEPS=${3:-64}
[ $# -gt 3 ] && shift 3 || set -- 7b-1024-byted-2m 7b-1024-github-256k
BIN="$BUILD/bench_wlb_queue"
[ -x "$BIN" ] || { echo "wlb_queue: no $BIN; build first (make)" >&2; exit 1; }
mkdir -p "$OUT"
PLOT=""
for sc in "$@"; do
    # the run's last line says how many documents were not trained exactly once; a failure stops here
    "$BIN" --scenario "$sc" --steps "$STEPS" --csv "$OUT/$sc.csv" | tail -1 | sed "s/^/$sc: /"
    PLOT="$PLOT${PLOT:+, }'$OUT/$sc.csv' using 1:(\$6+\$7+\$8) with linespoints title '$sc: outliers waiting', '$OUT/$sc.csv' using 1:9 with impulses title '$sc: remained (did not fit)'"
done
if command -v gnuplot > /dev/null; then
    gnuplot <<EOF
set datafile separator ','
set key below
set terminal pngcairo size 1000,500
set output '$OUT/wlb-queue.png'
set title 'wlb: documents delayed after each step ($STEPS steps, the last flushes)'
set xlabel 'step'
set ylabel 'documents'
set logscale y
set yrange [0.8:*]
plot $PLOT
EOF
    echo "plot: $OUT/wlb-queue.png"
else
    echo "wlb_queue: no gnuplot; the CSVs are in $OUT" >&2
fi
