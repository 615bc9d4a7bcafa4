#!/bin/bash
# Nsight Compute of the cuda backend's kernel (device only): for each shape "ROWS W L [C]"
# in $SHAPES (';'-separated), the summary sections and the per-SASS-line stall samples as
# CSV under $1 (read them with python -m dsa_ops.devtools.ncu_stalls).
out=${1:?output folder}
mkdir -p "$out"
IFS=';' read -ra shapes <<< "${SHAPES:-1 133120 32768 1;1 133120 131072}"
for s in "${shapes[@]}"; do
  tag=$(echo "$s" | tr ' ' '_')
  ncu --clock-control none -k regex:topk_rows --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats \
      --section Occupancy --section InstructionStats --section SourceCounters --import-source no \
      -f -o "$out/r_$tag" python3 -m dsa_ops.devtools.ncu_cuda_topk $s > "$out/log_$tag.txt" 2>&1
  ncu --import "$out/r_$tag.ncu-rep" --print-units base >> "$out/log_$tag.txt" 2>&1
  ncu --import "$out/r_$tag.ncu-rep" --page source --csv --print-source sass > "$out/sass_$tag.csv" 2>&1
  rm -f "$out/r_$tag.ncu-rep"
done
ls -la "$out"
