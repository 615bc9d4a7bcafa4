"""Time the available exact backends on this GPU over decode (rows, L, W) and prefill
(chunk size, max_seqlen_k), find the crossovers and write a policy JSON (plus a markdown
report) that dsa_ops.policy.load and the pass accept. Refuses to run without a GPU."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from typing import Callable

import torch

HELP = "measure backends on this GPU and write a calibrated policy JSON"

DECODE_ROWS = (1, 8, 16, 64)
DECODE_WIDTHS = (133120, 1048576)
DECODE_LENGTHS = (4096, 32768, 131072)
PREFILL_ROWS = 4096
PREFILL_SEQLENS = (8192, 16384, 32768, 65536, 131072)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="dsa-ops-policy.json", help="policy JSON to write (default: %(default)s)")
    p.add_argument("--report", help="markdown report to write (default: next to --out, .md)")
    p.add_argument("--k", type=int, default=2048, help="top-k (default: 2048)")
    p.add_argument("--reps", type=int, default=30, help="timed replays per decode point (default: 30)")
    p.add_argument("--quick", action="store_true", help="a smaller grid (rows 1/16, W 133120, 3 prefill sizes)")
    p.add_argument("--backends", help="comma-separated subset of backends to consider")


def _progress(i: int, n: int, what: str) -> None:
    print(f"\r[{i}/{n}] {what:<70}", end="" if i < n else "\n", file=sys.stderr, flush=True)


def _candidates(names: str | None, k: int, width: int) -> list[str]:
    import dsa_ops
    from dsa_ops.backends.base import Query

    pool = dsa_ops.backends()
    chosen = names.split(",") if names else [n for n, b in pool.items() if b.exact]
    for n in chosen:
        dsa_ops.backends.get(n)  # ValueError names unknown backends
    return [n for n in chosen if pool[n].check(Query("decode", "cuda", k, width))]


def _serving(names: list[str], family: str, k: int, width: int) -> list[str]:
    """The candidates that serve this family at this width (decode-only backends such as
    vllm_persistent have no prefill op and are left out of the prefill points)."""
    import dsa_ops
    from dsa_ops.backends.base import Query

    pool = dsa_ops.backends(include_test_only=True)
    return [n for n in names if pool[n].check(Query(family, "cuda", k, width))]


def measure(args: argparse.Namespace, progress: Callable[[int, int, str], None] = _progress) -> list:
    """All decode and prefill measurements; each result is checked against the reference."""
    from dsa_ops import ops
    from dsa_ops.benchmarking import time_eager, time_graph
    from dsa_ops.calibration import Measurement
    from dsa_ops.testing import assert_decode_equivalent, assert_prefill_equivalent

    k, dev = args.k, "cuda"
    rows_grid = (1, 16) if args.quick else DECODE_ROWS
    widths = DECODE_WIDTHS[:1] if args.quick else DECODE_WIDTHS
    seqlens = PREFILL_SEQLENS[1:4] if args.quick else PREFILL_SEQLENS
    names = _candidates(args.backends, k, max(widths))
    jobs = [("decode", r, L, w) for w in widths for r in rows_grid for L in DECODE_LENGTHS if L <= w]
    jobs += [("prefill", PREFILL_ROWS, c, c) for c in seqlens]
    out, n = [], len(jobs) * len(names)
    i = 0
    g = torch.Generator(device=dev).manual_seed(0)
    for family, rows, length, width in jobs:
        logits = torch.randn(rows, width, device=dev, generator=g)
        res = torch.empty(rows, k, dtype=torch.int32, device=dev)
        if family == "decode":
            lengths = torch.full((rows,), length, dtype=torch.int32, device=dev)
        else:  # one causal chunk: row r ends at C - R + r + 1
            starts = torch.zeros(rows, dtype=torch.int32, device=dev)
            ends = (torch.arange(rows, device=dev, dtype=torch.int32) + (length - rows + 1)).clamp(min=0)
        for name in _serving(names, family, k, width):
            i += 1
            progress(i, n, f"{family} {name} rows={rows} L={length} W={width}")
            op = ops.backend_op(name, family, out=True)
            if family == "decode":
                call = lambda: op(logits, lengths, k, 1, 1, False, res)  # noqa: E731
                call()
                assert_decode_equivalent(res, logits, lengths, k)
                t = time_graph(call, reps=args.reps)
            else:
                call = lambda: op(logits, starts, ends, k, 1, False, res)  # noqa: E731
                call()
                assert_prefill_equivalent(res, logits, starts, ends, k)
                t = time_eager(call, reps=5, warmup=1)
            out.append(Measurement(family, name, rows, length, width, round(t.median, 3)))
        logits = None  # free before the next shape
    return out


def report(policy, ms: list) -> str:
    lines = [f"# Calibrated policy: {policy.name}", "",
             f"Device {policy.meta['device']}, torch {policy.meta['torch']}, triton {policy.meta['triton']}, "
             f"{policy.meta['date']}. Policy hash `{policy.content_hash()[:16]}`.", "",
             "## Decode (us per call, CUDA-graph replay, L2 flushed, median)", "",
             "| W | rows | L | " + " | ".join(sorted({m.backend for m in ms})) + " |",
             "|---|---|---|" + "---|" * len({m.backend for m in ms})]
    names = sorted({m.backend for m in ms})
    table: dict = {}
    for m in ms:
        table.setdefault((m.family, m.width, m.rows, m.length), {})[m.backend] = m.us
    for (fam, w, r, L), t in sorted(table.items()):
        if fam == "decode":
            lines.append(f"| {w} | {r} | {L} | " + " | ".join(f"{t.get(n, float('nan')):.1f}" for n in names) + " |")
    lines += ["", "## Prefill (ms per call, eager, median)", "", "| rows | max_seqlen_k | " + " | ".join(names) + " |",
              "|---|---|" + "---|" * len(names)]
    for (fam, w, r, L), t in sorted(table.items()):
        if fam == "prefill":
            lines.append(f"| {r} | {L} | " + " | ".join(f"{t.get(n, float('nan')) / 1e3:.2f}" for n in names) + " |")
    lines += ["", "## Decisions", ""]
    lines += [f"- decode W in [{b['min_width']}, {b['max_width'] or 'inf'}): **{b['backend']}** "
              f"(geo-mean slowdown {b['score']:.2f} over {b['points']} points)" for b in policy.meta["decode_bands"]]
    pf = policy.meta.get("prefill")
    if pf:
        lines.append(f"- prefill: below {pf['threshold']} **{pf['below']}**, at or above **{pf['above']}**"
                     + ("" if pf["crossover"] else " (no crossover: one backend wins everywhere)"))
    return "\n".join(lines) + "\n"


def report_path(out: str, given: str | None) -> str:
    """The report's path (``--report``, else ``--out`` with its extension replaced by .md),
    with both paths checked before anything is measured."""
    import os

    from dsa_ops.commands import checks

    checks.output_file("out", out)
    rep = given or os.path.splitext(out)[0] + ".md"
    checks.output_file("report", rep)
    if os.path.abspath(rep) == os.path.abspath(out):
        raise checks.UsageError(f"--report: {rep!r} is also --out (the policy JSON); name another file")
    return rep


def run(args: argparse.Namespace) -> int:
    from dsa_ops.commands import checks

    checks.top_k(args.k)
    checks.at_least("reps", args.reps, 1)
    checks.backend_names("backends", args.backends)
    args.report = report_path(args.out, args.report)
    if not torch.cuda.is_available():
        print("dsa-ops calibrate: needs a CUDA or ROCm GPU (it times kernels on the device it calibrates); "
              "none is visible here", file=sys.stderr)
        return 2
    from dsa_ops import policy as P
    from dsa_ops.backends.base import module_version
    from dsa_ops.calibration import build_policy

    ms = measure(args)
    platform, arch = P.device_platform("cuda")
    meta = {"device": torch.cuda.get_device_name(), "platform": platform, "arch": arch,
            "torch": torch.__version__, "triton": module_version("triton"),
            "date": datetime.date.today().isoformat(), "k": args.k}
    pol = build_policy(ms, platform, arch, meta)
    P.save(pol, args.out)
    P.load(args.out)  # what we wrote must load
    with open(args.report, "w", encoding="utf-8") as f:
        f.write(report(pol, ms))
    print(report(pol, ms))
    print(f"wrote {args.out} and {args.report}")
    print(json.dumps({"decode_bands": pol.meta["decode_bands"], "prefill": pol.meta["prefill"]}, indent=1))
    return 0
