# case-study-gpus: tokens/s per policy, mean over the seeds with min-max bars (written by bytescale simulate --sweep; run from this directory)
$d0 << EOD
512 205067 193993 223130
1024 386636 327384 443902
2048 640894 526026 789225
EOD
$d1 << EOD
512 362309 319869 433884
1024 518288 425802 709105
2048 757261 530282 977809
EOD
$d2 << EOD
256 205885 172292 263245
512 371865 321400 463693
1024 533734 415970 711600
2048 843487 596893 1.0831e+06
EOD
$d3 << EOD
256 71703.5 52470.9 88893
512 104195 101747 105672
1024 105422 104908 105789
2048 105741 105667 105785
EOD
$d4 << EOD
256 254850 201140 353961
512 513264 405295 713519
1024 1.01906e+06 806464 1.41475e+06
2048 1.64802e+06 1.59954e+06 1.67205e+06
EOD
$d5 << EOD
256 254850 201140 353961
512 513264 405295 713519
1024 1.01906e+06 806464 1.41475e+06
2048 2.02788e+06 1.59954e+06 2.82736e+06
EOD
set title "case-study-gpus: llama-7b, byted, context 2M, mean of 8 seeds"
set grid
set key top left
set yrange [0:*]
set logscale x 2
set offsets graph 0.05, graph 0.05, 0, 0
set xlabel "GPUs"
set ylabel "tokens/s"
set xtics ("256" 256, "512" 512, "1024" 1024, "2048" 2048)
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) { set terminal pngcairo size 900,600 noenhanced } else { set terminal png size 900,600 noenhanced }
set output "case-study-gpus.png"
plot $d0 using 1:2:3:4 with yerrorlines lw 2 title "static", $d1 using 1:2:3:4 with yerrorlines lw 2 title "naive-nooff", $d2 using 1:2:3:4 with yerrorlines lw 2 title "naive", $d3 using 1:2:3:4 with yerrorlines lw 2 title "naive-eq3min", $d4 using 1:2:3:4 with yerrorlines lw 2 title "balance", $d5 using 1:2:3:4 with yerrorlines lw 2 title "elastic"
set terminal svg size 900,600 noenhanced
set output "case-study-gpus.svg"
replot
