#!/usr/bin/env bash
# Row bands on the device, in two calls (each under the 10-minute limit); everything lands in $OUT:
#   bash lab/device_row_bands.sh calibrate   # vLLM's ops, then dsa-ops calibrate (rows 1..512), kept in .out/ too
#   bash lab/device_row_bands.sh stock       # the two Hopper policies from that run, bench --stock, explain
# "stock" takes .out/h100-cal.json from a "calibrate" call on the same warm machine, else a
# docs/benchmarks/h100-cal.json carried in the tree, else the .measurements.jsonl of a cut-short run.
# CAL_ARGS adds calibrate options (e.g. CAL_ARGS="--rows 1,8,64,512" when time is short).
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi -L; python -c "import torch, triton; print(torch.__version__, triton.__version__)"
[ -d .vllm-topk/vllm ] || python -m dsa_ops.tools.build_vllm_topk build --src .vllm-topk-src --dest .vllm-topk 2>&1 | tail -3
export PYTHONPATH=$PWD/.vllm-topk:$PWD
python - <<'PY' || { echo "vLLM's ops or the cuda backend are not available here: stopping"; exit 3; }
import sys, dsa_ops
bs = dsa_ops.backends()
for n, b in bs.items():
    print(f"{n:18} {b.availability()}")
sys.exit(0 if bs["vllm_cooperative"].availability() and bs["cuda"].availability() else 3)
PY
mkdir -p .out
case "${1:-}" in
calibrate)
  left=$((585 - SECONDS)); echo "calibrate gets ${left}s"
  timeout "$left" python -m dsa_ops.cli calibrate --out .out/h100-cal.json ${CAL_ARGS:-} \
    > .out/calibrate.out 2> .out/calibrate.log
  echo "calibrate rc=$? (1: some output failed the check and was left out; 124: cut short, the .jsonl has the rest)"
  cp .out/h100-cal.* .out/calibrate.* "$OUT"/ 2>/dev/null
  tail -3 .out/calibrate.log
  grep -E "^- (decode|prefill)|^Worst|^Against stock" .out/h100-cal.md 2>/dev/null ;;
stock)
  cal=.out/h100-cal.json
  [ -f "$cal" ] || cal=docs/benchmarks/h100-cal.json
  [ -f "$cal" ] || cal=.out/h100-cal.measurements.jsonl
  echo "policies from $cal"
  python -m lab.ship_policies "$cal" --dest .out/policies --reports "$OUT" > "$OUT/ship.out" 2>&1
  echo "ship rc=$?"; tail -2 "$OUT/ship.out"
  cp -r .out/policies "$OUT"/
  left=$((540 - SECONDS)); echo "bench gets ${left}s"
  timeout "$left" python -m dsa_ops.cli bench --stock --out "$OUT/stock" \
    --policy builtin,.out/policies/hopper-vllm.json,.out/policies/hopper.json > "$OUT/stock.out" 2> "$OUT/stock.log"
  echo "bench rc=$?"; tail -2 "$OUT/stock.log"; grep "^- " "$OUT/stock/bench.md"
  left=$((590 - SECONDS))
  [ "$left" -gt 20 ] && timeout "$left" python -m dsa_ops.cli explain --device cuda --width 133120 --layers 1 \
    --policy .out/policies/hopper-vllm.json > "$OUT/explain.txt" 2>&1; sed -n '/decode by row count/,/^$/p' "$OUT/explain.txt" ;;
*)
  echo "usage: bash lab/device_row_bands.sh calibrate|stock"; exit 2 ;;
esac
