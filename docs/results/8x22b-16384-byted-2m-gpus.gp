# 8x22b-16384-byted-2m-gpus: tokens/s per policy (written by bytescale simulate --sweep; run from this directory)
$d0 << EOD
8192 764365
16384 1.28698e+06
32768 1.67321e+06
EOD
$d1 << EOD
8192 747557
16384 955569
32768 1.18044e+06
EOD
$d2 << EOD
4096 146361
8192 172270
16384 341316
32768 363114
EOD
$d3 << EOD
4096 678095
8192 1.36627e+06
16384 1.81352e+06
32768 2.28792e+06
EOD
set title "8x22b-16384-byted-2m-gpus: mixtral-8x22b, byted, context 2M"
set grid
set key top left
set yrange [0:*]
set logscale x 2
set offsets graph 0.05, graph 0.05, 0, 0
set xlabel "GPUs"
set ylabel "tokens/s"
set xtics ("4096" 4096, "8192" 8192, "16384" 16384, "32768" 32768)
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) { set terminal pngcairo size 900,600 noenhanced } else { set terminal png size 900,600 noenhanced }
set output "8x22b-16384-byted-2m-gpus.png"
plot $d0 using 1:2 with linespoints lw 2 title "static", $d1 using 1:2 with linespoints lw 2 title "naive-nooff", $d2 using 1:2 with linespoints lw 2 title "naive", $d3 using 1:2 with linespoints lw 2 title "balance"
set terminal svg size 900,600 noenhanced
set output "8x22b-16384-byted-2m-gpus.svg"
replot
