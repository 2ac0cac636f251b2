# step-time breakdown per Tandem strategy at the widest world (written by tandem bench; run: gnuplot THIS_FILE)
set encoding utf8
set terminal pngcairo noenhanced size 1080,556 font "sans,11"
set output '/tmp/bench-fsdp-pool/breakdown.png'
set datafile missing 'NaN'
set multiplot layout 1,2 title "Step-time breakdown at the widest world — CPU, Gloo, 1 thread per rank, 2 cores\nms, medians over 3 repeats; compute: the single-device step; other: the rest\nexposed communication: DDP's synced step minus its no_sync step" font "sans,13"
set style data histograms
set style histogram rowstacked gap 1
set style fill solid 0.85 border -1
set boxwidth 0.6
set ylabel 'step time (ms, p50)'
set yrange [0:*]
set grid ytics lc rgb '#dddddd'
set xtics nomirror scale 0
set key outside top center horizontal font 'sans,10'

# panel: medium
set title "medium (701k parameters, batch 32 per device)\n4 devices"
plot '/tmp/bench-fsdp-pool/plots/breakdown.dat' index 0 using 2:xtic(1) title 'compute' lc rgb '#0072B2', \
     '/tmp/bench-fsdp-pool/plots/breakdown.dat' index 0 using 3 title 'exposed communication' lc rgb '#D55E00', \
     '/tmp/bench-fsdp-pool/plots/breakdown.dat' index 0 using 4 title "other" lc rgb '#BBBBBB'

# panel: large
set title "large (3.37M parameters, batch 8 per device)\n4 devices"
plot '/tmp/bench-fsdp-pool/plots/breakdown.dat' index 1 using 2:xtic(1) title 'compute' lc rgb '#0072B2', \
     '/tmp/bench-fsdp-pool/plots/breakdown.dat' index 1 using 3 title 'exposed communication' lc rgb '#D55E00', \
     '/tmp/bench-fsdp-pool/plots/breakdown.dat' index 1 using 4 title "other" lc rgb '#BBBBBB'
unset multiplot
