# ekv-ref-28m, cont_3.5k (16 items): PPL over local's
# made from results.csv: ppl_ratio with ppl_ratio_lo/hi; run: gnuplot this.gp
set terminal pngcairo size 800,500 noenhanced
set output "cont35k_ratio_local.png"
set title "ekv-ref-28m, cont_3.5k (16 items): PPL over local's"
set xlabel "KV budget (fraction of tokens kept); policies offset slightly for legibility"
set ylabel "PPL ratio, paired 95% interval"
set grid
set key outside right top
set yrange [0.88:1.18]
set xrange [0.05:0.55]
set xtics (0.1, 0.2, 0.5)
$d0 << EOD
0.0850 1.016921 0.982808 1.047229
0.1850 1.011190 0.961899 1.068355
0.4850 1.019928 1.001610 1.042478
EOD
$d1 << EOD
0.0910 1.053940 1.021344 1.084172
0.1910 1.047928 1.011381 1.102573
0.4910 1.026510 1.008616 1.046581
EOD
$d2 << EOD
0.0970 1.018335 0.982761 1.052976
0.1970 1.009757 0.953805 1.061121
0.4970 1.025305 1.009315 1.050316
EOD
$d3 << EOD
0.1030 1.001204 0.957101 1.049236
0.2030 0.990247 0.917961 1.046200
0.5030 1.017381 0.996708 1.038683
EOD
$d4 << EOD
0.1090 1.010280 0.958442 1.071850
0.2090 1.026296 0.993470 1.060037
0.5090 1.033458 1.005509 1.068935
EOD
$d5 << EOD
0.1150 1.007314 0.989222 1.025892
0.2150 1.004862 0.996671 1.012975
0.5150 1.009582 0.998597 1.021682
EOD
plot 1 with lines dt 2 lc rgb '#888888' notitle, \
     $d0 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#1f77b4" pt 7 title "h2o", \
     $d1 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#ff7f0e" pt 5 title "scissorhands", \
     $d2 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#2ca02c" pt 9 title "tova", \
     $d3 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#d62728" pt 11 title "roco", \
     $d4 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#9467bd" pt 13 title "snapkv", \
     $d5 using 1:2:3:4 with yerrorlines lw 2 lc rgb "#8c564b" pt 4 title "elastic-v2"
