# ekv-ref-vlm, scenes dev descriptions (200): ROUGE-L F minus RoCo's
# made from results.csv: ppl_ratio with ppl_ratio_lo/hi; run: gnuplot this.gp
set terminal pngcairo size 1000,560 noenhanced
set output "scenes_desc_rouge_vs_roco.png"
set title "ekv-ref-vlm, scenes dev descriptions (200): ROUGE-L F minus RoCo's"
set xlabel "KV budget (fraction of tokens kept); policies offset slightly for legibility"
set ylabel "PPL ratio, paired 95% interval"
set grid
set key outside right top
set yrange [-0.7:0.1]
set xrange [0.08:0.22]
set xtics (0.1, 0.2)
set ylabel "ROUGE-L F minus RoCo's, paired 95% interval"
$d0 << EOD
0.0875 -0.168716 -0.187651 -0.149987
0.1875 -0.167498 -0.184444 -0.150720
EOD
$d1 << EOD
0.0900 -0.045172 -0.057814 -0.033176
0.1900 -0.019903 -0.030744 -0.008917
EOD
$d2 << EOD
0.0925 -0.047194 -0.061434 -0.033706
0.1925 -0.015578 -0.028345 -0.003160
EOD
$d3 << EOD
0.0950 -0.055140 -0.066043 -0.044130
0.1950 -0.058254 -0.067448 -0.048514
EOD
$d4 << EOD
0.0975 -0.022402 -0.035137 -0.009175
0.1975 -0.005867 -0.016269 0.005422
EOD
$d5 << EOD
0.1000 -0.124002 -0.139133 -0.108805
0.2000 -0.066682 -0.080104 -0.053847
EOD
$d6 << EOD
0.1025 -0.098101 -0.114856 -0.081735
0.2025 -0.048409 -0.062220 -0.034935
EOD
$d7 << EOD
0.1050 -0.043730 -0.058548 -0.029479
0.2050 0.003204 -0.006116 0.012685
EOD
$d8 << EOD
0.1075 0.004013 -0.006133 0.014856
0.2075 0.037765 0.030005 0.046323
EOD
$d9 << EOD
0.1100 -0.621740 -0.648496 -0.593675
0.2100 -0.652864 -0.684356 -0.621637
EOD
$d10 << EOD
0.1125 -0.140598 -0.157851 -0.123002
0.2125 -0.161107 -0.175236 -0.146169
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
