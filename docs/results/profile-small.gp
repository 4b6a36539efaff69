# profile-small: bytescale profile, model small: one layer's forward + backward time, measured (median, min-max bars) and fitted
# (written by bytescale profile --plot; run from this directory)
$fit << EOD
256 15.9284 15.7496 16.1869
384 25.6882 25.2354 25.9784
768 55.05 54.3255 55.775
1024 78.0368 77.1538 79.4219
2048 199.069 196.666 203.901
3072 366.333 359.855 375.921
6144 1133.78 1114.35 1145.53
8192 1847.92 1803.64 1857.02
EOD
$held << EOD
512 33.7682 33.3874 34.5758
1536 137.655 136.11 139.405
4096 573.694 563.999 580.396
EOD
fit(x) = 1e3 * (4.1740666921095519e-08 * x * (x + 1) / 2 + 5.4801043142688992e-05 * x + 0.00077607795198290572)
cpu(x) = 1e3 * (5.2747252747252747e-08 * x * (x + 1) / 2 + 7.5956043956043953e-05 * x + 5.0000000000000002e-05)
set title "small: one layer, forward + backward (2 ranks, 2026-11-25T12:13:51Z)"
set logscale xy
set grid
set key top left
set samples 200
set xrange [204.8:10240]
set xlabel "sequence length s (tokens)"
set ylabel "ms per layer"
set xtics ("256" 256, "384" 384, "512" 512, "768" 768, "1K" 1024, "1.5K" 1536, "2K" 2048, "3K" 3072, "4K" 4096, "6K" 6144, "8K" 8192)
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) { set terminal pngcairo size 800,500 noenhanced } else { set terminal png size 800,500 noenhanced }
set output "profile-small.png"
plot fit(x) with lines lw 2 lc rgb "#08519c" title "fit: T(s) = 2.09e-08 s^2 + 5.48e-05 s + 0.000776", \
     cpu(x) with lines dt 2 lc rgb "#969696" title "cpu profile (derived, not measured)", \
     $fit using 1:2:3:4 with yerrorbars pt 7 lc rgb "#e6550d" title "measured (fitted)", \
     $held using 1:2:3:4 with yerrorbars pt 6 ps 1.5 lc rgb "#31a354" title "measured (held out)"
set terminal svg size 800,500 noenhanced
set output "profile-small.svg"
replot
