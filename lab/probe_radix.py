"""Device probe for the triton backend's kernels: check against the reference, then time
variants (graph replay, L2 flushed, median of 30). Writes JSON to argv[1]:
``python -m lab.probe_radix OUT.json [SECTIONS]``.

Sections (argv[2], comma list): smoke, check, paths, phases, decode, sweep, prefill, prefill_var,
stable, occupancy, rowknobs, readabl, wagg, waggrow, rowphase, warps2, lanes, lanesrule, addr, lanestep, lanestep2, lanestep3, warm, splitlanes, finisher, splitslots, warps2lanes. ``paths``
records which way the bracket went per row (kernel stats) on several data distributions.
"""

from __future__ import annotations

from lab import help_requested

help_requested(__doc__)

import json
import sys
import time

import torch

from dsa_ops.backends.triton import launch as pivot
from dsa_ops.backends.triton import radix_launch as radix
from dsa_ops.benchmarking import time_eager, time_graph
from dsa_ops.testing import assert_decode_equivalent, assert_prefill_equivalent

K = 2048
OUT = sys.argv[1]
SECTIONS = sys.argv[2].split(",") if len(sys.argv) > 2 else ["smoke", "check", "paths", "decode", "prefill", "stable"]
res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def save():
    json.dump(res, open(OUT, "w"), indent=1)


def lens_for(rows, L, gen):
    if L == "mixed":
        v = torch.randint(2048, 131073, (rows,), generator=gen)
        v[0] = 0
        if rows > 2:
            v[1] = 100
        return v.to(torch.int32).cuda()
    return torch.full((rows,), L, dtype=torch.int32, device="cuda")


def run_radix(x, lt, out, stable=False, **kw):
    radix.launch(x, lt, lt, lt, K, 1, False, stable, out, **kw)


def causal_chunk(R, C):
    """Starts, ends and an output for one R-row causal chunk (row r ends at C - R + r + 1)."""
    s = torch.zeros(R, dtype=torch.int32, device="cuda")
    e = torch.arange(R, dtype=torch.int32, device="cuda") + (C - R + 1)
    return s, e, torch.empty(R, K, dtype=torch.int32, device="cuda")


def time_prefill(fn, x, s, e, out):
    """Check three rows of fn's output against the reference, then its eager median (ms).
    A variant that fails to build or to match gets the error's text instead, and the
    section goes on (device time is scarce)."""
    try:
        fn()
        idx = torch.tensor([0, 5000, x.shape[0] - 1], device="cuda")
        assert_prefill_equivalent(out[idx], x[idx], s[idx], e[idx], K)
    except Exception as err:  # noqa: BLE001 - recorded, and printed by the caller's log
        return f"error: {type(err).__name__}: {str(err)[:300]}"
    return round(time_eager(fn, reps=3, warmup=1).median / 1000, 2)


def phase_ns(st):
    """(rows, 7) global-timer ns between the 8 ticks of a (rows, 10) timing stats tensor."""
    t = st[:, 2:].long()
    return ((t[:, 1:] - t[:, :-1]) % (1 << 32)).float()


gen = torch.Generator().manual_seed(0)
if "smoke" in SECTIONS:
    x = torch.randn(2, 133120, device="cuda")
    lt = torch.tensor([131072, 5000], dtype=torch.int32, device="cuda")
    out = torch.empty(2, K, dtype=torch.int32, device="cuda")
    run_radix(x, lt, out)
    torch.cuda.synchronize()
    assert_decode_equivalent(out, x, lt, K)
    log("smoke ok", radix.plan(2, 133120, x.device))

VARIANTS = [("default", {}), ("bracket on", dict(bracket=True)), ("bracket on, per-key slots, two stores",
            dict(bracket=True, wagg=False, pack=False)),
            ("bracket on, prefetch 2", dict(bracket=True, prefetch=2)), ("no bracket", dict(bracket=False))]
if "check" in SECTIONS:
    n = 0
    t0 = time.time()
    for width in (133120, 1048576):
        x0 = torch.randn(128, width, device="cuda")
        for rows in (1, 8, 16, 64, 128):
            x = x0[:rows]
            for L in (4096, 32768, 131072, "mixed"):
                lt = lens_for(rows, L, gen)
                for stable in (False, True):
                    out = torch.full((rows, K), -7, dtype=torch.int32, device="cuda")
                    run_radix(x, lt, out, stable)
                    idx = torch.unique(torch.linspace(0, rows - 1, steps=min(rows, 6)).round().long()).cuda()
                    assert_decode_equivalent(out[idx], x[idx], lt[idx], K, stable=stable)
                    n += 1
    from tests.data import logits as mk
    for kind in ("ties", "equal", "specials"):
        x = mk(torch.Generator().manual_seed(3), 4, 200_000, kind).cuda()
        lt = torch.tensor([200_000, 150_000, 2049, 70_000], dtype=torch.int32, device="cuda")
        for stable in (False, True):
            out = torch.full((4, K), -7, dtype=torch.int32, device="cuda")
            run_radix(x, lt, out, stable)
            assert_decode_equivalent(out, x, lt, K, stable=stable)
            n += 1
    for name, kw in VARIANTS:
        for width, rows, L in ((133120, 1, 131072), (133120, 16, "mixed"), (133120, 64, 131072), (1048576, 8, 4096)):
            x = torch.randn(rows, width, device="cuda")
            lt = lens_for(rows, L, gen)
            for stable in (False, True):
                out = torch.full((rows, K), -7, dtype=torch.int32, device="cuda")
                run_radix(x, lt, out, stable, **kw)
                idx = torch.unique(torch.linspace(0, rows - 1, steps=min(rows, 6)).round().long()).cuda()
                assert_decode_equivalent(out[idx], x[idx], lt[idx], K, stable=stable)
                n += 1
    res["check"] = {"cases": n, "seconds": round(time.time() - t0, 1)}
    log("check ok", res["check"])
    save()

SHAPES = [(133120, 1), (133120, 8), (133120, 16), (133120, 64), (1048576, 8)]


def dist(name, rows, width, g):
    """Row data of a few shapes of distribution (the bracket's sample must place the k-th)."""
    x = torch.randn(rows, width, generator=g)
    if name == "uniform":
        x = torch.rand(rows, width, generator=g)
    elif name == "lognormal":
        x = torch.exp(2 * x)
    elif name == "relu-sum":  # weighted ReLU scores, as the indexer makes them
        x = torch.relu(x).pow(2) * 3 + torch.relu(torch.randn(rows, width, generator=g))
    elif name == "bf16":
        x = x.bfloat16().float()
    return x.cuda()


if "paths" in SECTIONS:
    pr = []
    g = torch.Generator().manual_seed(11)
    for name in ("normal", "uniform", "lognormal", "relu-sum", "bf16"):
        for width, rows, L in ((133120, 64, 4096), (133120, 64, 32768), (133120, 64, 131072), (1048576, 8, 1048576)):
            x = dist(name, rows, width, g)
            lt = lens_for(rows, L, gen)
            out = torch.full((rows, K), -7, dtype=torch.int32, device="cuda")
            st = torch.full((rows, 2), -1, dtype=torch.int32, device="cuda")
            run_radix(x, lt, out, stats=st, bracket=True)
            assert_decode_equivalent(out, x, lt, K)
            path = st[:, 0].cpu()
            pr.append({"dist": name, "W": width, "rows": rows, "L": L,
                       "paths": {int(v): int((path == v).sum()) for v in path.unique()},
                       "window_mean": round(float(st[:, 1].float().mean()), 1), "window_max": int(st[:, 1].max())})
            log(pr[-1])
    R, C = 4096, 131072
    x = dist("normal", R, C, g)
    s, e, out = causal_chunk(R, C)
    st = torch.full((R, 2), -1, dtype=torch.int32, device="cuda")
    radix.launch(x, s, s, e, K, 1, True, False, out, stats=st)
    path = st[:, 0].cpu()
    pr.append({"dist": "normal prefill rows", "rows": R, "C": C,
               "paths": {int(v): int((path == v).sum()) for v in path.unique()},
               "window_mean": round(float(st[:, 1].float().mean()), 1), "window_max": int(st[:, 1].max())})
    log(pr[-1])
    res["paths"] = pr
    save()
    del x
PHASES = ["sample", "bracket read", "barrier", "choose", "passes", "emit", "rank"]
if "phases" in SECTIONS:  # global-timer ns of the reporting program (r, 0) (after the arrival: the
    # finisher) between the bracket's phases (median of 15, L2 flushed)
    from dsa_ops.benchmarking import flush_buffer
    fb = flush_buffer(torch.device("cuda"))
    ph = []
    for width, rows, L in ((133120, 1, 4096), (133120, 1, 131072), (133120, 8, 131072), (133120, 16, 131072),
                           (133120, 64, 4096), (133120, 64, 131072), (1048576, 8, 131072)):
        x = torch.randn(rows, width, device="cuda")
        lt = lens_for(rows, L, gen)
        out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
        samples = []
        for _ in range(15):
            st = torch.zeros((rows, 10), dtype=torch.int32, device="cuda")
            fb.fill_(1)
            run_radix(x, lt, out, stats=st, bracket=True)
            torch.cuda.synchronize()
            samples.append(phase_ns(st))
        d = torch.stack(samples).median(dim=0).values  # (rows, 7)
        rec = {"W": width, "rows": rows, "L": L, "ns row 0": dict(zip(PHASES, d[0].int().tolist())),
               "ns max over rows": dict(zip(PHASES, d.max(dim=0).values.int().tolist())),
               "total row 0": int(d[0].sum())}
        log(rec)
        ph.append(rec)
    res["phases"] = ph
    save()

if "decode" in SECTIONS:
    rows_out = []
    for width, rows in SHAPES:
        x = torch.randn(rows, width, device="cuda")
        for L in (4096, 32768, 131072):
            lt = lens_for(rows, L, gen)
            out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
            rec = {"W": width, "rows": rows, "L": L}
            for name, kw in VARIANTS:
                rec[name] = round(time_graph(lambda: run_radix(x, lt, out, **kw)).median, 1)
            log(rec)
            rows_out.append(rec)
    res["decode"] = rows_out
    save()

if "sweep" in SECTIONS:  # where the bracket pays, by batch and live length (split mode)
    sw = []
    for width, rows in [(133120, r) for r in (1, 2, 4, 8, 16, 32, 64)] + [(1048576, 8)]:
        x = torch.randn(rows, width, device="cuda")
        out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
        for L in (4096, 8192, 16384, 32768, 65536, 131072):
            lt = lens_for(rows, L, gen)
            rec = {"W": width, "rows": rows, "L": L}
            for name, kw in (("on", dict(bracket=True)), ("off", dict(bracket=False))):
                rec[name] = round(time_graph(lambda: run_radix(x, lt, out, **kw)).median, 1)
            log(rec)
            sw.append(rec)
    res["sweep"] = sw
    save()

if "stable" in SECTIONS:
    st = []
    for width, rows in SHAPES[:3]:
        x = torch.randn(rows, width, device="cuda")
        for L in (4096, 131072):
            lt = lens_for(rows, L, gen)
            out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
            st.append({"W": width, "rows": rows, "L": L,
                       "radix stable": round(time_graph(lambda: run_radix(x, lt, out, True)).median, 1),
                       "radix": round(time_graph(lambda: run_radix(x, lt, out)).median, 1)})
            log(st[-1])
    res["stable"] = st
    save()

PREFILL_VARIANTS = [("default", {}), ("no bracket", dict(bracket=False))]
if "prefill" in SECTIONS:
    pre = []
    R = 16384
    for C in (16384, 32768, 65536, 131072):
        x = torch.randn(R, C, device="cuda")
        s, e, out = causal_chunk(R, C)
        rec = {"C": C}
        for name, fn in [("pivot cap=C/2", lambda: pivot.launch(x, s, s, e, K, 1, True, False, out))] + [
                (f"radix rows {n}", lambda kw=kw: radix.launch(x, s, s, e, K, 1, True, False, out, **kw))
                for n, kw in PREFILL_VARIANTS]:
            rec[name] = time_prefill(fn, x, s, e, out)
        log(rec)
        pre.append(rec)
        del x
    res["prefill_ms"] = pre
    save()
if "prefill_var" in SECTIONS:  # row-mode knobs, and where a prefill row's time goes
    pv = []
    R = 16384
    kinds = [("default", {}), ("prefetch 1", dict(prefetch=1)), ("samp 256", dict(samp=256)),
             ("prefetch 1, samp 256", dict(prefetch=1, samp=256)), ("prefetch 1, samp 256, solo emit off",
                                                                     dict(prefetch=1, samp=256, solo_emit=False))]
    for C in (16384, 131072):
        x = torch.randn(R, C, device="cuda")
        s, e, out = causal_chunk(R, C)
        st = torch.zeros((R, 10), dtype=torch.int32, device="cuda")
        radix.launch(x, s, s, e, K, 1, True, False, out, stats=st)
        torch.cuda.synchronize()
        d = phase_ns(st)
        ok = (st[:, 0] == 1)
        rec = {"C": C, "rows bracketed": int(ok.sum()),
               "ns median over bracketed rows": dict(zip(PHASES, d[ok].median(dim=0).values.int().tolist())),
               "row ns median": int(d[ok].sum(dim=1).median())}
        for name, kw in kinds:
            rec[name] = time_prefill(lambda kw=kw: radix.launch(x, s, s, e, K, 1, True, False, out, **kw),
                                     x, s, e, out)
        log(rec)
        pv.append(rec)
        del x
    res["prefill_var"] = pv
    save()
def row_phases(x, s, e, out, kw, paths=(1, 2, 3)):
    """Median global-timer ns of each phase over the rows whose bracket path is in ``paths``,
    and the median row total (one row-mode launch with timing stats)."""
    st = torch.zeros((x.shape[0], 10), dtype=torch.int32, device="cuda")
    radix.launch(x, s, s, e, K, 1, True, False, out, stats=st, **kw)
    torch.cuda.synchronize()
    d = phase_ns(st)
    ok = torch.isin(st[:, 0], torch.tensor(paths, dtype=torch.int32, device="cuda"))
    return dict(zip(PHASES, d[ok].median(dim=0).values.int().tolist())), int(d[ok].sum(dim=1).median())


def prefill_knobs(chunks, kinds, phases_at=(), phased=0, paths=(1, 2, 3)):
    """One 16384-row causal chunk per C in ``chunks``: each (name, launch keywords) of
    ``kinds`` checked and timed (ms); at the C in ``phases_at`` also the phases of the first
    ``phased`` kinds."""
    recs = []
    R = 16384
    for C in chunks:
        x = torch.randn(R, C, device="cuda")
        s, e, out = causal_chunk(R, C)
        rec = {"C": C}
        for name, kw in kinds:
            rec[name] = time_prefill(lambda kw=kw: radix.launch(x, s, s, e, K, 1, True, False, out, **kw), x, s, e, out)
        if C in phases_at:
            for name, kw in kinds[:phased]:
                if not isinstance(rec[name], str):
                    rec[f"phases {name}"], rec[f"row ns median {name}"] = row_phases(x, s, e, out, kw, paths)
        log(rec)
        recs.append(rec)
        del x
        torch.cuda.empty_cache()
    return recs


def decode_knobs(shapes, kinds):
    """Each (W, rows, L) of ``shapes`` under each (name, launch keywords) of ``kinds``:
    checked against the reference, then timed (us) in two interleaved rounds, whose spread
    is the noise."""
    recs = []
    for width, rows, L in shapes:
        x = torch.randn(rows, width, device="cuda")
        lt = lens_for(rows, L, gen)
        out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
        rec = {"W": width, "rows": rows, "L": L}
        for name, kw in kinds:
            run_radix(x, lt, out, **kw)
            assert_decode_equivalent(out, x, lt, K)
        for rnd in range(2):
            for name, kw in kinds:
                rec.setdefault(name, []).append(round(time_graph(lambda: run_radix(x, lt, out, **kw)).median, 1))
        log(rec)
        recs.append(rec)
    return recs


ALL_C = (16384, 32768, 65536, 131072)
if "occupancy" in SECTIONS:  # more programs per multiprocessor through fewer registers a thread
    res["occupancy"] = {
        "prefill_ms": prefill_knobs(ALL_C, [("default (80 regs, 6/SM)", {}), ("128 regs, 4/SM", dict(maxnreg=128, per_sm=4)),
                                            ("96 regs, 5/SM", dict(maxnreg=96, per_sm=5)),
                                            ("64 regs, 8/SM", dict(maxnreg=64, per_sm=8))],
                                    phases_at=(131072,), phased=2, paths=(1,)),
        "decode_us": decode_knobs(((133120, 16, 131072), (133120, 64, 32768), (133120, 64, 131072)),
                                  (("default", {}), ("96 regs, 5/SM", dict(maxnreg=96, per_sm=5)),
                                   ("80 regs, 6/SM", dict(maxnreg=80, per_sm=6))))}
    save()
if "rowknobs" in SECTIONS:  # row mode: sample size with the occupancy trade
    res["rowknobs"] = {"prefill_ms": prefill_knobs(
        (32768, 131072), [("default", {}), ("samp 1024", dict(samp=1024)), ("64 regs, 8/SM", dict(maxnreg=64, per_sm=8)),
                          ("64 regs, 8/SM, samp 1024", dict(maxnreg=64, per_sm=8, samp=1024))])}
    save()
if "readabl" in SECTIONS:  # the bracket read without window bins (rows radix their gathered keys)
    res["readabl"] = {
        "prefill_ms": prefill_knobs((16384, 32768, 131072),
                                    [("default", {}), ("bins off", dict(bins=False)), ("64 regs, 8/SM", dict(maxnreg=64, per_sm=8)),
                                     ("64 regs, 8/SM, bins off", dict(maxnreg=64, per_sm=8, bins=False))],
                                    phases_at=(131072,), phased=2),
        "decode_us": decode_knobs(((133120, 1, 131072), (133120, 64, 131072), (1048576, 8, 131072)),
                                  (("default", {}), ("bins off", dict(bins=False))))}
    save()
if "wagg" in SECTIONS:  # the bracket read's L2 requests: per-warp slot atomics, one int64 store a key
    res["wagg"] = {
        "prefill_ms": prefill_knobs(ALL_C, [("default", {}), ("per-key slots, two stores (before)", dict(wagg=False, pack=False)),
                                            ("per-key slots", dict(wagg=False)), ("two stores", dict(pack=False)),
                                            ("64 regs, 8/SM", dict(maxnreg=64, per_sm=8)),
                                            ("128 regs, 4/SM", dict(maxnreg=128, per_sm=4))],
                                    phases_at=(131072,), phased=2),
        "decode_us": decode_knobs(((133120, 1, 131072), (133120, 32, 131072), (133120, 64, 131072), (1048576, 8, 131072)),
                                  (("default", {}), ("before", dict(wagg=False, pack=False))))}
    save()
if "waggrow" in SECTIONS:  # row mode at 64 x 8: warp-aggregated slots for every row or only shorter ones
    res["waggrow"] = {"prefill_ms": prefill_knobs(
        (131072, 65536), [("default", {}), ("wagg below 100000", dict(wagg_max=100000)), ("wagg off", dict(wagg=False)),
                          ("80 regs, 6/SM", dict(maxnreg=80, per_sm=6))])}
    save()
if "rowphase" in SECTIONS:  # row mode as shipped (64 x 8, wagg, packed): phases, and three knobs
    res["rowphase"] = {"prefill_ms": prefill_knobs(
        (16384, 131072), [("default", {}), ("samp 1024", dict(samp=1024)), ("prefetch 2", dict(prefetch=2)),
                          ("nbw 512", dict(nbw=512))], phases_at=(16384, 131072), phased=1)}
    save()
if "lanes" in SECTIONS:  # row mode: lane regions (slots counted in registers) against the warp-aggregated slot atomics
    res["lanes"] = {
        "prefill_ms": prefill_knobs(ALL_C, [("lanes (default)", {}), ("wagg slots (before)", dict(lanes=False)),
                                            ("lanes, 80 regs 6/SM", dict(maxnreg=80, per_sm=6)),
                                            ("lanes, 128 regs 4/SM", dict(maxnreg=128, per_sm=4)),
                                            ("lanes, 80 regs 6/SM, bins after the read",
                                             dict(maxnreg=80, per_sm=6, postbins=True))],
                                    phases_at=(16384, 131072), phased=3, paths=(1,)),
        "decode_us": decode_knobs(((133120, 512, 131072), (133120, 512, "mixed")),
                                  (("default (row mode: lanes)", {}), ("wagg slots", dict(lanes=False))))}
    save()
if "lanesrule" in SECTIONS:  # launch_plan's lane rule against the warp-aggregated slots; split-mode lanes
    res["lanesrule"] = {
        "prefill_ms": prefill_knobs(ALL_C, [("default (rule)", {}), ("no lanes", dict(lanes=False))]),
        "decode_us": decode_knobs(((133120, 512, 131072), (1048576, 300, 131072), (133120, 64, 32768),
                                   (133120, 64, 131072), (1048576, 64, 131072)),
                                  (("default (rule)", {}), ("lanes", dict(lanes=True)), ("no lanes", dict(lanes=False))))}
    save()
if "addr" in SECTIONS:  # the build under test as it ships (run twice: this tree, and an older one on PYTHONPATH)
    res["addr"] = {
        "prefill_ms": prefill_knobs(ALL_C, [("default", {})], phases_at=(16384, 131072), phased=1, paths=(1,)),
        "decode_us": decode_knobs(((133120, 512, 131072), (1048576, 300, 131072), (133120, 1, 131072),
                                   (133120, 64, 131072)), (("default", {}),))}
    save()


def lane_variant(regs, per_sm, step, prefetch=True, **more):
    """(name, launch keywords) of a lane-read launch with the bins after the read, at
    ``regs`` registers x ``per_sm`` programs a multiprocessor and ``step`` blocks a step."""
    kw = dict(lanes=True, postbins=True, maxnreg=regs, per_sm=per_sm, lane_step=step, **more)
    if not prefetch:
        kw["lane_prefetch"] = False
    return f"{regs}x{per_sm} step {step}" + ("" if prefetch else ", no prefetch"), kw


if "lanestep" in SECTIONS:  # lane read: keys in flight a program (blocks a step, prefetch), with the register shapes
    res["lanestep"] = {
        "prefill_ms": prefill_knobs((32768, 65536, 131072), [
            ("default (rule)", {}), lane_variant(80, 6, 2), lane_variant(80, 6, 2, False), lane_variant(80, 6, 4, False),
            lane_variant(64, 8, 2), lane_variant(128, 4, 2), lane_variant(128, 4, 4)],
            phases_at=(131072,), phased=2, paths=(1,)),
        "decode_us": decode_knobs(((133120, 512, 131072), (1048576, 300, 131072)),
                                  (("default", {}), ("step 2", dict(lane_step=2)),
                                   ("step 2, no prefetch", dict(lane_step=2, lane_prefetch=False))))}
    save()
if "lanestep2" in SECTIONS:  # lane read: more keys a step at 128, 96 and 80 registers
    res["lanestep2"] = {
        "prefill_ms": prefill_knobs((32768, 65536, 131072), [
            ("default (rule)", {}), lane_variant(128, 4, 4), lane_variant(128, 4, 4, False),
            lane_variant(128, 4, 8, False), lane_variant(96, 5, 4), lane_variant(96, 5, 4, False),
            lane_variant(80, 6, 4, False)],
            phases_at=(131072,), phased=2, paths=(1,))}
    save()
if "lanestep3" in SECTIONS:  # the shipped wide-row lane read (128 x 4, four blocks a step) with a larger sample; 64K
    res["lanestep3"] = {
        "prefill_ms": prefill_knobs((65536, 131072), [
            ("default (rule)", {}), ("samp 1024", dict(samp=1024)),
            ("lanes 128x4 step 4", lane_variant(128, 4, 4)[1]),
            ("lanes 128x4 step 4, samp 1024", lane_variant(128, 4, 4, samp=1024)[1])],
            phases_at=(131072,), phased=2, paths=(1,))}
    save()
if "warm" in SECTIONS:  # decode with the L2 flushed before each replay (the bench) and without: what cold code and data cost
    import triton

    @triton.jit
    def _empty(x):
        pass

    buf = torch.zeros(1, device="cuda")
    wr = {"empty triton kernel": [round(time_graph(lambda: _empty[(1,)](buf), flush=f).median, 1) for f in (True, False)]}
    for width, rows, L in ((133120, 1, 1000), (133120, 1, 4096), (133120, 1, 32768), (133120, 1, 131072),
                           (133120, 16, 131072), (133120, 64, 4096), (133120, 64, 131072), (1048576, 8, 131072)):
        x = torch.randn(rows, width, device="cuda")
        lt = lens_for(rows, L, gen)
        out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
        run_radix(x, lt, out)
        assert_decode_equivalent(out, x, lt, K)
        wr[f"{rows} x {width}, L {L}"] = [round(time_graph(lambda: run_radix(x, lt, out), flush=f).median, 1)
                                          for f in (True, False, True, False)]
        log(list(wr.items())[-1])
    res["warm"] = {"note": "us, graph replay, median of 30: [flushed, warm, flushed, warm]", **wr}
    log(res["warm"])
    save()
if "warps2" in SECTIONS:  # row mode: two-warp programs of 512-key blocks, twice as many a multiprocessor
    res["warps2"] = {"prefill_ms": prefill_knobs(
        ALL_C, [("default", {}), ("2 warps, 16/SM, 64 regs", dict(num_warps=2, block=512, per_sm=16, maxnreg=64)),
                ("2 warps, 12/SM, 80 regs", dict(num_warps=2, block=512, per_sm=12, maxnreg=80))])}
    save()
if "splitlanes" in SECTIONS:  # split mode (decode batches): lane regions with several blocks a read step, or
    # two blocks in flight in the slot-counter read (the 64-row read phase ran at ~1.4 TB/s in run 20)
    res["splitlanes"] = {"decode_us": decode_knobs(
        ((133120, 64, 32768), (133120, 64, 131072), (1048576, 64, 131072), (133120, 32, 131072),
         (133120, 16, 131072), (133120, 64, "mixed")),
        (("default", {}), ("lanes step 1", dict(lanes=True)), ("lanes step 2", dict(lanes=True, lane_step=2)),
         ("lanes step 4", dict(lanes=True, lane_step=4)),
         ("lanes step 4, postbins", dict(lanes=True, lane_step=4, postbins=True)),
         ("prefetch 2", dict(prefetch=2))))}
    save()
if "finisher" in SECTIONS:  # split mode: the last program to arrive after the read finishes the row alone (no
    # barriers), re-measured since the read counts the window bins (run 20's finisher counted them itself)
    res["finisher"] = {"decode_us": decode_knobs(
        ((133120, 1, 32768), (133120, 1, 131072), (133120, 8, 131072), (133120, 16, 131072),
         (1048576, 8, 131072), (1048576, 1, 131072), (133120, 16, "mixed")),
        (("default", {}), ("finisher", dict(finisher=True)), ("unpacked, no finisher", dict(pack=False))))}
    save()
if "splitslots" in SECTIONS:  # split mode: the bracket read's slots (a returning atomic a block and warp) off the
    # critical path: stored a block later (pipe), per-key atomics, or a block scan (no atomic: each program has its
    # own region)
    res["splitslots"] = {"decode_us": decode_knobs(
        ((133120, 64, 32768), (133120, 64, 131072), (1048576, 64, 131072), (133120, 32, 131072),
         (133120, 16, 131072), (133120, 1, 131072), (133120, 64, "mixed")),
        (("default", {}), ("pipe", dict(pipe=True)), ("pipe, prefetch 2", dict(pipe=True, prefetch=2)),
         ("per-key atomics", dict(wagg=False)), ("block scan", dict(catom=False))))}
    save()
if "warps2lanes" in SECTIONS:  # wide chunks: two-warp lane programs at 128 registers, 8 a multiprocessor (twice
    # the rows in progress at the same bytes in flight a multiprocessor, cheaper CTA-wide steps)
    w2 = dict(num_warps=2, block=512, per_sm=8, maxnreg=128, lanes=True, postbins=True, lane_step=4)
    res["warps2lanes"] = {"prefill_ms": prefill_knobs(
        (65536, 131072), [("default", {}), ("2 warps x 8, step 4", w2), ("2 warps x 8, step 4, nbw 1024", dict(w2, nbw=1024)),
                          ("2 warps x 8, step 2", dict(w2, lane_step=2))],
        phases_at=(131072,), phased=3, paths=(1,))}
    save()
log("done")
