# ekv-ref-28m, recall (24 items): X+merge PPL over X's
# made from results.csv: ppl_ratio with ppl_ratio_lo/hi; run: gnuplot this.gp
set terminal pngcairo size 800,500 noenhanced
set output "recall_merge_vs_base.png"
set title "ekv-ref-28m, recall (24 items): X+merge PPL over X's"
set xlabel "KV budget (fraction of tokens kept); policies offset slightly for legibility"
set ylabel "PPL ratio, paired 95% interval"
set grid
set key outside right top
set yrange [0.91:1.07]
set xrange [0.05:0.55]
set xtics (0.1, 0.2, 0.5)
$d0 << EOD
0.0850 0.996117 0.976976 1.016214
0.1850 0.994428 0.983933 1.003388
0.4850 0.999079 0.991964 1.007049
EOD
$d1 << EOD
0.0910 0.994132 0.959890 1.025038
0.1910 0.994884 0.977514 1.013166
0.4910 1.007585 0.989202 1.030380
EOD
$d2 << EOD
0.0970 0.997030 0.961878 1.025946
0.1970 0.998401 0.981567 1.015119
0.4970 0.997271 0.980970 1.011198
EOD
$d3 << EOD
0.1030 0.976505 0.952624 0.999411
0.2030 0.985164 0.969737 1.000390
0.5030 1.007927 0.984158 1.033827
EOD
$d4 << EOD
0.1090 0.969356 0.929326 1.012642
0.2090 0.973806 0.942762 1.007507
0.5090 1.009756 0.995372 1.026651
EOD
$d5 << EOD
0.1150 0.987188 0.972488 1.002731
0.2150 1.013565 0.993558 1.042353
0.5150 1.019761 0.996342 1.052640
EOD
plot 1 with lines dt 2 lc rgb '#888888' notitle, \
     $d0 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#1f77b4" pt 7 title "local+merge", \
     $d1 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#ff7f0e" pt 5 title "h2o+merge", \
     $d2 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#2ca02c" pt 9 title "scissorhands+merge", \
     $d3 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#d62728" pt 11 title "tova+merge", \
     $d4 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#9467bd" pt 13 title "roco+merge", \
     $d5 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#8c564b" pt 4 title "snapkv+merge"
