# throughput against world size per strategy and model (written by tandem bench; run: gnuplot THIS_FILE)
set encoding utf8
set terminal pngcairo noenhanced size 1080,556 font "sans,11"
set output '/tmp/bench-fsdp-pool/throughput.png'
set datafile missing 'NaN'
set multiplot layout 1,2 title "Throughput against world size — CPU, Gloo, 1 thread per rank, 2 cores\nsamples/s of the whole job, median over 3 repeats (bars: min..max); Tandem solid, PyTorch dashed\nevery line starts at its implementation's single-device run" font "sans,13"
set xlabel 'devices (world size)'
set ylabel 'samples/s (whole job)'
set yrange [0:*]
set grid ytics lc rgb '#dddddd'
set key outside top center horizontal maxrows 3 samplen 3 font 'sans,10'
set bars small

# panel: medium
set title "medium (701k parameters, batch 32 per device)"
set logscale x 2
set xrange [0.7692307692:5.2]
set xtics (1, 2, 4)
plot '/tmp/bench-fsdp-pool/plots/throughput.dat' index 0 using 1:2:3:4 with yerrorlines lw 2 pt 7 ps 1.2 dt 1 lc rgb "#0072B2" title "Tandem ddp", \
     '/tmp/bench-fsdp-pool/plots/throughput.dat' index 1 using 1:2:3:4 with yerrorlines lw 2 pt 7 ps 1.2 dt 1 lc rgb "#999933" title "Tandem zero2", \
     '/tmp/bench-fsdp-pool/plots/throughput.dat' index 2 using 1:2:3:4 with yerrorlines lw 2 pt 7 ps 1.2 dt 1 lc rgb "#882255" title "Tandem fsdp", \
     '/tmp/bench-fsdp-pool/plots/throughput.dat' index 3 using 1:2:3:4 with yerrorlines lw 2 pt 6 ps 1.2 dt 2 lc rgb "#0072B2" title "PyTorch ddp", \
     '/tmp/bench-fsdp-pool/plots/throughput.dat' index 4 using 1:2:3:4 with yerrorlines lw 2 pt 6 ps 1.2 dt 2 lc rgb "#882255" title "PyTorch fsdp"

# panel: large
set title "large (3.37M parameters, batch 8 per device)"
set logscale x 2
set xrange [0.7692307692:5.2]
set xtics (1, 2, 4)
plot '/tmp/bench-fsdp-pool/plots/throughput.dat' index 5 using 1:2:3:4 with yerrorlines lw 2 pt 7 ps 1.2 dt 1 lc rgb "#0072B2" title "Tandem ddp", \
     '/tmp/bench-fsdp-pool/plots/throughput.dat' index 6 using 1:2:3:4 with yerrorlines lw 2 pt 7 ps 1.2 dt 1 lc rgb "#999933" title "Tandem zero2", \
     '/tmp/bench-fsdp-pool/plots/throughput.dat' index 7 using 1:2:3:4 with yerrorlines lw 2 pt 7 ps 1.2 dt 1 lc rgb "#882255" title "Tandem fsdp", \
     '/tmp/bench-fsdp-pool/plots/throughput.dat' index 8 using 1:2:3:4 with yerrorlines lw 2 pt 6 ps 1.2 dt 2 lc rgb "#0072B2" title "PyTorch ddp", \
     '/tmp/bench-fsdp-pool/plots/throughput.dat' index 9 using 1:2:3:4 with yerrorlines lw 2 pt 6 ps 1.2 dt 2 lc rgb "#882255" title "PyTorch fsdp"
unset multiplot
