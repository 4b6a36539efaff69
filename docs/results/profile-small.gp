# profile-small: bytescale profile, model small: one layer's forward + backward time, measured (median, min-max bars) and fitted
# (written by bytescale profile --plot; run from this directory)
$fit << EOD
256 18.0066 15.947 19.7667
384 26.6007 24.7393 30.8439
768 61.2794 55.913 67.3263
1024 83.4007 77.7038 91.9572
2048 215.041 202.526 243.186
3072 392.518 370.733 433.705
6144 1235.48 1196.9 1281.09
8192 2036.31 1964.52 2143.75
EOD
$held << EOD
512 38.232 34.4573 43.216
1536 146.929 139.698 161.645
4096 637.815 611.142 686.179
EOD
fit(x) = 1e3 * (4.6554442364346659e-08 * x * (x + 1) / 2 + 5.6876851697768832e-05 * x + 0.0018052826419620225)
cpu(x) = 1e3 * (5.2747252747252747e-08 * x * (x + 1) / 2 + 7.5956043956043953e-05 * x + 5.0000000000000002e-05)
set title "small: one layer, forward + backward (2 ranks, 2026-11-23T23:34:50Z)"
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
plot fit(x) with lines lw 2 lc rgb "#08519c" title "fit: T(s) = 2.33e-08 s^2 + 5.69e-05 s + 0.00181", \
     cpu(x) with lines dt 2 lc rgb "#969696" title "cpu profile (derived, not measured)", \
     $fit using 1:2:3:4 with yerrorbars pt 7 lc rgb "#e6550d" title "measured (fitted)", \
     $held using 1:2:3:4 with yerrorbars pt 6 ps 1.5 lc rgb "#31a354" title "measured (held out)"
set terminal svg size 800,500 noenhanced
set output "profile-small.svg"
replot
