# 8x22b-16384-byted-2m-gpus: tokens/s per policy, mean over the seeds with min-max bars (written by bytescale simulate --sweep; run from this directory)
$d0 << EOD
8192 871176 686200 1.14582e+06
16384 1.31765e+06 953477 1.68966e+06
32768 1.71035e+06 1.24416e+06 2.15974e+06
EOD
$d1 << EOD
8192 829515 632061 1.04807e+06
16384 1.20913e+06 927551 1.54748e+06
32768 1.54017e+06 1.11003e+06 1.84892e+06
EOD
$d2 << EOD
4096 427174 326955 571537
8192 831297 644292 1.10556e+06
16384 1.16573e+06 828742 1.54936e+06
32768 1.63814e+06 1.0425e+06 2.20181e+06
EOD
$d3 << EOD
4096 154874 115695 198001
8192 214801 164778 302248
16384 354684 333278 363329
32768 363178 362982 363287
EOD
$d4 << EOD
4096 738969 663358 862462
8192 1.4997e+06 1.33764e+06 1.73865e+06
16384 2.06803e+06 1.80134e+06 2.45629e+06
32768 2.45439e+06 2.45439e+06 2.45439e+06
EOD
$d5 << EOD
4096 738969 663358 862462
8192 1.4997e+06 1.33764e+06 1.73865e+06
16384 2.95307e+06 2.64912e+06 3.47932e+06
32768 4.61657e+06 4.08078e+06 5.57476e+06
EOD
set title "8x22b-16384-byted-2m-gpus: mixtral-8x22b, byted, context 2M, mean of 8 seeds"
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
plot $d0 using 1:2:3:4 with yerrorlines lw 2 title "static", $d1 using 1:2:3:4 with yerrorlines lw 2 title "naive-nooff", $d2 using 1:2:3:4 with yerrorlines lw 2 title "naive", $d3 using 1:2:3:4 with yerrorlines lw 2 title "naive-eq3min", $d4 using 1:2:3:4 with yerrorlines lw 2 title "balance", $d5 using 1:2:3:4 with yerrorlines lw 2 title "elastic"
set terminal svg size 900,600 noenhanced
set output "8x22b-16384-byted-2m-gpus.svg"
replot
