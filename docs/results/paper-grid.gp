# speedup of balance over static per model, one panel per dataset (bytescale simulate --grid)
$d0 << EOD
256 1.9219
512 2.1112
1024 2.1729
2048 2.2742
EOD
$d1 << EOD
256 2.5919
512 2.7665
1024 3.5691
2048 6.5353
EOD
$d2 << EOD
256 1.8686
512 2.0525
1024 2.0374
2048 2.0300
EOD
$d3 << EOD
256 2.3847
512 2.4473
1024 3.0042
2048 5.1714
EOD
$d4 << EOD
256 1.8172
512 1.9934
1024 1.8930
2048 1.7581
EOD
$d5 << EOD
256 2.1930
512 2.1423
1024 2.4277
2048 3.8243
EOD
$d6 << EOD
256 1.4351
512 1.4742
1024 1.3045
2048 1.7020
EOD
$d7 << EOD
256 1.3601
512 1.5060
1024 1.3969
2048 1.6223
EOD
$d8 << EOD
256 1.4040
512 1.7985
1024 1.8619
2048 2.0701
EOD
$d9 << EOD
256 1.7759
512 1.8422
1024 2.1020
2048 3.2881
EOD
$d10 << EOD
256 1.2344
512 1.6909
1024 1.4996
2048 1.4091
EOD
$d11 << EOD
256 1.4315
512 1.3805
1024 1.2722
2048 1.5244
EOD
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) { set terminal pngcairo size 1400,560 noenhanced } else { set terminal png size 1400,560 noenhanced }
set output "paper-grid.png"
set multiplot layout 1,2
set grid
set logscale x 2
set key bottom right box opaque
set yrange [0:*]
set offsets graph 0.05, graph 0.05, 0, 0
set xtics ("256K" 256, "512K" 512, "1M" 1024, "2M" 2048)
set xlabel "context"
set ylabel "tokens/s, balance / static"
set title "Byted"
plot $d0 using 1:2 with linespoints lw 2 title "llama-7b", $d2 using 1:2 with linespoints lw 2 title "llama-13b", $d4 using 1:2 with linespoints lw 2 title "llama-30b", $d6 using 1:2 with linespoints lw 2 title "llama-70b", $d8 using 1:2 with linespoints lw 2 title "mixtral-8x7b", $d10 using 1:2 with linespoints lw 2 title "mixtral-8x22b"
set title "GitHub"
plot $d1 using 1:2 with linespoints lw 2 title "llama-7b", $d3 using 1:2 with linespoints lw 2 title "llama-13b", $d5 using 1:2 with linespoints lw 2 title "llama-30b", $d7 using 1:2 with linespoints lw 2 title "llama-70b", $d9 using 1:2 with linespoints lw 2 title "mixtral-8x7b", $d11 using 1:2 with linespoints lw 2 title "mixtral-8x22b"
unset multiplot
set terminal svg size 1400,560 noenhanced
set output "paper-grid.svg"
set multiplot layout 1,2
set grid
set logscale x 2
set key bottom right box opaque
set yrange [0:*]
set offsets graph 0.05, graph 0.05, 0, 0
set xtics ("256K" 256, "512K" 512, "1M" 1024, "2M" 2048)
set xlabel "context"
set ylabel "tokens/s, balance / static"
set title "Byted"
plot $d0 using 1:2 with linespoints lw 2 title "llama-7b", $d2 using 1:2 with linespoints lw 2 title "llama-13b", $d4 using 1:2 with linespoints lw 2 title "llama-30b", $d6 using 1:2 with linespoints lw 2 title "llama-70b", $d8 using 1:2 with linespoints lw 2 title "mixtral-8x7b", $d10 using 1:2 with linespoints lw 2 title "mixtral-8x22b"
set title "GitHub"
plot $d1 using 1:2 with linespoints lw 2 title "llama-7b", $d3 using 1:2 with linespoints lw 2 title "llama-13b", $d5 using 1:2 with linespoints lw 2 title "llama-30b", $d7 using 1:2 with linespoints lw 2 title "llama-70b", $d9 using 1:2 with linespoints lw 2 title "mixtral-8x7b", $d11 using 1:2 with linespoints lw 2 title "mixtral-8x22b"
unset multiplot
