#!/usr/bin/env bash
# This session's device work in two calls (each under the 10-minute limit); everything lands in $OUT:
#   bash lab/device_session.sh probe-calibrate   # vLLM's ops, the fault probe, calibrate, ship_policies, bench --stock
#   bash lab/device_session.sh tests             # GPU tests: special rows, the cuda kernel, graphs
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi -L; python -c "import torch, triton; print(torch.__version__, triton.__version__)"
[ -d .vllm-topk/vllm ] || python -m dsa_ops.tools.build_vllm_topk build --src .vllm-topk-src --dest .vllm-topk 2>&1 | tail -3
export PYTHONPATH=$PWD/.vllm-topk:$PWD
mkdir -p .out
case "${1:-}" in
probe-calibrate)
  tar czf "$OUT/vllm-topk.tgz" --exclude=build .vllm-topk
  timeout 100 compute-sanitizer --print-limit 8 python lab/vllm_coop_fault.py case raw_issue > "$OUT/sanitizer.log" 2>&1 &
  timeout 120 python lab/vllm_coop_fault.py all --jobs 4 --out "$OUT/fault.json" > "$OUT/fault.log" 2>&1
  wait
  cut -c1-220 "$OUT/fault.log"; grep -v "Host Frame" "$OUT/sanitizer.log" | grep -v "^=========\s*$" | head -24
  left=$((400 - SECONDS)); echo "calibrate gets ${left}s"
  timeout "$left" python -m dsa_ops.cli calibrate --out .out/h100-cal.json --rows "${CAL_ROWS:-1,16,64,128,512}" \
    --backends cuda,vllm_persistent,vllm_cooperative --prefill-seqlens '' > .out/calibrate.out 2> .out/calibrate.log
  echo "calibrate rc=$?"; cp .out/h100-cal.* "$OUT"/ 2>/dev/null; tail -2 .out/calibrate.log
  cal=.out/h100-cal.json; [ -f "$cal" ] || cal=.out/h100-cal.measurements.jsonl
  python -m lab.ship_policies "$cal" --dest .out/policies --reports .out > .out/ship.out 2>&1; echo "ship rc=$?"
  tail -3 .out/ship.out; tar czf "$OUT/policies.tgz" .out/policies .out/*.md 2>/dev/null
  left=$((575 - SECONDS)); echo "bench --stock gets ${left}s"
  timeout "$left" python -m dsa_ops.cli bench --stock --out "$OUT/stock" --rows 1,16,64,128,512 --widths 133120 \
    --lengths 4096,131072,mixed --policy .out/policies/hopper-vllm.json > "$OUT/stock.out" 2> "$OUT/stock.log"
  echo "bench rc=$?"; tail -12 "$OUT/stock.out" ;;
tests)
  left=$((280 - SECONDS))
  timeout "$left" python -m pytest -q -p no:cacheprovider tests/test_vllm_special_rows.py tests/test_cuda_gpu.py \
    tests/test_e2e_cuda_graph.py tests/test_cuda_topk.py 2>&1 | tee "$OUT/tests.log" | grep -v "^[.sF]*\s*\[" | tail -25 ;;
*)
  echo "usage: bash lab/device_session.sh probe-calibrate|tests"; exit 2 ;;
esac
