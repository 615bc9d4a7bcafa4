"""Where the time of slow launches of the cuda backend's split plans goes (GPU only).

``python -m lab.cuda_split_replays --cases 12x1048576x32768:auto+any ... --out F.json``

Each case ``ROWSxWIDTHxLENGTH:SPEC`` (SPEC as ``cuda_topk_variants``: ``auto+any``,
``split:8:16384+any``, ...) uses the harness's data (the same seed), then launches the plan
``--launches`` times with the L2 flushed before each, timed with CUDA events (a busy wait
before the start event keeps the host's enqueue out of the time), the kernel built
with ``DSA_OPS_PROFILE=2`` so that every CTA's phase stamps are global nanoseconds (comparable across
CTAs), and every launch's output checked against the reference (any order). Per case it
reports the time quantiles, the quantiles of the stamped span (first CTA start to last CTA
end: the kernel alone), the wrong outputs, and for the slowest launches where the time
went: the spread of the CTAs' starts (placement), the leaders' phases (sample, read,
exchange, count, finish) and the latest CTA's end.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from lab import cuda_topk_variants as harness

# A busy wait enqueued before each launch's start event (about 100 us): without it the events
# time the host's enqueue of the launch too (H100 run 25: events 40-50 us around kernels whose
# stamped span was 11-22 us).
HOLD_CYCLES = 200_000

STEPS = (("sample", 0, 2), ("read", 2, 6), ("exchange", 6, 7), ("count", 7, 1), ("finish", 1, 5))


def _case(text: str) -> tuple[int, int, int, str]:
    shape, _, spec = text.partition(":")
    try:
        rows, width, length = (int(v) for v in shape.split("x"))
    except ValueError:
        raise SystemExit(f"--cases: expected ROWSxWIDTHxLENGTH:SPEC, got {text!r}") from None
    return rows, width, length, spec or "auto+any"


def _launch_facts(d: torch.Tensor, cluster: int) -> dict:
    """Nanosecond facts of one launch from its (grid, 16) stamps."""
    starts = d[:, 0][d[:, 0] != 0]
    ends = d.max(1).values
    lead = d[::cluster]
    facts = {"start_spread_us": float(starts.max() - starts.min()) / 1e3,
             "span_us": float(ends.max() - starts.min()) / 1e3}
    full = lead[(lead[:, 5] != 0) & (lead[:, 7] != 0)]
    for name, a, b in STEPS:
        if full.shape[0]:
            facts[f"{name}_max_us"] = float((full[:, b] - full[:, a]).max()) / 1e3
    return facts


def run_case(rows: int, width: int, length: int, spec: str, launches: int) -> dict:
    import dsa_ops
    from dsa_ops.backends.cuda import topk
    from dsa_ops.benchmarking import flush_buffer

    base, _, defines = spec.partition("@")
    plan, _ = harness._plan(base, rows, width)
    program = harness._program(defines, profile=2)  # stamps in global nanoseconds
    ordered = harness._ordered(base)
    g = torch.Generator(device="cuda").manual_seed(rows * 31 + length)  # the harness's data
    x = torch.randn(rows, width, device="cuda", generator=g)
    lens = torch.full((rows,), length, dtype=torch.int32, device="cuda")
    out = torch.empty(rows, 2048, dtype=torch.int32, device="cuda")
    want = dsa_ops.topk_decode(x, lens, 2048, backend="reference", stable=True).sort(1).values
    cluster = plan.cluster if isinstance(plan, topk.SplitPlan) else 1
    dbg = torch.zeros(rows * cluster, 16, dtype=torch.int64, device="cuda")
    flush = flush_buffer(x.device)
    times, facts, wrong = [], [], 0
    for i in range(launches + 3):
        flush.fill_(i)
        dbg.zero_()
        out.fill_(-7)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(HOLD_CYCLES)  # the GPU waits here while the host enqueues the launch
        a.record()
        topk.launch(x, lens, lens, lens, 0, 1, 2048, out, plan=plan, stamps=dbg, program=program, ordered=ordered)
        b.record()
        torch.cuda.synchronize()
        if i < 3:
            continue
        times.append(a.elapsed_time(b) * 1e3)
        facts.append(_launch_facts(dbg.double(), cluster))
        wrong += int(not bool((out.sort(1).values == want).all()))
    t = torch.tensor(times)
    q = {f"p{int(p * 100)}_us": float(t.quantile(p)) for p in (0.1, 0.5, 0.9)}
    span = torch.tensor([f["span_us"] for f in facts])
    q.update({f"span_p{int(p * 100)}_us": float(span.quantile(p)) for p in (0.1, 0.5, 0.9)})
    slow = sorted(range(len(times)), key=lambda i: -times[i])[:5]
    fast = sorted(range(len(times)), key=lambda i: times[i])[:3]
    return {"rows": rows, "width": width, "length": length, "spec": spec, "plan": harness._shape(plan),
            "launches": launches, "wrong": wrong, **q, "max_us": float(t.max()),
            "slow_over_2x_p10": int((t > 2 * q["p10_us"]).sum()),
            "slowest": [{"us": times[i], **facts[i]} for i in slow],
            "fastest": [{"us": times[i], **facts[i]} for i in fast]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", required=True, help="ROWSxWIDTHxLENGTH:SPEC, e.g. 12x1048576x32768:auto+any")
    ap.add_argument("--launches", type=int, default=100, help="timed launches a case (default 100)")
    ap.add_argument("--out", required=True, help="JSON file to write")
    args = ap.parse_args(argv)
    if args.launches < 1:
        raise SystemExit(f"--launches: expected at least 1, got {args.launches}")
    cases = [_case(c) for c in args.cases]
    if not torch.cuda.is_available():
        raise SystemExit("cuda_split_replays needs a CUDA GPU")
    recs = []
    for n, (rows, width, length, spec) in enumerate(cases, 1):
        r = run_case(rows, width, length, spec, args.launches)
        recs.append(r)
        s = r["slowest"][0]
        print(f"[{n}/{len(cases)}] {rows:>3} x {length:>7} W {width:>7} {spec:<24} p10 {r['p10_us']:7.1f} "
              f"p50 {r['p50_us']:7.1f} p90 {r['p90_us']:7.1f} max {r['max_us']:7.1f} span p50 {r['span_p50_us']:6.1f} "
              f"p90 {r['span_p90_us']:6.1f} slow {r['slow_over_2x_p10']:3d} "
              f"wrong {r['wrong']} | slowest: " + " ".join(f"{k} {v:.1f}" for k, v in s.items()),
              file=sys.stderr, flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "records": recs}, f, indent=1)
    return 0 if all(r["wrong"] == 0 for r in recs) else 1


if __name__ == "__main__":
    sys.exit(main())
