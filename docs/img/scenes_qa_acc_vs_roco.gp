# ekv-ref-vlm, scenes dev questions (800): accuracy minus RoCo's
# made from results.csv: ppl_ratio with ppl_ratio_lo/hi; run: gnuplot this.gp
set terminal pngcairo size 1000,560 noenhanced
set output "scenes_qa_acc_vs_roco.png"
set title "ekv-ref-vlm, scenes dev questions (800): accuracy minus RoCo's"
set xlabel "KV budget (fraction of tokens kept); policies offset slightly for legibility"
set ylabel "PPL ratio, paired 95% interval"
set grid
set key outside right top
set yrange [-0.17:0.03]
set xrange [0.08:0.22]
set xtics (0.1, 0.2)
set ylabel "accuracy minus RoCo's, paired 95% interval"
$d0 << EOD
0.0875 -0.100000 -0.121250 -0.077500
0.1875 -0.092500 -0.115000 -0.071250
EOD
$d1 << EOD
0.0900 -0.067500 -0.087500 -0.048750
0.1900 -0.066250 -0.085000 -0.047500
EOD
$d2 << EOD
0.0925 -0.067500 -0.087500 -0.047500
0.1925 -0.046250 -0.063750 -0.030000
EOD
$d3 << EOD
0.0950 0.000000 -0.015000 0.015000
0.1950 -0.003750 -0.013750 0.007500
EOD
$d4 << EOD
0.0975 0.000000 -0.016250 0.017500
0.1975 0.000000 -0.010000 0.010000
EOD
$d5 << EOD
0.1000 -0.083750 -0.105000 -0.061250
0.2000 -0.035000 -0.050000 -0.020000
EOD
$d6 << EOD
0.1025 -0.068750 -0.090000 -0.048750
0.2025 -0.025000 -0.040000 -0.010000
EOD
$d7 << EOD
0.1050 -0.001250 -0.013750 0.011250
0.2050 0.000000 -0.008750 0.008750
EOD
$d8 << EOD
0.1075 0.006250 -0.002500 0.015000
0.2075 0.002500 -0.003750 0.008750
EOD
$d9 << EOD
0.1100 -0.130000 -0.155000 -0.106250
0.2100 -0.106250 -0.128750 -0.085000
EOD
$d10 << EOD
0.1125 -0.088750 -0.111250 -0.067500
0.2125 -0.081250 -0.101250 -0.062500
EOD
plot 0 with lines dt 2 lc rgb '#888888' notitle, \
     $d0 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#1f77b4" pt 7 title "local", \
     $d1 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#ff7f0e" pt 5 title "h2o", \
     $d2 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#2ca02c" pt 9 title "h2o+merge", \
     $d3 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#d62728" pt 11 title "tova", \
     $d4 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#9467bd" pt 13 title "tova+merge", \
     $d5 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#8c564b" pt 4 title "snapkv", \
     $d6 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#e377c2" pt 6 title "snapkv+merge", \
     $d7 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#7f7f7f" pt 8 title "roco+merge", \
     $d8 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#bcbd22" pt 10 title "roco+merge:merge_stats=0:merge_sim=0.9", \
     $d9 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#17becf" pt 12 title "elastic", \
     $d10 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#000000" pt 14 title "elastic-v2"
