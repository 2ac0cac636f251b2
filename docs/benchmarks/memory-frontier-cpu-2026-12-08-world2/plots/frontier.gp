# The memory frontier (written by tandem bench --memory-budget; run: gnuplot THIS_FILE)
set terminal pngcairo noenhanced size 1100,460 font 'sans,11'
set output 'docs/benchmarks/memory-frontier-cpu-2026-12-08-world2/frontier.png'
set multiplot layout 1,2 title 'Largest GPT that trains at 6144 MiB per process, 2 processes' font 'sans,13'
set style data histograms
set style fill solid 0.8 border -1
set boxwidth 0.7
set grid ytics
set xtics rotate by -30 nomirror
set yrange [0:*]
unset key
set title 'largest model (M parameters)'
plot 'docs/benchmarks/memory-frontier-cpu-2026-12-08-world2/plots/frontier.dat' using 2:xtic(1) lc rgb '#0072B2'
set title 'its throughput (tokens/s, all processes)'
plot 'docs/benchmarks/memory-frontier-cpu-2026-12-08-world2/plots/frontier.dat' using 3:xtic(1) lc rgb '#E69F00'
unset multiplot
