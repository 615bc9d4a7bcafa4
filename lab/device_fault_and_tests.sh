#!/usr/bin/env bash
# One device call: build vLLM's top-k ops, find where cooperative_topk faults (probe + compute-sanitizer),
# then the GPU tests of the cuda kernel and of vLLM's kernels. Everything lands in $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi -L; python -c "import torch, triton; print(torch.__version__, triton.__version__)"
[ -d .vllm-topk/vllm ] || python -m dsa_ops.tools.build_vllm_topk build --src .vllm-topk-src --dest .vllm-topk 2>&1 | tail -3
tar czf "$OUT/vllm-topk.tgz" --exclude=build .vllm-topk
export PYTHONPATH=$PWD/.vllm-topk:$PWD
timeout 200 compute-sanitizer --print-limit 12 python lab/vllm_coop_fault.py case raw_issue > "$OUT/sanitizer.log" 2>&1 &
python lab/vllm_coop_fault.py all --jobs 4 --out "$OUT/fault.json" 2>&1 | tee "$OUT/fault.log"
wait
grep -v "Host Frame" "$OUT/sanitizer.log" | head -30
left=$((570 - SECONDS)); echo "tests get ${left}s"
timeout "$left" python -m pytest -q -x -p no:cacheprovider tests/test_cuda_gpu.py tests/test_e2e_cuda_graph.py \
  tests/test_cuda_topk.py tests/test_vllm_real_kernels.py 2>&1 | tee "$OUT/tests.log" | tail -15
