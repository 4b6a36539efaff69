# case-study-contexts: tokens/s per policy, mean over the seeds with min-max bars (written by bytescale simulate --sweep; run from this directory)
$d0 << EOD
256 1.49069e+06 1.37907e+06 1.74572e+06
512 1.00333e+06 879047 1.10505e+06
1024 669751 556488 770998
2048 386636 327384 443902
EOD
$d1 << EOD
256 1.69449e+06 1.62155e+06 1.79241e+06
512 1.08221e+06 1.00312e+06 1.18831e+06
1024 759883 677469 920992
2048 518288 425802 709105
EOD
$d2 << EOD
256 1.6793e+06 1.56006e+06 1.78585e+06
512 1.06767e+06 929918 1.2472e+06
1024 768501 629152 956581
2048 533734 415970 711600
EOD
$d3 << EOD
256 726666 713637 740849
512 396382 391276 404302
1024 206821 204825 208339
2048 105422 104908 105789
EOD
$d4 << EOD
256 2.75203e+06 2.59608e+06 2.90476e+06
512 1.95331e+06 1.77137e+06 2.1759e+06
1024 1.44094e+06 1.2488e+06 1.80196e+06
2048 1.01906e+06 806464 1.41475e+06
EOD
$d5 << EOD
256 2.75203e+06 2.59608e+06 2.90476e+06
512 1.95331e+06 1.77137e+06 2.1759e+06
1024 1.44094e+06 1.2488e+06 1.80196e+06
2048 1.01906e+06 806464 1.41475e+06
EOD
set title "case-study-contexts: llama-7b, byted, 1024 GPUs, mean of 8 seeds"
set grid
set key top right
set yrange [0:*]
set logscale x 2
set offsets graph 0.05, graph 0.05, 0, 0
set xlabel "context"
set ylabel "tokens/s"
set xtics ("256K" 256, "512K" 512, "1M" 1024, "2M" 2048)
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) { set terminal pngcairo size 900,600 noenhanced } else { set terminal png size 900,600 noenhanced }
set output "case-study-contexts.png"
plot $d0 using 1:2:3:4 with yerrorlines lw 2 title "static", $d1 using 1:2:3:4 with yerrorlines lw 2 title "naive-nooff", $d2 using 1:2:3:4 with yerrorlines lw 2 title "naive", $d3 using 1:2:3:4 with yerrorlines lw 2 title "naive-eq3min", $d4 using 1:2:3:4 with yerrorlines lw 2 title "balance", $d5 using 1:2:3:4 with yerrorlines lw 2 title "elastic"
set terminal svg size 900,600 noenhanced
set output "case-study-contexts.svg"
replot
