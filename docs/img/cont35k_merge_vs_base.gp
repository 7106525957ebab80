# ekv-ref-28m, cont_3.5k (16 items): X+merge PPL over X's
# made from results.csv: ppl_ratio with ppl_ratio_lo/hi; run: gnuplot this.gp
set terminal pngcairo size 800,500 noenhanced
set output "cont35k_merge_vs_base.png"
set title "ekv-ref-28m, cont_3.5k (16 items): X+merge PPL over X's"
set xlabel "KV budget (fraction of tokens kept); policies offset slightly for legibility"
set ylabel "PPL ratio, paired 95% interval"
set grid
set key outside right top
set yrange [0.93:1.03]
set xrange [0.05:0.55]
set xtics (0.1, 0.2, 0.5)
$d0 << EOD
0.0850 0.987671 0.976161 0.997642
0.1850 0.990796 0.983624 0.997515
0.4850 1.001148 0.998876 1.004101
EOD
$d1 << EOD
0.0910 0.981007 0.963076 0.998631
0.1910 0.991350 0.980191 1.001264
0.4910 0.995619 0.986483 1.003882
EOD
$d2 << EOD
0.0970 0.972420 0.956419 0.988068
0.1970 0.983331 0.972981 0.993259
0.4970 0.992933 0.985168 1.000082
EOD
$d3 << EOD
0.1030 0.980184 0.963548 0.997045
0.2030 0.994249 0.981989 1.006800
0.5030 0.991993 0.981969 1.000629
EOD
$d4 << EOD
0.1090 0.968772 0.947881 0.988566
0.2090 0.984602 0.973214 0.994807
0.5090 0.997895 0.983536 1.008703
EOD
$d5 << EOD
0.1150 0.987786 0.976915 0.998414
0.2150 0.986727 0.974383 0.998156
0.5150 0.989404 0.980940 0.997291
EOD
plot 1 with lines dt 2 lc rgb '#888888' notitle, \
     $d0 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#1f77b4" pt 7 title "local+merge", \
     $d1 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#ff7f0e" pt 5 title "h2o+merge", \
     $d2 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#2ca02c" pt 9 title "scissorhands+merge", \
     $d3 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#d62728" pt 11 title "tova+merge", \
     $d4 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#9467bd" pt 13 title "roco+merge", \
     $d5 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#8c564b" pt 4 title "snapkv+merge"
