"""Time the ``cuda`` backend's launch plans against each other and against ``triton`` and
vLLM's raw ``cooperative_topk`` (when its ops load) in one process (H200 only).

Decode: CUDA-graph replay of one call, L2 flushed before every replay, median of --reps;
every timed output is first checked against the stable reference (the ``cuda`` kernel must
match it byte for byte; a ``+any`` variant, the unordered emission of ``stable=False``, must
conform to the contract: dsa_ops.testing). Prefill: one 16384-row causal chunk per C, eager
medians. Variants are ``cluster:stage_keys`` plans, ``solo[:BUF]``, ``split[:C[:BUF[:M[:STAGE]]]]``
(``auto`` = the default plan), each optionally ``+any`` (ordered=False) and ``@NAME=V;...``
(``-D`` options of the build). Phase stamps come from the same build with ``DSA_OPS_PROFILE=1``.

    python -m lab.cuda_topk_variants --out variants.json \
        --decode-variants auto,1:auto,4:auto --prefill-variants auto,1:auto
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


_PROGRAMS: dict = {}
PHASES = ("pass1", "choose1", "pass2", "choose2", "pass3", "choose3", "exchange", "emit")
PHASES_LEADER = ("pass1", "choose1", "gather", "leader", "handout", "emit")


def _program(defines: str, profile: int = 0):
    """The shipped kernel, or a build with ``NAME=V[;NAME=V]`` defines (``-D`` options) and,
    with ``profile``, phase stamps (1: SM clock, 2: global ns; topk.program)."""
    from dsa_ops.backends.cuda import topk

    if not defines and not profile:
        return None
    if (defines, profile) not in _PROGRAMS:
        _PROGRAMS[defines, profile] = topk.program(profile, tuple(f"-D{d}" for d in defines.split(";") if d))
    return _PROGRAMS[defines, profile]


def _plan(spec: str, rows: int, width: int):
    """``auto[:M]``, ``C:S[:M]`` (cluster, stage keys or auto; M: rows up to M columns are
    selected by CTA 0 alone), ``cluster`` (the cluster kernel's default plan), ``solo[:BUF]``
    (one CTA a row) or ``split[:C[:BUF[:M[:STAGE]]]]`` (a row over a cluster under a sampled bound;
    STAGE: words for the slice's bulk copy),
    optionally ``@DEFINES``."""
    import dataclasses

    from dsa_ops.backends.cuda import topk

    spec, _, defines = spec.partition("@")
    ordered = not spec.endswith("+any")  # the unordered plans have no column bitmaps
    spec = spec.removesuffix("+any")
    facts = topk.device_facts()
    if spec.startswith("auto"):
        plan = topk.plan(rows, width, ordered).shape
        if ":" in spec and isinstance(plan, topk.Plan):
            plan = dataclasses.replace(plan, solo_max=int(spec.split(":")[1]))
        return plan, _program(defines)
    if spec == "cluster":  # the cluster kernel's default plan (topk.cu alone)
        return topk.make_plan(rows, width, facts.sms, facts.smem_block), _program(defines)
    if spec.startswith("split"):  # split[:C[:BUF[:M[:STAGE]]]]
        c, b, m, st = (spec.split(":")[1:] + ["", "", "", ""])[:4]
        plan = topk.split_plan(rows, width, facts.sms, facts.smem_sm, int(c) if c else None,
                               int(b) if b else None, int(m) if m else None, ordered, int(st) if st else None)
        if plan is None:
            raise SystemExit(f"split: no plan fits width {width}")
        return plan, _program(defines)
    if spec.startswith("solo"):
        buf = spec.partition(":")[2]
        plan = topk.solo_plan(width, facts.smem_sm, int(buf) if buf else None, ordered)
        if plan is None:
            raise SystemExit(f"solo: no plan fits width {width}")
        return plan, _program(defines)
    c, s, *m = spec.split(":")
    plan = topk.make_plan(rows, width, facts.sms, facts.smem_block, cluster=int(c),
                          stage_keys=None if s == "auto" else int(s), solo_max=int(m[0]) if m else None)
    return plan, _program(defines)


def _solo_phases(d: torch.Tensor) -> str:
    """topk_solo's stamps: 0 start, 2 after the sample (sampled rows), 1 after the read, 3
    after the select, 4 after the marks, 5 after the emission (0 where it returned early)."""
    live = d[:, 1] != 0
    if not bool(live.any()):
        return "trivial"
    d = d[live]
    med = lambda v: float(v.median()) / 1000 if v.numel() else float("nan")  # noqa: E731
    sampled = d[:, 2] != 0
    text = (f"rows {int(live.sum())} sampled {int(sampled.sum())} | sample {med((d[:, 2] - d[:, 0])[sampled]):.1f}"
            f" read {med(d[:, 1] - torch.where(sampled, d[:, 2], d[:, 0])):.1f} select {med(d[:, 3] - d[:, 1]):.1f}"
            f" mark {med(d[:, 4] - d[:, 3]):.1f}")
    done = d[:, 5] != 0
    text += f" emit {med((d[:, 5] - d[:, 4])[done]):.1f} total {med((d[:, 5] - d[:, 0])[done]):.1f}"
    return text


def _split_phases(d: torch.Tensor, cluster: int) -> str:
    """topk_split's stamps, leaders (CTA 0 of each row) only: 0 start, 2 after the sample, 6
    after the slice's read, 7 after the exchange, 1 after counting, then finish_row's 3 / 4 / 5."""
    lead = d[::cluster]
    lead = lead[lead[:, 7] != 0]
    if lead.numel() == 0:
        return _solo_phases(d[::cluster])
    med = lambda v: float(v.median()) / 1000  # noqa: E731
    steps = (("sample", 0, 2), ("read", 2, 6), ("exchange", 6, 7), ("count", 7, 1), ("select", 1, 3),
             ("mark", 3, 4), ("emit", 4, 5), ("total", 0, 5))
    done = lead[lead[:, 5] != 0]
    return f"leaders {lead.shape[0]} | " + " ".join(
        f"{n} {med(done[:, b] - done[:, a]):.1f}" for n, a, b in steps if done.shape[0])


def _phases(launch, grid: int, solo: bool = False, cluster: int = 0) -> str:
    """Median over the CTAs of each phase's clock cycles (thousands), from one launch."""
    dbg = torch.zeros(grid, 16, dtype=torch.int64, device="cuda")
    launch(dbg)
    torch.cuda.synchronize()
    d = dbg[:, :9].double()
    if solo:
        return _solo_phases(d)
    if cluster:
        return _split_phases(d, cluster)
    live = d[:, 1] != 0  # CTAs that ran the select (not the L <= k path)
    if not bool(live.any()):
        return "trivial"
    d = d[live]
    cols = [i for i in range(9) if bool((d[:, i] != 0).all())]  # the stamps this path sets
    if cols == [0, 1, 3, 4, 5]:  # short rows selected by CTA 0 alone (solo.cu's stamps)
        return _solo_phases(dbg[:, :9].double())
    names = PHASES_LEADER if cols == [0, 1, 2, 3, 4, 7, 8] else PHASES
    steps = (d[:, cols[1:]] - d[:, cols[:-1]]).median(0).values / 1000
    text = " ".join(f"{n} {v:.1f}" for n, v in zip(names, steps.tolist()))
    lead = dbg[0, :9].double()  # the first row's CTA 0 (the leader): its own steps
    if names is PHASES_LEADER and bool((lead[[3, 5, 6, 4]] != 0).all()):
        t = lead.tolist()
        text += (f" | leader: pass2+choose {(t[5] - t[3]) / 1000:.1f} pass3+choose {(t[6] - t[5]) / 1000:.1f}"
                 f" counts+handout {(t[4] - t[6]) / 1000:.1f}")
    return text


def _shape(p) -> str:
    from dsa_ops.backends.cuda import topk

    if isinstance(p, topk.SplitPlan):
        return f"split {p.cluster} buf {p.buf}, solo <= {p.solo_max}"
    return f"solo buf {p.buf}" if hasattr(p, "buf") else f"{p.cluster}x{p.stage_keys}, solo <= {p.solo_max}"


def _same(got: torch.Tensor, want: torch.Tensor) -> str:
    if torch.equal(got, want):
        return "ok"
    rows = (got != want).any(1).nonzero().flatten().tolist()
    return f"FAIL rows {rows[:5]}"


def _ordered(spec: str) -> bool:
    """False for a ``+any`` variant (the unordered emission of ``stable=False``)."""
    return not spec.partition("@")[0].endswith("+any")


def _conforms(check, *args) -> str:
    """The contract's tie-tolerant check (dsa_ops.testing) of an unordered output."""
    try:
        check(*args)
    except AssertionError as e:
        return "FAIL " + str(e).splitlines()[0]
    return "ok (any order)"


def _decode(rows: int, width: int, length: int, variants: list[str], reps: int, raw: bool,
            triton: bool = True) -> list[dict]:
    import dsa_ops
    from dsa_ops.backends.cuda import topk
    from dsa_ops.benchmarking import capture, time_graph
    from dsa_ops.testing import assert_decode_equivalent

    g = torch.Generator(device="cuda").manual_seed(rows * 31 + length)
    x = torch.randn(rows, width, device="cuda", generator=g)
    lens = torch.full((rows,), length, dtype=torch.int32, device="cuda")
    out = torch.empty(rows, 2048, dtype=torch.int32, device="cuda")
    want = dsa_ops.topk_decode(x, lens, 2048, backend="reference", stable=True)
    calls = {}
    phases = {}
    for v in variants:
        p, prog = _plan(v, rows, width)
        name = f"cuda {v} ({_shape(p)})"
        o = _ordered(v)
        calls[name] = (lambda p=p, prog=prog, o=o: topk.launch(x, lens, lens, lens, 0, 1, 2048, out, plan=p,
                                                               program=prog, ordered=o), True if o else "any")
        stamped = _program(v.partition("@")[2], profile=1)  # the same build with phase stamps
        phases[name] = (lambda dbg, p=p, prog=stamped, o=o: topk.launch(x, lens, lens, lens, 0, 1, 2048, out, plan=p,
                                                                         program=prog, stamps=dbg, ordered=o),
                        rows * p.cluster,
                        isinstance(p, topk.SoloPlan), p.cluster if isinstance(p, topk.SplitPlan) else 0)
    if triton:
        calls["triton"] = (lambda: dsa_ops.topk_decode(x, lens, 2048, backend="triton", out=out), False)
    if raw and rows <= 64:
        from dsa_ops.commands import bench_raw

        calls["cooperative:raw"] = (bench_raw.raw_call("vllm_cooperative:raw", x, lens, 2048, out), None)
    recs = []
    for name, (call, exact) in calls.items():
        graph = capture(call)
        out.fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        if exact == "any":
            status = _conforms(assert_decode_equivalent, out, x, lens, 2048)
        elif exact:
            status = _same(out, want)
        elif exact is None:
            status = "ok" if bool((out.sort(1).values == want.sort(1).values).all()) else "differs (not exact)"
        else:
            status = "ok" if bool((out.sort(1).values == want.sort(1).values).all()) else "FAIL"
        t = time_graph(call, reps=reps, graph=graph)
        ph = _phases(*phases[name]) if name in phases else ""
        recs.append({"family": "decode", "rows": rows, "width": width, "length": length, "name": name,
                     "median_us": t.median, "p10_us": t.quantile(0.1), "p90_us": t.quantile(0.9), "check": status,
                     "phases_kcycles": ph})
        print(f"decode {rows:>3} x {length:>7} W {width:>7}  {name:<34} {t.median:8.1f} us  {status}  {ph}",
              file=sys.stderr, flush=True)
    return recs


def _prefill(chunk: int, variants: list[str], reps: int, others: list[str]) -> list[dict]:
    import dsa_ops
    from dsa_ops.backends.cuda import topk
    from dsa_ops.benchmarking import time_eager
    from dsa_ops.testing import assert_prefill_equivalent

    rows = 16384
    g = torch.Generator(device="cuda").manual_seed(chunk)
    x = torch.randn(rows, chunk, device="cuda", generator=g)
    s = torch.zeros(rows, dtype=torch.int32, device="cuda")
    e = torch.arange(rows, dtype=torch.int32, device="cuda") + (chunk - rows + 1)
    out = torch.empty(rows, 2048, dtype=torch.int32, device="cuda")
    sub = torch.arange(0, rows, 509, device="cuda")
    want = dsa_ops.topk_prefill(x[sub], s[sub], e[sub], 2048, backend="reference", stable=True)
    calls = {}
    phases = {}
    for v in variants:
        p, prog = _plan(v, rows, chunk)
        name = f"cuda {v} ({_shape(p)})"
        o = _ordered(v)
        calls[name] = (lambda p=p, prog=prog, o=o: topk.launch(x, s, s, e, 2, 1, 2048, out, plan=p, program=prog,
                                                               ordered=o), True if o else "any")
        stamped = _program(v.partition("@")[2], profile=1)
        phases[name] = (lambda dbg, p=p, prog=stamped, o=o: topk.launch(x, s, s, e, 2, 1, 2048, out, plan=p,
                                                                         program=prog, stamps=dbg, ordered=o),
                        rows * p.cluster, isinstance(p, topk.SoloPlan))
    for o in others:
        calls[o] = (lambda o=o: dsa_ops.topk_prefill(x, s, e, 2048, backend=o, out=out), False)
    recs = []
    for name, (call, exact) in calls.items():
        call()
        torch.cuda.synchronize()
        got = out[sub]
        status = _conforms(assert_prefill_equivalent, got, x[sub], s[sub], e[sub], 2048) if exact == "any" else \
            _same(got, want) if exact else (
            "ok" if bool((got.sort(1).values == want.sort(1).values).all()) else "differs")
        t = time_eager(call, reps=reps, warmup=1)
        ph = _phases(*phases[name]) if name in phases else ""
        recs.append({"family": "prefill", "rows": rows, "width": chunk, "name": name, "median_us": t.median,
                     "check": status, "phases_kcycles": ph})
        print(f"prefill C {chunk:>7}  {name:<28} {t.median:10.1f} us  {status}  {ph}", file=sys.stderr, flush=True)
    del x
    return recs


PASSED = ("ok", "ok (any order)", "differs (not exact)", "differs")  # "differs": a backend not held to bytes


def all_ok(recs: list[dict]) -> bool:
    """Every timed output passed its check (a FAIL from any variant fails the run)."""
    return all(r["check"] in PASSED for r in recs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="cuda-variants.json")
    p.add_argument("--rows", default="1,8,16,64")
    p.add_argument("--widths", default="133120")
    p.add_argument("--lengths", default="4096,32768,131072")
    p.add_argument("--decode-variants", default="auto")
    p.add_argument("--prefill-c", default="16384,32768,65536,131072")
    p.add_argument("--prefill-variants", default="auto")
    p.add_argument("--prefill-others", default="triton,vllm", help="other backends timed on prefill")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--no-raw", action="store_true")
    p.add_argument("--no-triton", action="store_true", help="leave the triton backend out of the decode points")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("cuda_topk_variants: needs a CUDA device", file=sys.stderr)
        return 2
    import dsa_ops

    raw = not a.no_raw and dsa_ops.backends()["vllm_cooperative"].availability().ok
    others = [o for o in a.prefill_others.split(",") if o and dsa_ops.backends()[o].availability().ok]
    t0 = time.time()
    recs: list[dict] = []
    for w in [int(v) for v in a.widths.split(",") if v]:
        for r in [int(v) for v in a.rows.split(",") if v]:
            for n in [int(v) for v in a.lengths.split(",") if v]:
                recs += _decode(r, w, min(n, w), a.decode_variants.split(","), a.reps, raw, not a.no_triton)
    for c in [int(v) for v in a.prefill_c.split(",") if v]:
        recs += _prefill(c, a.prefill_variants.split(","), 3, others)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "seconds": round(time.time() - t0, 1)}
    with open(a.out, "w") as f:
        json.dump({"meta": meta, "records": recs}, f, indent=1)
    return 0 if all_ok(recs) else 1


if __name__ == "__main__":
    sys.exit(main())
