"""Crossover finding of dsa-ops calibrate, on synthetic timings (no GPU needed)."""

from __future__ import annotations

import json
import random

import pytest

from dsa_ops import calibration as C
from dsa_ops import policy as P

M = C.Measurement


def _decode(fast_small: str, fast_large: str, cut: int) -> list[M]:
    ms = []
    for w in (8192, 133120, 1048576):
        for rows in (1, 16):
            for L in (4096, 131072):
                win = fast_small if w < cut else fast_large
                for b in ("reference", "torch_topk"):
                    ms.append(M("decode", b, rows, L, w, 10.0 if b == win else 30.0))
    return ms


def _prefill(cross: int, short: str = "torch_topk", long: str = "reference") -> list[M]:
    ms = []
    for m in (4096, 16384, 32768, 65536, 131072):
        ms.append(M("prefill", short, 16384, m, m, 100.0 if m < cross else 300.0))
        ms.append(M("prefill", long, 16384, m, m, 200.0))
    return ms


def test_decode_bands_merge_and_split():
    bands = C.decode_bands(_decode("torch_topk", "reference", cut=1_000_000))
    assert [(b.min_width, b.max_width, b.backend) for b in bands] == [
        (0, 1048576, "torch_topk"), (1048576, None, "reference")]
    assert bands[0].points == 8 and bands[0].score == pytest.approx(1.0)
    one = C.decode_bands(_decode("torch_topk", "torch_topk", cut=0))
    assert [(b.min_width, b.max_width, b.backend) for b in one] == [(0, None, "torch_topk")]


@pytest.mark.parametrize("cross", [16384, 32768, 65536])
def test_prefill_threshold_finds_the_crossover(cross):
    thr = C.prefill_threshold(_prefill(cross))
    assert thr.crossover and (thr.threshold, thr.below, thr.above) == (cross, "torch_topk", "reference")
    assert thr.cost == pytest.approx(0.0)


def test_prefill_no_crossover_keeps_one_backend():
    thr = C.prefill_threshold(_prefill(cross=10**9))  # short backend wins everywhere
    assert not thr.crossover and thr.below == thr.above == "torch_topk"


def test_deterministic_under_reordering():
    ms = _decode("torch_topk", "reference", 200000) + _prefill(32768)
    a = C.build_policy(ms, "cuda", "sm_90", {"device": "X"})
    shuffled = ms[:]
    random.Random(1).shuffle(shuffled)
    b = C.build_policy(shuffled, "cuda", "sm_90", {"device": "X"})
    assert a.content_hash() == b.content_hash()


def test_built_policy_loads_and_routes(tmp_path):
    ms = _decode("torch_topk", "reference", 200000) + _prefill(65536)
    pol = C.build_policy(ms, "cpu", "", {"device": "synthetic", "date": "2026-12-02"})
    path = tmp_path / "cal.json"
    P.save(pol, path)
    loaded = P.load(path)
    assert loaded.content_hash() == pol.content_hash()
    assert loaded.prefill_threshold == 65536
    assert json.loads(path.read_text())["meta"]["measurements"]
    f = lambda w: P.facts_for("cpu", 2048, 1, w)  # noqa: E731
    assert loaded.choose("decode", f(133120)).backend == "torch_topk"
    assert loaded.choose("decode", f(1048576)).backend == "reference"
    assert loaded.choose("prefill", f(None), long=loaded.is_long(65535)).backend == "torch_topk"
    assert loaded.choose("prefill", f(None), long=loaded.is_long(65536)).backend == "reference"


def test_incomplete_or_bad_timings_are_rejected():
    with pytest.raises(ValueError, match="every decode point"):
        C.decode_bands([M("decode", "a", 1, 1, 8, 1.0), M("decode", "b", 1, 2, 8, 1.0)])
    with pytest.raises(ValueError, match="non-finite"):
        C.decode_bands([M("decode", "a", 1, 1, 8, float("nan"))])


def test_committed_h200_policy_is_reproducible_from_its_measurements():
    """docs/benchmarks/h200-policy.json: loads, routes CUDA sm_90 to its calibrated rules, and
    rebuilding it from the measurements it stores gives the same policy (same hash)."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "docs", "benchmarks", "h200-policy.json")
    pol = P.load(path)
    meta = pol.meta
    assert meta["device"] == "NVIDIA H200" and meta["measurements"]
    ms = [C.Measurement(**m) for m in meta["measurements"]]
    assert {m.backend for m in ms} == {"reference", "cuda", "triton"}
    rebuilt = C.build_policy(ms, meta["platform"], meta["arch"],
                             {k: v for k, v in meta.items() if k not in ("measurements", "decode_bands", "prefill")})
    assert rebuilt.content_hash() == pol.content_hash()
    facts = P.Facts("cuda", "sm_90", "cuda", 2048, 1, 133120)
    assert [r.backend for r in pol.decode if r.matches(facts)][0] == "cuda"
    for long, want in ((False, "cuda"), (True, "cuda")):
        assert [r.backend for r in pol.prefill if r.matches(facts, long)][0] == want


def test_calibrate_measures_decode_only_backends_on_decode_points_only(monkeypatch):
    """vllm_persistent / vllm_cooperative have no prefill op: calibrate must not time them there."""
    import dataclasses

    import dsa_ops
    from dsa_ops.backends import BACKENDS
    from dsa_ops.backends.base import YES
    from dsa_ops.commands import calibrate

    both = dataclasses.replace(dsa_ops.backends.get("reference"), name="cal_both_double", available=lambda: YES,
                               supports=lambda q: YES, test_only=True, _cache={})
    decode_only = dataclasses.replace(both, name="cal_decode_only_double", prefill=None, _cache={})
    for b in (both, decode_only):
        monkeypatch.setitem(BACKENDS, b.name, b)
    names = [both.name, decode_only.name]
    assert calibrate._serving(names, "decode", 2048, 133120) == names
    assert calibrate._serving(names, "prefill", 2048, 16384) == [both.name]


def test_committed_h200_vllm_policy_is_reproducible_and_routes_to_vllms_kernels():
    """docs/benchmarks/h200-policy-vllm.json (every real backend, exact or not): rebuilt from
    its stored measurements it has the same hash; decode goes to vllm_cooperative, prefill to
    vllm below the measured 128K crossover and to triton at or above it."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pol = P.load(os.path.join(root, "docs", "benchmarks", "h200-policy-vllm.json"))
    meta = pol.meta
    ms = [C.Measurement(**m) for m in meta["measurements"]]
    assert {m.backend for m in ms} == {"triton", "vllm", "vllm_persistent", "vllm_cooperative"}
    rebuilt = C.build_policy(ms, meta["platform"], meta["arch"],
                             {k: v for k, v in meta.items() if k not in ("measurements", "decode_bands", "prefill")})
    assert rebuilt.content_hash() == pol.content_hash()
    assert pol.prefill_threshold == 131072
    for width in (133120, 1048576):
        facts = P.Facts("cuda", "sm_90", "cuda", 2048, 1, width)
        assert [r.backend for r in pol.decode if r.matches(facts)][0] == "vllm_cooperative"
    facts = P.Facts("cuda", "sm_90", "cuda", 2048, 1, 131072)
    assert [r.backend for r in pol.prefill if r.matches(facts, False)][0] == "vllm"
    assert [r.backend for r in pol.prefill if r.matches(facts, True)][0] == "triton"


# ---------------------------------------------------------------- row bands (issue 46)

from dsa_ops import calibration_rows as R  # noqa: E402

ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def _rowed(time_of, widths=(133120, 1048576), lengths=(4096, 32768, 131072), backends=("a", "b", "c"),
           wrong=()) -> list[M]:
    """Synthetic decode timings: ``time_of(backend, rows, L, W)`` us at every point."""
    return [M("decode", b, r, L, w, time_of(b, r, L, w), (b, r, L, w) not in wrong)
            for w in widths for r in ROWS for L in lengths for b in backends]


def _by_rows(b, r, L, w):
    """a wins up to 8 rows, b 16..64, c from 128, at every L and W; where b loses it loses by
    0.5 us (a and c by 5), so b is the best single backend over all rows."""
    win = "a" if r <= 8 else "b" if r <= 64 else "c"
    return 10.0 + r / 8 + (0.0 if b == win else 0.5 if b == "b" else 5.0)


def _spans(bands):
    return [(b.min_width, b.max_width, b.min_rows, b.max_rows, b.backend, b.fallback) for b in bands]


def test_row_bands_merge_adjacent_rows_and_widths_and_add_a_symbolic_fallback():
    bands = R.decode_row_bands(_rowed(_by_rows))
    assert _spans(bands) == [(0, None, 0, 9, "a", False), (0, None, 9, 65, "b", False),
                             (0, None, 65, None, "c", False), (0, None, 0, None, "b", True)]
    assert bands[0].rows == (1, 2, 4, 8) and bands[0].widths == (133120, 1048576)


def test_row_bands_split_widths_whose_winners_differ():
    def t(b, r, L, w):
        return _by_rows(b, r, L, w) if w < 1 << 20 else 10.0 + (0.0 if b == "c" else 5.0)

    assert _spans(R.decode_row_bands(_rowed(t))) == [
        (0, 1048576, 0, 9, "a", False), (0, 1048576, 9, 65, "b", False), (0, 1048576, 65, None, "c", False),
        (0, 1048576, 0, None, "b", True), (1048576, None, 0, None, "c", False)]  # one band: no fallback


def _by_length(b, r, L, w):
    """a: 5 us at 4K, 60 at 128K; b: 20 flat. Equal mix: a 26.7 vs b 20 -> b; mostly-4K mix -> a."""
    if b == "a":
        return {4096: 5.0, 32768: 15.0, 131072: 60.0}[L]
    return 20.0


def test_the_context_mix_decides_what_a_graph_that_cannot_see_L_gets():
    ms = _rowed(_by_length, backends=("a", "b"))
    assert {b.backend for b in R.decode_row_bands(ms)} == {"b"}
    short = R.parse_context_mix("4096:0.8,32768:0.1,131072:0.1")
    assert {b.backend for b in R.decode_row_bands(ms, short)} == {"a"}
    with pytest.raises(ValueError, match=r"the context mix names L = \[65536\]"):
        R.decode_row_bands(ms, {65536: 1.0})


def test_a_backend_wrong_anywhere_at_a_width_is_never_chosen_there():
    fast_but_wrong = lambda b, r, L, w: 1.0 if b == "a" else 10.0 if b == "b" else 20.0  # noqa: E731
    ms = _rowed(fast_but_wrong, wrong={("a", 512, 4096, 133120)})
    bands = R.decode_row_bands(ms)
    assert _spans(bands) == [(0, 1048576, 0, None, "b", False), (1048576, None, 0, None, "a", False)]
    assert all(g.chosen == "b" for g in R.regret(ms, bands) if g.width == 133120)


def test_regret_table_reports_each_shape_and_the_mix_against_an_oracle():
    ms = _rowed(_by_length, widths=(133120,), backends=("a", "b"))
    bands = R.decode_row_bands(ms)
    regrets = {(g.rows, g.length): g for g in R.regret(ms, bands)}
    assert len(regrets) == len(ROWS) * 4
    at4k, at128k, mix = regrets[(8, 4096)], regrets[(8, 131072)], regrets[(8, "mix")]
    assert (at4k.chosen, at4k.best, at4k.regret_us) == ("b", "a", 15.0)
    assert (at128k.best, at128k.regret_us, at128k.ratio) == ("b", 0.0, 1.0)
    assert mix.chosen_us == pytest.approx(20.0) and mix.best_us == pytest.approx((5 + 15 + 20) / 3)
    table = R.regret_table(list(regrets.values()))
    assert "| 133120 | 8 | 4096 | b | 20.0 | a | 5.0 | +15.0 | 4.000 |" in table
    assert "| 133120 | 8 | mix | b | 20.0 | (per-L best) | 13.3 | +6.7 | 1.500 |" in table


@pytest.mark.parametrize("text, error", [
    ("4096", "expected L:weight items"), ("4096:x", "expected L:weight items"), ("0:1", "expected L:weight"),
    ("4096:-1", "expected L:weight"), ("4096:0", "at least one L with a weight above 0"),
    ("4096:1,4096:2", "named twice"), ("", "at least one L"),
])
def test_bad_context_mix(text, error):
    with pytest.raises(ValueError, match=error):
        R.parse_context_mix(text)


def test_context_mix_is_normalised():
    assert R.parse_context_mix("131072:2, 4096:2") == {4096: 0.5, 131072: 0.5}


def test_row_policy_routes_concrete_and_symbolic_rows(tmp_path):
    import dataclasses

    from tests.standins import standin_backend

    with standin_backend("rows_a") as a, standin_backend("rows_b") as b, standin_backend("rows_c") as c:
        name = {"a": a, "b": b, "c": c}
        ms = [dataclasses.replace(m, backend=name[m.backend]) for m in _rowed(_by_rows)] + _prefill(65536)
        pol = R.build_row_policy(ms, "cpu", "", {"device": "synthetic"}, k=2048)
        path = tmp_path / "rows.json"
        P.save(pol, path)
        loaded = P.load(path)
        assert loaded.content_hash() == pol.content_hash() and loaded.meta["method"] == "row-bands"
        assert loaded.meta["regret"] and loaded.meta["context_mix"] == {"4096": 1 / 3, "32768": 1 / 3,
                                                                        "131072": 1 / 3}

        def pick(rows=None, bounds=(0, None), k=2048):
            return loaded.choose("decode", P.facts_for("cpu", k, 1, 133120, rows=rows, rows_bounds=bounds)).backend

        assert [pick(r) for r in (1, 8, 9, 16, 64, 65, 128, 4096)] == [a, a, b, b, b, c, c, c]
        assert pick(bounds=(2, 64)) == b  # straddles a's and b's bands: the fallback
        assert pick(bounds=(9, 64)) == b and pick(bounds=(65, 300)) == c
        assert pick(1, k=64) == "reference"  # calibrated at k = 2048 only: other k take the defaults
        assert loaded.choose("prefill", P.facts_for("cpu", 2048), long=True).backend == "reference"


def test_calibrate_measures_checks_and_keeps_a_killed_runs_data(tmp_path, monkeypatch, capsys):
    """measure() on the CPU with stand-in backends and a fake timer: a wrong output is kept with
    ok=False and reported; the .measurements.jsonl it writes as it goes rebuilds the policy with
    --from-measurements (no GPU), for another backend subset too."""
    import argparse
    import dataclasses

    import dsa_ops
    from dsa_ops import cli
    from dsa_ops.backends import BACKENDS, reference
    from dsa_ops.backends.base import YES
    from dsa_ops.commands import calibrate

    def wrong(logits, lengths, k, next_n, stable, out):
        reference.decode(logits, lengths, k, next_n, stable, out)
        out[:, 0] = -1

    good = dataclasses.replace(dsa_ops.backends.get("reference"), name="cal_good_double", available=lambda: YES,
                               supports=lambda q: YES, test_only=True, _cache={})
    other = dataclasses.replace(good, name="cal_other_double", _cache={})
    bad = dataclasses.replace(good, name="cal_wrong_double", decode=wrong, _cache={})
    from dsa_ops.backends import register

    for b in (good, other, bad):
        BACKENDS.pop(b.name, None)
        register(b)  # ops too (they stay; the registry entries go with monkeypatch below)
        monkeypatch.setitem(BACKENDS, b.name, b)
    args = argparse.Namespace(k=8, reps=1, rows="1,4", widths="300", lengths="100,300", prefill_seqlens="",
                              quick=False, context_mix=None, backends=f"{good.name},{other.name},{bad.name}")
    speed = {good.name: 10.0, other.name: 12.0, bad.name: 1.0}
    sink = tmp_path / "cal.measurements.jsonl"
    lines = []
    ms = calibrate.measure(args, progress=lines.append, timer=_timer_by_op(speed), device="cpu", sink=str(sink),
                           meta={"platform": "cpu", "arch": "", "k": 8})
    assert len(ms) == 2 * 2 * 3 and {m.ok for m in ms if m.backend == bad.name} == {False}
    assert all(m.ok for m in ms if m.backend != bad.name)
    assert any("WRONG (never chosen)" in ln for ln in lines) and lines[0].startswith("calibrate: 12 timings")
    out = tmp_path / "rebuilt.json"
    assert cli.main(["calibrate", "--from-measurements", str(sink), "--out", str(out)]) == 1  # wrong outputs seen
    pol = P.load(out)
    assert [r.backend for r in pol.decode[:1]] == [good.name]
    assert "## Regret" in (tmp_path / "rebuilt.md").read_text()
    capsys.readouterr()
    assert cli.main(["calibrate", "--from-measurements", str(out), "--out", str(tmp_path / "sub.json"),
                     "--backends", other.name]) == 0
    assert P.load(tmp_path / "sub.json").decode[0].backend == other.name


def _timer_by_op(speed: dict):
    """A fake timer: the backend's synthetic time, read from the op the call closes over."""
    def timer(call, family):
        op = next(c.cell_contents for c in call.__closure__ if "dsa_ops" in str(c.cell_contents))
        return next(us for name, us in speed.items() if name in str(op))
    return timer


def test_a_backend_that_raises_is_left_unmeasured_and_the_run_goes_on(monkeypatch):
    import argparse
    import dataclasses

    import dsa_ops
    from dsa_ops.backends import BACKENDS, register
    from dsa_ops.backends.base import YES
    from dsa_ops.commands import calibrate

    def boom(logits, lengths, k, next_n, stable, out):
        raise RuntimeError("kernel launch failed")

    good = dataclasses.replace(dsa_ops.backends.get("reference"), name="cal_fine_double", available=lambda: YES,
                               supports=lambda q: YES, test_only=True, _cache={})
    bad = dataclasses.replace(good, name="cal_raising_double", decode=boom, _cache={})
    for b in (good, bad):
        BACKENDS.pop(b.name, None)
        register(b)
        monkeypatch.setitem(BACKENDS, b.name, b)
    args = argparse.Namespace(k=8, reps=1, rows="2", widths="300", lengths="100", prefill_seqlens="", quick=False,
                              context_mix=None, backends=f"{bad.name},{good.name}")
    lines = []
    ms = calibrate.measure(args, progress=lines.append, timer=lambda call, fam: 5.0, device="cpu")
    assert [m.backend for m in ms] == [good.name]
    assert any("ERROR, not measured: RuntimeError('kernel launch failed')" in ln for ln in lines)


def _with_stock(a_at_4k: float):
    """a: 4K a_at_4k us, 32K 12, 128K 20; b: stock + 0.5 everywhere; stock: 8 / 14 / 30.
    Equal mix: a (4K 12) = 14.7 < b 17.8, but a loses to stock at 4K by a_at_4k - 8."""
    stock = {4096: 8.0, 32768: 14.0, 131072: 30.0}
    a = {4096: a_at_4k, 32768: 12.0, 131072: 20.0}
    ms = []
    for r in (1, 64, 128):
        for L in stock:
            ms += [M("decode", "a", r, L, 133120, a[L]), M("decode", "b", r, L, 133120, stock[L] + 0.5),
                   M("decode", R.STOCK, r, L, 133120, stock[L])]
    return ms


@pytest.mark.parametrize("a_at_4k, tol, want", [
    (12.0, None, "a"),   # no guard: the least expected time
    (12.0, 1.0, "b"),    # a is 4 us over stock at 4K: out; b is within 0.5 everywhere
    (12.0, 5.0, "a"),    # a looser guard lets a back in
    (8.5, 1.0, "a"),     # a within 0.5 of stock at 4K and faster elsewhere
])
def test_the_stock_guard_keeps_backends_within_a_tolerance_of_vllms_own_choice(a_at_4k, tol, want):
    bands = R.decode_row_bands(_with_stock(a_at_4k), stock_tol=tol)
    assert {b.backend for b in bands} == {want}


def test_with_no_backend_within_the_guard_the_least_worst_excess_wins_and_stock_is_never_chosen():
    ms = [m if m.backend == R.STOCK else dataclasses_replace(m, us=m.us + (9.0 if m.backend == "a" else 3.0))
          for m in _with_stock(12.0)]
    assert {b.backend for b in R.decode_row_bands(ms, stock_tol=1.0)} == {"b"}
    assert R.STOCK not in {b.backend for b in R.decode_row_bands(ms)}


def test_regret_reports_stock_and_the_policy_records_the_guard():
    ms = _with_stock(12.0)
    bands = R.decode_row_bands(ms, stock_tol=1.0)
    table = R.regret_table(R.regret(ms, bands))
    assert "| 133120 | 1 | 4096 | b | 8.5 | b | 8.5 | +0.0 | 1.000 | 8.0 | +0.5 |" in table
    assert "| 133120 | 1 | 131072 | b | 30.5 | a | 20.0 | +10.5 | 1.525 | 30.0 | +0.5 |" in table
    with_guard = R.build_row_policy(ms, "cpu", "", {"device": "x"}, stock_tol=1.0)
    assert with_guard.meta["stock_guard_us"] == 1.0 and "within 1 us of stock vLLM" in with_guard.decode[0].why
    assert R.build_row_policy(ms, "cpu", "", {"device": "x"}).meta["stock_guard_us"] is None


def dataclasses_replace(m, **kw):
    import dataclasses

    return dataclasses.replace(m, **kw)


def test_calibrate_times_stock_vllms_own_kernel_alone_and_checks_it_after_vllms_fill(monkeypatch):
    """With stock_capability (on a GPU: where vLLM's ops load), each decode shape gets a 'stock'
    measurement: the kernel stock vLLM runs for the call (cooperative up to 64 rows on sm_90,
    persistent above), timed alone, its output checked after the -1 fill vLLM does."""
    import argparse

    from dsa_ops.commands import calibrate
    from tests.standins import fake_vllm_kernels

    args = argparse.Namespace(k=512, reps=1, rows="4,80", widths="3000", lengths="2500", prefill_seqlens="",
                              quick=False, context_mix=None, backends="torch_topk")
    timed = []

    def timer(call, family):
        timed.append(call)
        return 7.0

    with fake_vllm_kernels() as ran:
        ms = calibrate.measure(args, progress=lambda s: None, timer=timer, device="cpu", stock_capability=(9, 0))
        stock = [m for m in ms if m.backend == R.STOCK]
        assert [(m.rows, m.ok) for m in stock] == [(4, True), (80, True)]
        assert ran == ["cooperative_topk", "persistent_topk"]  # the checked calls (fill, then the kernel)
        timed[1]()  # the timed stock call: the kernel alone, no fill
        assert ran[-1] == "cooperative_topk"


def _without_fault(monkeypatch, name):
    import dataclasses

    from dsa_ops.backends import BACKENDS

    monkeypatch.setitem(BACKENDS, name, dataclasses.replace(BACKENDS[name], faults="", _cache={}))


def test_a_backend_with_a_known_fault_is_never_chosen_even_where_fastest():
    """vllm_cooperative's record names a fault on legal input: the band builder drops it (the
    regret table still compares with it), so the next fastest serves every band."""
    import dsa_ops

    assert dsa_ops.backends()["vllm_cooperative"].faults
    ms = []
    for r in (8, 64, 128):
        for L in (4096, 131072):
            ms += [M("decode", "cuda", r, L, 133120, 11.0), M("decode", "vllm_cooperative", r, L, 133120, 5.0),
                   M("decode", "vllm_persistent", r, L, 133120, 12.0)]
    pol = R.build_row_policy(ms, "cuda", "sm_90", {"device": "x"}, k=2048)
    assert "vllm_cooperative" not in pol.backends_named()
    assert [r.backend for r in pol.decode if r.why.startswith("calibrated on")] == ["cuda"]


def test_for_the_route_vllms_backends_cost_what_stock_does_where_the_route_makes_stocks_call(monkeypatch):
    """The route calls vLLM's kernel as stock does where the policy picks vllm_cooperative (up to 64
    rows: cooperative_topk; above: persistent_topk, which vllm_persistent's pick runs too). Here the
    adapters are 3 us slower than stock and cuda 1 us: on the measured costs cuda wins everywhere,
    on the route's costs vLLM's backends win, and the regret table shows them at stock's time.
    (The cooperative record here has no known fault: the mechanism, for a fixed kernel.)"""
    _without_fault(monkeypatch, "vllm_cooperative")
    ms = []
    for r in (8, 64, 128):
        for L in (4096, 131072):
            ms += [M("decode", R.STOCK, r, L, 133120, 10.0), M("decode", "cuda", r, L, 133120, 11.0),
                   M("decode", "vllm_cooperative", r, L, 133120, 13.0),
                   M("decode", "vllm_persistent", r, L, 133120, 13.5)]
    view = {(m.backend, m.rows): m.us for m in R.route_view(ms, "sm_90")}
    assert view[("vllm_cooperative", 8)] == 10.0 and view[("vllm_persistent", 8)] == 13.5  # stock runs coop at 8
    assert view[("vllm_cooperative", 128)] == view[("vllm_persistent", 128)] == 10.0
    plain = R.build_row_policy(ms, "cuda", "sm_90", {"device": "x"}, k=2048)
    route = R.build_row_policy(ms, "cuda", "sm_90", {"device": "x"}, k=2048, for_route=True)
    calibrated = lambda pol: [(r.max_rows, r.backend) for r in pol.decode if r.why.startswith("calibrated on")]  # noqa: E731
    assert calibrated(plain) == [(None, "cuda")] and calibrated(route) == [(None, "vllm_cooperative")]
    assert route.meta["for_vllm_route"] and route.meta["measurements"] == plain.meta["measurements"]
    assert all(g["chosen_us"] == 10.0 for g in route.meta["regret"] if g["length"] != "mix")


def test_candidates_take_the_backend_list_as_the_option_check_does():
    """--backends 'reference, torch_topk' passes the option check (names stripped); the measuring
    run's candidate list must read it the same way (it looked up ' torch_topk' and raised)."""
    from dsa_ops.commands import calibrate

    assert calibrate._candidates("reference, torch_topk,", 2048, 1000) == ["reference", "torch_topk"]
