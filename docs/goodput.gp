# gnuplot script written by `deloco goodput`; run `gnuplot goodput.gp` in this folder.
set terminal pngcairo size 900,560 enhanced font 'Sans,11'
set output 'goodput.png'
set title 'Goodput under chip failures (chip MTBI 1 y, 625-chip slices, 30 days, 5 seeds)'
set xlabel 'chips'
set ylabel 'goodput (useful / allocated chip-time)'
set logscale x 2
set yrange [0:1.02]
set grid
set key outside right
set xtics ('150k' 150000, '300k' 300000, '600k' 600000, '1.2M' 1200000, '2.4M' 2400000)
set xrange [120000:3e+06]
plot \
  'goodput.dat' index 0 using 1:2:3 with yerrorlines lw 2 title 'DP', \
  'goodput.dat' index 1 using 1:2:3 with yerrorlines lw 2 dt 2 title 'elastic DP', \
  'goodput.dat' index 2 using 1:2:3 with yerrorlines lw 2 title 'DiLoCo M=1', \
  'goodput.dat' index 3 using 1:2:3 with yerrorlines lw 2 title 'DiLoCo M=2', \
  'goodput.dat' index 4 using 1:2:3 with yerrorlines lw 2 title 'DiLoCo M=4', \
  'goodput.dat' index 5 using 1:2:3 with yerrorlines lw 2 title 'DiLoCo M=8', \
  'goodput.dat' index 6 using 1:2:3 with yerrorlines lw 2 title 'DiLoCo M=16'
