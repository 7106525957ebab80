# Quality against KV bytes on ekv-ref-28m (docs/results.md, "Pareto: quality against KV bytes").
# x: K/V bytes at the end of each item / full f32 cache; y: PPL / PPL of the full f32 cache on the same items.
set terminal pngcairo size 900,560 noenhanced
set output "pareto_kv_types.png"
set title "ekv-ref-28m, 3,000-token prompts (heldout_dev): PPL against KV bytes"
set xlabel "K/V bytes / full f32 cache (log scale)"
set ylabel "PPL / full f32 PPL (same items)"
set logscale x 2
set grid
set key inside right top
set xrange [0.08:1.3]
set object 1 rect from 0.08,0.99 to 0.125,1.05 fc rgb "#d0f0d0" fs solid 0.5 noborder behind
set label 1 "target: <= 1/8 bytes, <= 1.05x" at 0.085,1.055 font ",9"
$types << EOD
1 1.0 f32
0.5 0.9999907 f16
0.2656 0.9998321 q8_0
0.1406 1.0106504 q4_0
0.1659 1.0025117 kivi4
0.1052 1.0516703 kivi2
EOD
$evict << EOD
0.114104 1.0107472 snapkv 0.65 kivi4
0.110284 1.0178034 roco 0.65 kivi4
EOD
plot $types using 1:2 with points pt 7 ps 1.5 lc rgb "#1f77b4" title "full cache, by type (5 items)", \
     $types using 1:2:3 with labels offset 1.5,0.6 notitle, \
     $evict using 1:2 with points pt 5 ps 1.5 lc rgb "#d62728" title "policy at budget 0.65 + kivi4 (10 items)", \
     $evict using 1:2:3 with labels offset 0,-1.0 font ",9" notitle
