#!/bin/bash
# Nsight Compute of the cuda backend's kernel (device only): for each shape "ROWS W L [C]"
# in $SHAPES (';'-separated), the summary sections and the per-SASS-line stall samples as
# CSV under $1 (read them with python -m lab.ncu_stalls). The same collection
# as ncu_radix.sh, pointed at topk_rows and lab.ncu_cuda_topk.
SHAPES="${SHAPES:-1 133120 32768 1;1 133120 131072}" KERNEL=topk_rows MODULE=lab.ncu_cuda_topk \
  exec bash "$(dirname "$0")/ncu_radix.sh" "$@"
