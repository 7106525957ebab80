# ekv-ref-vlm, scenes dev questions (800): PPL over RoCo's
# made from results.csv: ppl_ratio with ppl_ratio_lo/hi; run: gnuplot this.gp
set terminal pngcairo size 1000,560 noenhanced
set output "scenes_qa_ppl_vs_roco.png"
set title "ekv-ref-vlm, scenes dev questions (800): PPL over RoCo's"
set xlabel "KV budget (fraction of tokens kept); policies offset slightly for legibility"
set ylabel "PPL ratio, paired 95% interval"
set grid
set key outside right top
set yrange [0.8:2.4]
set xrange [0.08:0.22]
set xtics (0.1, 0.2)
set ylabel "PPL ratio, paired 95% interval"
$d0 << EOD
0.0875 2.081576 1.814618 2.352553
0.1875 1.852636 1.616495 2.114875
EOD
$d1 << EOD
0.0900 1.534007 1.379458 1.717896
0.1900 1.298637 1.204256 1.410037
EOD
$d2 << EOD
0.0925 1.355493 1.247113 1.477593
0.1925 1.123064 1.078312 1.171783
EOD
$d3 << EOD
0.0950 1.026725 0.982990 1.070765
0.1950 1.021804 0.996571 1.050816
EOD
$d4 << EOD
0.0975 1.006414 0.968628 1.043875
0.1975 1.007424 0.989725 1.027283
EOD
$d5 << EOD
0.1000 1.944931 1.701746 2.243635
0.2000 1.250334 1.139340 1.390463
EOD
$d6 << EOD
0.1025 1.677805 1.484272 1.906903
0.2025 1.134626 1.056194 1.237160
EOD
$d7 << EOD
0.1050 0.997533 0.968555 1.027155
0.2050 1.005867 0.991944 1.020363
EOD
$d8 << EOD
0.1075 0.977556 0.963196 0.990181
0.2075 0.996605 0.992019 1.000375
EOD
$d9 << EOD
0.1100 1.982804 1.761067 2.234374
0.2100 1.672785 1.497699 1.885568
EOD
$d10 << EOD
0.1125 1.797298 1.588313 2.034716
0.2125 1.498163 1.347900 1.670158
EOD
plot 1 with lines dt 2 lc rgb '#888888' notitle, \
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
