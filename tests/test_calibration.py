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
