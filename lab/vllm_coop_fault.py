"""Find where vLLM's cooperative_topk faults on legal decode input (lab probe, CUDA only).

The failing input: rows of -inf holding fewer than k finite keys and thousands of
sign-set NaNs, columns past L poisoned with +NaN / +inf. Each case runs in a child
process (a CUDA fault is sticky: it ends the process), so one run tells which of the
raw op, our adapter and the other backends fault, and which feature of the rows
triggers it::

    PYTHONPATH=<vllm-topk>:. python lab/vllm_coop_fault.py all --out fault.json
    compute-sanitizer python lab/vllm_coop_fault.py case raw_issue
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

from tests.specials import ISSUE_LENGTHS, NEG_NAN, POS_NAN, WIDTH as W, special_rows, structural

K = 2048


CASES = {
    # name: (how, row spec); how is a backend name or "raw" / "raw_ws64m"
    "raw_issue": ("raw", {}),
    "raw_issue_ws64m": ("raw_ws64m", {}),
    "adapter_issue": ("vllm_cooperative", {}),
    "raw_no_nan": ("raw", {"nans": 0}),
    "raw_pos_nan": ("raw", {"nan_bits": (POS_NAN,)}),
    "raw_both_nan": ("raw", {"nan_bits": (NEG_NAN, POS_NAN)}),
    "raw_no_tail": ("raw", {"tail": False}),
    "raw_4096_finite": ("raw", {"finite": 4096}),
    "raw_all_inf": ("raw", {"finite": 0, "nans": 0}),
    "raw_row_131072": ("raw", {"lengths": (131072,)}),
    "raw_row_16384": ("raw", {"lengths": (16384,)}),
    "raw_row_12289": ("raw", {"lengths": (12289,)}),
    "raw_8_rows_no_zero": ("raw", {"lengths": ISSUE_LENGTHS[:8]}),
    "raw_64x128k": ("raw", {"lengths": (131072,) * 64}),
    "raw_64x4k": ("raw", {"lengths": (4096,) * 64}),
    "raw_randn_64x128k": ("raw", {"lengths": (131072,) * 64, "finite": 131072, "nans": 0}),
    "persistent_issue": ("vllm_persistent", {}),
    "persistent_both_nan": ("vllm_persistent", {"nan_bits": (NEG_NAN, POS_NAN)}),
    "intree_issue": ("vllm", {}),
    "intree_both_nan": ("vllm", {"nan_bits": (NEG_NAN, POS_NAN)}),
    "cuda_issue": ("cuda", {}),
    "cuda_both_nan": ("cuda", {"nan_bits": (NEG_NAN, POS_NAN)}),
    "triton_issue": ("triton", {}),
}


def run_case(name: str) -> dict:
    import dsa_ops
    from dsa_ops.testing import assert_decode_equivalent

    how, spec = CASES[name][0], dict(CASES[name][1])
    lengths = tuple(spec.pop("lengths", ISSUE_LENGTHS))
    x = special_rows(lengths, **spec).cuda()
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out = torch.full((len(lengths), K), 0x7EADBEEF, dtype=torch.int32, device="cuda")
    if how.startswith("raw"):
        assert dsa_ops.backends()["vllm_cooperative"].availability()  # loads vLLM's extension
        ws_bytes = (64 << 20) if how == "raw_ws64m" else (1 << 20)
        ws = torch.zeros(ws_bytes, dtype=torch.uint8, device="cuda")
        out.fill_(-1)
        torch.ops._C.cooperative_topk(x, lens.clamp(0, W).to(torch.int32), out, ws, K, W)
    else:
        dsa_ops.topk_decode(x, lens, K, backend=how, out=out)
    torch.cuda.synchronize()
    rec = {"case": name, "how": how, "fault": False, "structural": structural(out, lens, W, K)}
    try:
        assert_decode_equivalent(out, x, lens, K)
        rec["contract"] = "ok"
    except AssertionError as e:
        rec["contract"] = str(e).splitlines()[0]
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    one = sub.add_parser("case", help="run one case in this process, print one JSON line")
    one.add_argument("name", choices=sorted(CASES))
    every = sub.add_parser("all", help="run every case in its own child process")
    every.add_argument("--out", required=True)
    every.add_argument("--jobs", type=int, default=4, help="child processes at a time (default: 4)")
    args = ap.parse_args(argv)
    if args.cmd == "case":
        print(json.dumps(run_case(args.name)))
        return 0
    from concurrent.futures import ThreadPoolExecutor

    def child(name: str) -> dict:
        t0 = time.time()
        p = subprocess.run([sys.executable, __file__, "case", name], capture_output=True, text=True, timeout=300)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        rec = json.loads(lines[-1]) if lines and p.returncode == 0 else {
            "case": name, "how": CASES[name][0], "fault": True, "rc": p.returncode,
            "error": [ln for ln in p.stderr.splitlines() if "rror" in ln][-3:]}
        rec["s"] = round(time.time() - t0, 1)
        print(json.dumps(rec), flush=True)
        return rec

    with ThreadPoolExecutor(args.jobs) as pool:
        records = list(pool.map(child, CASES))
    with open(args.out, "w") as f:
        json.dump(records, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
