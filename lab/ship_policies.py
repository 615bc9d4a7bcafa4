"""Turn one ``dsa-ops calibrate`` run on a Hopper GPU into the two shipped default policies
(from a checkout's root: this writes into the checkout's ``dsa_ops/policies/`` and ``docs/``).

    python -m lab.ship_policies CALIBRATION.json [--context-mix L:w,...]

CALIBRATION.json is what ``dsa-ops calibrate --out`` wrote on the H100 (or its
``.measurements.jsonl``, for a run that was cut short), with vLLM's kernels among the measured
backends. From its stored measurements (no GPU needed) it writes

* ``dsa_ops/policies/hopper-vllm.json``: calibrated over every measured backend on the costs the
  vLLM route pays (``--for-vllm-route``: picking vLLM's kernel there costs what stock does), with
  the stock guard (each (W, rows) keeps to the backends within 1 us of stock vLLM's own choice at
  every measured L); the default on Hopper where vLLM's kernels load (the vLLM route's case);
* ``dsa_ops/policies/hopper.json``: calibrated over the same measurements without the vLLM
  backends, no guard (there is no stock vLLM to match); the default on Hopper without them;

and their reports (timings, bands, regret) as ``docs/benchmarks/h100-policy-vllm.md`` and
``h100-policy.md``. ``dsa_ops.policy.default_choice`` picks between the two files at run time.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout (lab/ is not in the wheel)


def main(argv: Optional[Sequence[str]] = None) -> int:
    from dsa_ops import cli
    from dsa_ops import policy as P
    from dsa_ops.commands import calibrate, checks

    p = argparse.ArgumentParser(prog="python -m lab.ship_policies", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("calibration", help="a dsa-ops calibrate JSON (or .measurements.jsonl) from a Hopper GPU")
    p.add_argument("--context-mix", help="passed to calibrate (default: the measured lengths, equal weights)")
    p.add_argument("--stock-guard", default="1.0", help="hopper-vllm.json's stock guard in us (default: %(default)s)")
    p.add_argument("--dest", default=P.SHIPPED_DIR, help="where the policies go (default: %(default)s)")
    p.add_argument("--reports", default=os.path.join(ROOT, "docs", "benchmarks"),
                   help="where the reports go (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        ms, meta = calibrate.load_measurements(args.calibration)
    except checks.UsageError as exc:
        print(f"ship_policies: {exc}", file=sys.stderr)
        return 2
    if meta.get("platform") != "cuda" or not str(meta.get("arch", "")).startswith("sm_90"):
        print(f"ship_policies: {args.calibration!r} was measured on {meta.get('platform')} {meta.get('arch')} "
              f"({meta.get('device')}); the shipped policies are for Hopper (cuda sm_90)", file=sys.stderr)
        return 2
    from dsa_ops.calibration_rows import STOCK

    measured = sorted({m.backend for m in ms if m.family == "decode" and m.backend != STOCK})
    without = [b for b in measured if not b.startswith("vllm")]
    if len(without) == len(measured):
        print(f"ship_policies: no vLLM backend was measured ({measured}); run calibrate with vLLM's ops on "
              f"PYTHONPATH (docs/vllm-kernels.md)", file=sys.stderr)
        return 2
    mix = ["--context-mix", args.context_mix] if args.context_mix else []
    os.makedirs(args.dest, exist_ok=True)
    status = 0
    for name, report, keep, guard in ((P.HOPPER_VLLM, "h100-policy-vllm.md", measured, args.stock_guard),
                                      (P.HOPPER, "h100-policy.md", without, "off")):
        route = ["--for-vllm-route"] if name == P.HOPPER_VLLM else []
        rc = cli.main(["calibrate", "--from-measurements", args.calibration, "--backends", ",".join(keep),
                       "--name", os.path.splitext(name)[0], "--out", os.path.join(args.dest, name),
                       "--report", os.path.join(args.reports, report), "--stock-guard", guard] + route + mix)
        if rc not in (0, 1):  # 1: some outputs failed the check and were left out (the report lists them)
            return rc
        status = max(status, rc)
        print(f"ship_policies: {name}: {P.load(os.path.join(args.dest, name)).content_hash()[:16]}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
