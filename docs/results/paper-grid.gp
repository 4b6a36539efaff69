# speedup of balance (solid) and elastic (dashed, when simulated) over static per model, one panel per dataset, mean over the seeds with min-max bars (bytescale simulate --grid)
$d0 << EOD
256 1.8471 1.6590 1.9171
512 1.9466 1.7356 2.1809
1024 2.1495 1.8330 2.3317
2048 2.6027 2.1752 3.2641
EOD
$e0 << EOD
256 1.8471 1.6590 1.9171
512 1.9466 1.7356 2.1809
1024 2.1495 1.8330 2.3317
2048 2.6027 2.1752 3.2641
EOD
$d1 << EOD
256 2.4999 1.9448 2.8044
512 3.1283 2.3766 3.7701
1024 4.2341 3.0431 5.8219
2048 6.9242 4.6848 10.8679
EOD
$e1 << EOD
256 2.4999 1.9448 2.8044
512 3.1283 2.3766 3.7701
1024 4.4462 3.0431 5.8219
2048 7.5564 5.4994 10.8679
EOD
$d2 << EOD
256 1.7821 1.5884 1.8570
512 1.8405 1.6486 2.0458
1024 1.9518 1.6945 2.0899
2048 2.2888 1.9508 2.7772
EOD
$e2 << EOD
256 1.7821 1.5884 1.8570
512 1.8405 1.6486 2.0458
1024 1.9518 1.6945 2.0899
2048 2.2888 1.9508 2.7772
EOD
$d3 << EOD
256 2.2426 1.7691 2.5632
512 2.6856 2.0871 3.1320
1024 3.5586 2.6199 4.4349
2048 5.5791 4.0229 8.1201
EOD
$e3 << EOD
256 2.2426 1.7691 2.5632
512 2.6856 2.0871 3.1320
1024 3.6233 2.6199 4.4349
2048 5.8613 4.4628 8.1201
EOD
$d4 << EOD
256 1.7093 1.5088 1.7835
512 1.7283 1.5741 1.9540
1024 1.7445 1.5152 1.9256
2048 1.9402 1.6943 2.2411
EOD
$e4 << EOD
256 1.7093 1.5088 1.7835
512 1.7283 1.5741 1.9540
1024 1.7445 1.5152 1.9256
2048 1.9402 1.6943 2.2411
EOD
$d5 << EOD
256 1.9883 1.5874 2.3055
512 2.2542 1.8173 2.5647
1024 2.8029 2.1723 3.2932
2048 4.0834 3.2095 5.4875
EOD
$e5 << EOD
256 1.9883 1.5874 2.3055
512 2.2542 1.8173 2.5647
1024 2.8029 2.1723 3.2932
2048 4.1521 3.2095 5.4875
EOD
$d6 << EOD
256 1.5151 1.4310 1.6288
512 1.5694 1.3966 1.8290
1024 1.4667 1.2948 1.8343
2048 1.6346 1.3404 1.9389
EOD
$e6 << EOD
256 1.6802 1.5506 1.8046
512 1.8061 1.5716 2.1920
1024 1.7681 1.5321 2.2234
2048 1.6346 1.3404 1.9389
EOD
$d7 << EOD
256 1.4047 1.3085 1.5173
512 1.4832 1.3182 1.8311
1024 1.4884 1.3482 1.6845
2048 1.7874 1.3982 2.4467
EOD
$e7 << EOD
256 1.6890 1.5511 1.8400
512 2.0375 1.8265 2.5928
1024 1.9639 1.7514 2.1202
2048 2.2769 1.6241 3.5293
EOD
$d8 << EOD
256 1.4976 1.4038 1.6319
512 1.6999 1.5538 1.9260
1024 1.7230 1.5439 1.9048
2048 2.1720 1.9119 2.5406
EOD
$e8 << EOD
256 1.6030 1.5161 1.7998
512 1.7967 1.6490 2.0354
1024 2.0191 1.8217 2.2007
2048 2.5272 2.2599 2.8444
EOD
$d9 << EOD
256 1.6400 1.3523 1.7839
512 1.9420 1.6459 2.1983
1024 2.5990 2.1671 3.0183
2048 3.8564 2.8297 5.4109
EOD
$e9 << EOD
256 1.8535 1.5437 1.9850
512 2.2836 2.0507 2.4822
1024 2.8440 2.4018 3.3828
2048 4.3669 3.5763 6.0644
EOD
$d10 << EOD
256 1.4519 1.3030 1.6104
512 1.5378 1.2937 1.7501
1024 1.4190 1.1922 1.6772
2048 1.5790 1.4379 1.9223
EOD
$e10 << EOD
256 1.7870 1.5842 1.9785
512 1.9872 1.6364 2.3496
1024 2.1382 1.8439 2.5013
2048 2.2641 1.9728 2.8546
EOD
$d11 << EOD
256 1.3680 1.1652 1.4721
512 1.4743 1.3802 1.6808
1024 1.6035 1.5249 1.6952
2048 1.8799 1.5329 2.9006
EOD
$e11 << EOD
256 1.8600 1.5853 1.9863
512 2.2331 2.0802 2.5742
1024 2.5277 2.2843 2.6771
2048 2.9831 2.3858 4.2765
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
