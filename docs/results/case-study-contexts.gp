# case-study-contexts: tokens/s per policy (written by bytescale simulate --sweep; run from this directory)
$d0 << EOD
256 1.41692e+06
512 879047
1024 595617
2048 366033
EOD
$d1 << EOD
256 1.66343e+06
512 1.01294e+06
1024 681728
2048 427478
EOD
$d2 << EOD
256 735580
512 396400
1024 206262
2048 105341
EOD
$d3 << EOD
256 2.72318e+06
512 1.85581e+06
1024 1.29424e+06
2048 832424
EOD
set title "case-study-contexts: llama-7b, byted, 1024 GPUs"
set grid
set key top left
set yrange [0:*]
set logscale x 2
set offsets graph 0.05, graph 0.05, 0, 0
set xlabel "context"
set ylabel "tokens/s"
set xtics ("256K" 256, "512K" 512, "1M" 1024, "2M" 2048)
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) { set terminal pngcairo size 900,600 noenhanced } else { set terminal png size 900,600 noenhanced }
set output "case-study-contexts.png"
plot $d0 using 1:2 with linespoints lw 2 title "static", $d1 using 1:2 with linespoints lw 2 title "naive-nooff", $d2 using 1:2 with linespoints lw 2 title "naive", $d3 using 1:2 with linespoints lw 2 title "balance"
set terminal svg size 900,600 noenhanced
set output "case-study-contexts.svg"
replot
