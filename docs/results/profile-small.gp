# profile-small: bytescale profile, model small: one layer's forward + backward time, measured (median, min-max bars) and fitted
# (written by bytescale profile --plot; run from this directory)
$fit << EOD
256 18.5236 17.187 27.1735
384 30.2963 26.8826 38.4073
768 65.9837 61.8476 93.4508
1024 90.6755 85.4035 122.429
2048 232.068 213.506 244.485
3072 422.17 384.223 468.975
6144 1259.69 1209.95 1323.6
8192 2056.13 2000.18 2264.38
EOD
$held << EOD
512 40.3111 35.9033 56.3318
1536 162.126 146.881 218.306
4096 645.218 599.296 675.202
EOD
fit(x) = 1e3 * (4.4649116301193596e-08 * x * (x + 1) / 2 + 6.7895637039981231e-05 * x + 0)
cpu(x) = 1e3 * (5.2747252747252747e-08 * x * (x + 1) / 2 + 7.5956043956043953e-05 * x + 5.0000000000000002e-05)
set title "small: one layer, forward + backward (2 ranks, 2026-11-23T20:37:43Z)"
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
plot fit(x) with lines lw 2 lc rgb "#08519c" title "fit: T(s) = 2.23e-08 s^2 + 6.79e-05 s + 0", \
     cpu(x) with lines dt 2 lc rgb "#969696" title "cpu profile (derived, not measured)", \
     $fit using 1:2:3:4 with yerrorbars pt 7 lc rgb "#e6550d" title "measured (fitted)", \
     $held using 1:2:3:4 with yerrorbars pt 6 ps 1.5 lc rgb "#31a354" title "measured (held out)"
set terminal svg size 800,500 noenhanced
set output "profile-small.svg"
replot
