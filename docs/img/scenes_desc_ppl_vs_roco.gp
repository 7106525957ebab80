# ekv-ref-vlm, scenes dev descriptions (200): PPL over RoCo's
# made from results.csv: ppl_ratio with ppl_ratio_lo/hi; run: gnuplot this.gp
set terminal pngcairo size 1000,560 noenhanced
set output "scenes_desc_ppl_vs_roco.png"
set title "ekv-ref-vlm, scenes dev descriptions (200): PPL over RoCo's"
set xlabel "KV budget (fraction of tokens kept); policies offset slightly for legibility"
set ylabel "PPL ratio, paired 95% interval"
set grid
set key outside right top
set yrange [0.8:3.3]
set xrange [0.08:0.22]
set xtics (0.1, 0.2)
set ylabel "PPL ratio, paired 95% interval"
$d0 << EOD
0.0875 2.464926 2.340267 2.599479
0.1875 2.626592 2.457524 2.814849
EOD
$d1 << EOD
0.0900 1.262060 1.221360 1.303259
0.1900 1.209750 1.181141 1.242249
EOD
$d2 << EOD
0.0925 1.405431 1.345276 1.466609
0.1925 1.090864 1.069157 1.115646
EOD
$d3 << EOD
0.0950 1.799297 1.705283 1.898130
0.1950 1.655989 1.568050 1.748967
EOD
$d4 << EOD
0.0975 1.310784 1.255356 1.371699
0.1975 1.287854 1.237891 1.344638
EOD
$d5 << EOD
0.1000 2.305303 2.155157 2.462437
0.2000 1.937533 1.820339 2.077074
EOD
$d6 << EOD
0.1025 2.244865 2.096220 2.407034
0.2025 1.630945 1.534759 1.736208
EOD
$d7 << EOD
0.1050 1.136308 1.098626 1.173933
0.2050 1.044750 1.027508 1.064005
EOD
$d8 << EOD
0.1075 0.935368 0.920724 0.950264
0.2075 0.971155 0.961512 0.980092
EOD
$d9 << EOD
0.1100 2.986639 2.808746 3.175293
0.2100 2.607652 2.465932 2.767704
EOD
$d10 << EOD
0.1125 2.211944 2.096743 2.337823
0.2125 2.290027 2.156079 2.439464
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
