# speedup of balance (solid) and elastic (dashed, when simulated) over static per model, one panel per dataset, mean over the seeds with min-max bars (bytescale simulate --grid)
$d0 << EOD
256 1.8524 1.6639 1.9234
512 1.9509 1.7379 2.1866
1024 2.1532 1.8351 2.3372
2048 2.6068 2.1744 3.2734
EOD
$e0 << EOD
256 1.8524 1.6639 1.9234
512 1.9509 1.7379 2.1866
1024 2.1532 1.8351 2.3372
2048 2.6068 2.1744 3.2734
EOD
$d1 << EOD
256 2.5190 1.9558 2.8251
512 3.1518 2.3884 3.8052
1024 4.2468 3.0568 5.8848
2048 6.9477 4.6824 10.9979
EOD
$e1 << EOD
256 2.5190 1.9558 2.8251
512 3.1518 2.3884 3.8052
1024 4.4796 3.0568 5.8848
2048 7.6177 5.5254 10.9979
EOD
$d2 << EOD
256 1.7965 1.6020 1.8746
512 1.8527 1.6564 2.0611
1024 1.9625 1.7025 2.1000
2048 2.2984 1.9586 2.7956
EOD
$e2 << EOD
256 1.7965 1.6020 1.8746
512 1.8527 1.6564 2.0611
1024 1.9625 1.7025 2.1000
2048 2.2984 1.9586 2.7956
EOD
$d3 << EOD
256 2.2892 1.7972 2.6158
512 2.7409 2.1164 3.2118
1024 3.5971 2.6530 4.5608
2048 5.6256 4.0141 8.3847
EOD
$e3 << EOD
256 2.2892 1.7972 2.6158
512 2.7409 2.1164 3.2118
1024 3.6982 2.6530 4.5608
2048 5.9936 4.5303 8.3847
EOD
$d4 << EOD
256 1.7452 1.5412 1.8286
512 1.7575 1.5944 1.9934
1024 1.7686 1.5307 1.9535
2048 1.9603 1.7064 2.2787
EOD
$e4 << EOD
256 1.7452 1.5412 1.8286
512 1.7575 1.5944 1.9934
1024 1.7686 1.5307 1.9535
2048 1.9603 1.7064 2.2787
EOD
$d5 << EOD
256 2.0859 1.6464 2.4245
512 2.3628 1.8750 2.6885
1024 2.9141 2.2373 3.3441
2048 4.2334 3.2616 5.9258
EOD
$e5 << EOD
256 2.0859 1.6464 2.4245
512 2.3628 1.8750 2.6885
1024 2.9419 2.2373 3.5068
2048 4.3904 3.3241 5.9258
EOD
$d6 << EOD
256 1.5433 1.4583 1.6492
512 1.5920 1.4137 1.8547
1024 1.4775 1.3001 1.8530
2048 1.6470 1.3492 1.9679
EOD
$e6 << EOD
256 1.5433 1.4583 1.6492
512 1.5920 1.4137 1.8547
1024 1.4775 1.3001 1.8530
2048 1.6470 1.3492 1.9679
EOD
$d7 << EOD
256 1.4483 1.3607 1.5620
512 1.5225 1.3463 1.9013
1024 1.5042 1.3658 1.7100
2048 1.8183 1.4191 2.5426
EOD
$e7 << EOD
256 1.4483 1.3607 1.5620
512 1.5225 1.3463 1.9013
1024 1.6819 1.4984 1.8496
2048 2.0105 1.6448 2.5426
EOD
$d8 << EOD
256 1.5158 1.4083 1.6745
512 1.7280 1.5800 1.9616
1024 1.7354 1.5568 1.9314
2048 2.1910 1.9208 2.6224
EOD
$e8 << EOD
256 1.5158 1.4083 1.6745
512 1.7280 1.5800 1.9616
1024 1.7560 1.5777 1.9314
2048 2.4485 2.1848 2.8182
EOD
$d9 << EOD
256 1.6712 1.3634 1.8322
512 2.0029 1.7741 2.2197
1024 2.6168 2.1171 3.1713
2048 3.9007 2.8168 5.7427
EOD
$e9 << EOD
256 1.6712 1.3634 1.8322
512 2.0164 1.7741 2.2863
1024 2.7600 2.2992 3.1713
2048 4.3202 3.5739 5.7427
EOD
$d10 << EOD
256 1.4586 1.3096 1.6185
512 1.5486 1.3079 1.7598
1024 1.4259 1.1926 1.6904
2048 1.5849 1.4469 1.9003
EOD
$e10 << EOD
256 1.4586 1.3096 1.6185
512 1.6085 1.3079 1.9398
1024 1.9617 1.6745 2.3733
2048 2.2781 1.9924 2.8701
EOD
$d11 << EOD
256 1.3688 1.1566 1.4662
512 1.5005 1.3762 1.7083
1024 1.6023 1.5469 1.7368
2048 1.8894 1.5249 3.0060
EOD
$e11 << EOD
256 1.4543 1.2407 1.6658
512 1.9854 1.8369 2.1141
1024 2.3783 2.2145 2.6342
2048 2.8316 2.3497 3.8326
EOD
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) { set terminal pngcairo size 1400,560 noenhanced } else { set terminal png size 1400,560 noenhanced }
set output "paper-grid.png"
set multiplot layout 1,2
set grid
set logscale x 2
set key top left box opaque
set yrange [0:*]
set offsets graph 0.05, graph 0.05, 0, 0
set xtics ("256K" 256, "512K" 512, "1M" 1024, "2M" 2048)
set xlabel "context"
set ylabel "tokens/s over static: balance (solid), elastic (dashed)"
set title "Byted"
plot $d0 using 1:2:3:4 with yerrorlines lw 2 lc 1 title "llama-7b", $e0 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 1 notitle, $d2 using 1:2:3:4 with yerrorlines lw 2 lc 2 title "llama-13b", $e2 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 2 notitle, $d4 using 1:2:3:4 with yerrorlines lw 2 lc 3 title "llama-30b", $e4 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 3 notitle, $d6 using 1:2:3:4 with yerrorlines lw 2 lc 4 title "llama-70b", $e6 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 4 notitle, $d8 using 1:2:3:4 with yerrorlines lw 2 lc 5 title "mixtral-8x7b", $e8 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 5 notitle, $d10 using 1:2:3:4 with yerrorlines lw 2 lc 6 title "mixtral-8x22b", $e10 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 6 notitle
set title "GitHub"
plot $d1 using 1:2:3:4 with yerrorlines lw 2 lc 1 title "llama-7b", $e1 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 1 notitle, $d3 using 1:2:3:4 with yerrorlines lw 2 lc 2 title "llama-13b", $e3 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 2 notitle, $d5 using 1:2:3:4 with yerrorlines lw 2 lc 3 title "llama-30b", $e5 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 3 notitle, $d7 using 1:2:3:4 with yerrorlines lw 2 lc 4 title "llama-70b", $e7 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 4 notitle, $d9 using 1:2:3:4 with yerrorlines lw 2 lc 5 title "mixtral-8x7b", $e9 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 5 notitle, $d11 using 1:2:3:4 with yerrorlines lw 2 lc 6 title "mixtral-8x22b", $e11 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 6 notitle
unset multiplot
set terminal svg size 1400,560 noenhanced
set output "paper-grid.svg"
set multiplot layout 1,2
set grid
set logscale x 2
set key top left box opaque
set yrange [0:*]
set offsets graph 0.05, graph 0.05, 0, 0
set xtics ("256K" 256, "512K" 512, "1M" 1024, "2M" 2048)
set xlabel "context"
set ylabel "tokens/s over static: balance (solid), elastic (dashed)"
set title "Byted"
plot $d0 using 1:2:3:4 with yerrorlines lw 2 lc 1 title "llama-7b", $e0 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 1 notitle, $d2 using 1:2:3:4 with yerrorlines lw 2 lc 2 title "llama-13b", $e2 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 2 notitle, $d4 using 1:2:3:4 with yerrorlines lw 2 lc 3 title "llama-30b", $e4 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 3 notitle, $d6 using 1:2:3:4 with yerrorlines lw 2 lc 4 title "llama-70b", $e6 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 4 notitle, $d8 using 1:2:3:4 with yerrorlines lw 2 lc 5 title "mixtral-8x7b", $e8 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 5 notitle, $d10 using 1:2:3:4 with yerrorlines lw 2 lc 6 title "mixtral-8x22b", $e10 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 6 notitle
set title "GitHub"
plot $d1 using 1:2:3:4 with yerrorlines lw 2 lc 1 title "llama-7b", $e1 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 1 notitle, $d3 using 1:2:3:4 with yerrorlines lw 2 lc 2 title "llama-13b", $e3 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 2 notitle, $d5 using 1:2:3:4 with yerrorlines lw 2 lc 3 title "llama-30b", $e5 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 3 notitle, $d7 using 1:2:3:4 with yerrorlines lw 2 lc 4 title "llama-70b", $e7 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 4 notitle, $d9 using 1:2:3:4 with yerrorlines lw 2 lc 5 title "mixtral-8x7b", $e9 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 5 notitle, $d11 using 1:2:3:4 with yerrorlines lw 2 lc 6 title "mixtral-8x22b", $e11 using 1:2:3:4 with yerrorlines lw 2 dt 2 lc 6 notitle
unset multiplot
