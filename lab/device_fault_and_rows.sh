#!/usr/bin/env bash
# One device call: build vLLM's top-k ops, find where cooperative_topk faults (probe + compute-sanitizer),
# then time cuda against vLLM's kernels over rows 1-512 (dsa-ops bench). Everything lands in $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi -L; python -c "import torch, triton; print(torch.__version__, triton.__version__)"
[ -d .vllm-topk/vllm ] || python -m dsa_ops.tools.build_vllm_topk build --src .vllm-topk-src --dest .vllm-topk 2>&1 | tail -3
tar czf "$OUT/vllm-topk.tgz" --exclude=build .vllm-topk
export PYTHONPATH=$PWD/.vllm-topk:$PWD
timeout 200 compute-sanitizer --print-limit 12 python lab/vllm_coop_fault.py case raw_issue > "$OUT/sanitizer.log" 2>&1 &
python lab/vllm_coop_fault.py all --jobs 4 --out "$OUT/fault.json" 2>&1 | tee "$OUT/fault.log"
wait
grep -v "Host Frame" "$OUT/sanitizer.log" | head -40
left=$((575 - SECONDS)); echo "bench gets ${left}s"
timeout "$left" python -m dsa_ops.cli bench --rows "${ROWS:-1,4,16,64,128,256,512}" --widths 133120,1048576 \
  --lengths 4096,32768,131072,mixed --prefill-c '' --backends cuda,vllm_persistent,vllm_cooperative \
  --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log" | tail -40
