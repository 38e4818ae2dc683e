# Plot of `kolo-bench scaling --plot out.png`: images/sec (top) and scaling
# efficiency (bottom) against workers, one line per model and system.
# The driver calls:
#   gnuplot -e "datafile='out.png.dat'; outfile='out.png'; nseries=N" bench/plot_scaling.gnuplot
# datafile: one block per series (separated by two blank lines), each headed by
# "<model> <system>" "images/sec" "efficiency", then rows: workers images/sec efficiency.
if (!exists("datafile")) datafile = 'scaling.png.dat'
if (!exists("outfile")) outfile = 'scaling.png'
if (!exists("nseries")) nseries = 1

set terminal pngcairo size 900,900 noenhanced
set output outfile
set multiplot layout 2,1 title "kolo-bench scaling"
set key outside right top
set grid
set xlabel "workers"
set xtics 1

set ylabel "images/sec (all workers)"
plot for [i=0:nseries-1] datafile index i using 1:2 with linespoints title columnheader(1)

set ylabel "efficiency vs workers x kolo 1-worker"
set format y "%.0f%%"
plot for [i=0:nseries-1] datafile index i using 1:($3*100) with linespoints title columnheader(1)
unset multiplot
