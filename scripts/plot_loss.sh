#!/bin/sh
# plot_loss.sh METRICS.jsonl OUT_PREFIX: the loss curve of a `bytescale train` metrics file
# (one JSON object per step, docs/training.md) -> OUT_PREFIX.png and OUT_PREFIX.svg.
#
# Plots the per-step loss, its exponential moving average, and the learning rate on a second axis.
# Needs gnuplot (apt-get install gnuplot-nox); jq is not needed: "step", "loss" and "lr" are pulled
# out of each line with awk. The images are written to temporary files and renamed into place.
set -eu

die() {
    echo "plot_loss.sh: error: $*" >&2
    exit 1
}

[ $# -eq 2 ] || { echo "usage: plot_loss.sh METRICS.jsonl OUT_PREFIX" >&2; exit 2; }
metrics=$1
prefix=$2
command -v gnuplot >/dev/null 2>&1 || die "gnuplot is not installed (apt-get install gnuplot-nox)"
[ -r "$metrics" ] || die "cannot read metrics file $metrics"
outdir=$(dirname "$prefix")
[ -d "$outdir" ] || mkdir -p "$outdir" || die "cannot create directory $outdir"

data=$(mktemp)
trap 'rm -f "$data" "$prefix.png.tmp.$$" "$prefix.svg.tmp.$$"' EXIT

# step, loss, moving average of the loss, lr: one row per line that has a numeric step and loss.
# The average's span grows with the run (about 1/20 of it) so short and long runs both read well.
awk '
function num(key,    m) {
    if (match($0, "\"" key "\":[-+0-9.eE]+")) return substr($0, RSTART + length(key) + 3, RLENGTH - length(key) - 3)
    return ""
}
{
    s = num("step"); l = num("loss"); r = num("lr")
    if (s == "" || l == "") next
    n++; step[n] = s; loss[n] = l; lr[n] = (r == "" ? "NaN" : r)
}
END {
    span = n / 20; if (span < 1) span = 1
    a = 2 / (span + 1)
    for (i = 1; i <= n; i++) {
        ema = (i == 1) ? loss[i] : a * loss[i] + (1 - a) * ema
        printf "%s %s %.6g %s\n", step[i], loss[i], ema, lr[i]
    }
}' "$metrics" >"$data"
[ -s "$data" ] || die "$metrics has no lines with a step and a loss"
rows=$(wc -l <"$data")

png_term=png
if gnuplot -e "set terminal pngcairo" >/dev/null 2>&1; then png_term="pngcairo"; fi

plot() {  # $1 terminal line, $2 output file
    gnuplot <<EOF || die "gnuplot failed writing $2"
set terminal $1
set output "$2"
set title "training loss: $(basename "$metrics") ($rows steps)" noenhanced
set xlabel "step"
set ylabel "loss (nats / token)"
set y2label "learning rate"
set ytics nomirror
set y2tics
set format y2 "%g"
set grid
set key outside top center horizontal
plot "$data" using 1:2 with lines lc rgb "#9ecae1" title "loss", \
     "$data" using 1:3 with lines lw 2 lc rgb "#08519c" title "moving average", \
     "$data" using 1:4 axes x1y2 with lines dt 2 lc rgb "#e6550d" title "lr"
EOF
}

plot "$png_term size 1000,600" "$prefix.png.tmp.$$"
plot "svg size 1000,600" "$prefix.svg.tmp.$$"
mv -f "$prefix.png.tmp.$$" "$prefix.png"
mv -f "$prefix.svg.tmp.$$" "$prefix.svg"
echo "plot_loss.sh: wrote $prefix.png and $prefix.svg ($rows steps)"
