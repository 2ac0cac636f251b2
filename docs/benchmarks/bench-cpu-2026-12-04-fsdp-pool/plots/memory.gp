# peak memory per device per strategy at the widest world (written by tandem bench; run: gnuplot THIS_FILE)
set encoding utf8
set terminal pngcairo noenhanced size 1080,534 font "sans,11"
set output '/tmp/bench-fsdp-pool/memory.png'
set datafile missing 'NaN'
set multiplot layout 1,2 title "Peak memory per device at the widest world — CPU, Gloo, 1 thread per rank, 2 cores\nMiB, median over 3 repeats (bars: min..max); measured as whole-process RSS per rank, LibTorch included" font "sans,13"
impl(s) = s eq 'tandem' ? 'Tandem' : (s eq 'pytorch' ? 'PyTorch' : s)
label(i, s) = impl(i) . sep . s
set style data histograms
set style histogram errorbars gap 1 lw 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set ylabel 'peak memory per device (MiB)'
set yrange [0:*]
set grid ytics lc rgb '#dddddd'
set xtics nomirror scale 0
set key outside top center horizontal font 'sans,10'

# panel: medium
set title "medium (701k parameters, batch 32 per device)\nwidest world: 4 devices; single: 1 device"
sep = ' '
set xtics rotate by 30 right
unset bmargin
plot '/tmp/bench-fsdp-pool/plots/memory.dat' index 0 using 4:5:6:xtic(label(strcol(1), strcol(2))) title 'device 0' lc rgb '#D55E00', \
     '/tmp/bench-fsdp-pool/plots/memory.dat' index 0 using 7:8:9 title 'other devices (max)' lc rgb '#56B4E9'

# panel: large
set title "large (3.37M parameters, batch 8 per device)\nwidest world: 4 devices; single: 1 device"
sep = ' '
set xtics rotate by 30 right
unset bmargin
plot '/tmp/bench-fsdp-pool/plots/memory.dat' index 1 using 4:5:6:xtic(label(strcol(1), strcol(2))) title 'device 0' lc rgb '#D55E00', \
     '/tmp/bench-fsdp-pool/plots/memory.dat' index 1 using 7:8:9 title 'other devices (max)' lc rgb '#56B4E9'
unset multiplot
