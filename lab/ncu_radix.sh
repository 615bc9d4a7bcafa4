#!/bin/bash
# Nsight Compute reports of the radix decode kernel (device only): for each shape, the
# summary sections and a per-SASS-line source page (stall samples) as CSV under $1.
# Env: SHAPES="rows W L;prefill rows C;..." (a shape's words go to ncu_radix.py, key=value
# knobs too), NCU_EXTRA (more ncu flags); KERNEL (the kernel name's regex) and MODULE (the
# python -m module that launches it three times) profile another kernel the same way
# (ncu_cuda_topk.sh does, for the cuda backend's kernel).
out=${1:?output folder}
mkdir -p "$out"
IFS=';' read -ra shapes <<< "${SHAPES:-1 133120 4096;1 133120 131072;64 133120 131072}"  # rows W L;...
for s in "${shapes[@]}"; do
  tag=$(echo "$s" | tr ' =' '_-')
  ncu --clock-control none ${NCU_EXTRA:-} -k "regex:${KERNEL:-radix_kernel}" --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats \
      --section Occupancy --section InstructionStats --section SourceCounters --import-source no \
      -f -o "$out/r_$tag" python3 -m "${MODULE:-lab.ncu_radix}" $s > "$out/log_$tag.txt" 2>&1
  ncu --import "$out/r_$tag.ncu-rep" --print-units base >> "$out/log_$tag.txt" 2>&1
  ncu --import "$out/r_$tag.ncu-rep" --page source --csv --print-source sass > "$out/sass_$tag.csv" 2>&1
  rm -f "$out/r_$tag.ncu-rep"
done
ls -la "$out"
