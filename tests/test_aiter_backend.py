"""The ``aiter`` backend: its adapters against a test double of AITER, its probe, and a
real-AITER check that runs only on ROCm gfx950.

AITER cannot run on any machine here (no ROCm), so everything but the last test drives
the real adapters in ``dsa_ops/backends/aiter.py`` into ``tests.kernel_doubles.AiterDouble``,
which implements AITER's documented interface (flat lengths read at ``r // next_n``, no
clamp to the width, chunk-global prefill output) and raises where AITER would read past a
row. The double backend is registered as ``aiter_test_double`` (``test_only``) for the
duration of each test only.
"""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

import dsa_ops
from dsa_ops import ops
from dsa_ops.backends import BACKENDS
from dsa_ops.backends import aiter as aiter_backend
from dsa_ops.backends.base import YES
from dsa_ops.testing import assert_decode_equivalent, assert_prefill_equivalent
from tests import data
from tests.kernel_doubles import AiterDouble, KernelPreconditionError

NAME = "aiter_test_double"
# The real record, made available and allowed on CPU; everything else (writers, stable
# check, version) is the real backend's code.
DOUBLE_BACKEND = dataclasses.replace(
    aiter_backend.BACKEND,
    name=NAME,
    available=lambda: YES,
    supports=lambda q: aiter_backend._supports(dataclasses.replace(q, device_type="cuda")),
    description="aiter adapters driving tests.kernel_doubles.AiterDouble",
    test_only=True,
    _cache={},
)


def _use_double(monkeypatch, with_stable: bool = True, decode_kernel: str = "one_block") -> AiterDouble:
    double = AiterDouble(with_stable=with_stable, decode_kernel=decode_kernel)
    double.install(monkeypatch)
    monkeypatch.setitem(BACKENDS, NAME, DOUBLE_BACKEND)
    ops.register_backend_ops(DOUBLE_BACKEND)  # once per process; ops cannot be unregistered
    return double


@pytest.fixture
def aiter_double(monkeypatch) -> AiterDouble:
    return _use_double(monkeypatch)


DECODE_CASES = [
    # rows, width, k, kind, lengths description
    (6, 300, 64, "ties", "mixed"),
    (5, 64, 64, "ties", "mixed"),  # k == W
    (4, 40, 64, "randn", "mixed"),  # k > W
    (7, 2500, 2048, "ties", "mixed"),
    (3, 500, 16, "specials", "mixed"),
]


def _mixed_lengths(gen: torch.Generator, rows: int, width: int, k: int) -> torch.Tensor:
    """Lengths covering 0, < k, == k, k + 1, == W and > W (clamped by the adapter)."""
    pool = [0, 1, min(k, width) - 1, k, k + 1, width, width + 17, width * 3]
    pick = torch.randint(0, len(pool), (rows,), generator=gen)
    lengths = torch.tensor(pool)[pick]
    lengths[: min(rows, len(pool))] = torch.tensor(pool[: min(rows, len(pool))])
    return lengths.clamp(min=0).to(torch.int32)


@pytest.mark.parametrize("rows, width, k, kind, _", DECODE_CASES)
def test_aiter_adapter_with_double_decode_matches_reference(aiter_double, gen, rows, width, k, kind, _):
    lengths = _mixed_lengths(gen, rows, width, k)
    x = data.poison_tail(data.logits(gen, rows, width, kind), lengths.long())
    out = data.poisoned_out(rows, k)
    got = dsa_ops.topk_decode(x, lengths, k, backend=NAME, out=out)
    assert got is out
    assert_decode_equivalent(got, x, lengths, k)
    (call,) = aiter_double.log.calls
    assert call["next_n"] == 1 and call["numRows"] == rows and call["k"] == k
    assert call["seqLens"].shape == (rows,) and call["seqLens"].dtype == torch.int32
    assert int(call["seqLens"].max()) <= width and int(call["seqLens"].min()) >= 0


@pytest.mark.parametrize("next_n, shape", [(2, "1d"), (3, "1d"), (2, "2d")])
def test_aiter_adapter_with_double_decode_flattens_mtp_lengths(aiter_double, gen, next_n, shape):
    batch, width, k = 4, 200, 32
    rows = batch * next_n
    if shape == "1d":  # per request: row r sees lengths[r // n] - n + 1 + r % n
        lengths = torch.tensor([0, 1, 40, 199], dtype=torch.int32)
    else:  # (B, n) per row, which AITER itself would misread with next_n = n
        lengths = torch.randint(0, width + 1, (batch, next_n), generator=gen, dtype=torch.int32)
    x = data.logits(gen, rows, width, "ties")
    got = dsa_ops.topk_decode(x, lengths, k, next_n=next_n, backend=NAME)
    assert_decode_equivalent(got, x, lengths, k, next_n=next_n)
    (call,) = aiter_double.log.calls
    assert call["next_n"] == 1 and call["seqLens"].shape == (rows,)


def test_aiter_adapter_with_double_decode_row_pitch(aiter_double, gen):
    rows, width, k = 5, 300, 50
    x = data.sliced(data.logits(gen, rows, width, "randn"), extra=29, fill=float("nan"))
    lengths = torch.tensor([300, 0, 51, 49, 1000], dtype=torch.int32)
    got = dsa_ops.topk_decode(x, lengths, k, backend=NAME)
    assert_decode_equivalent(got, x, lengths, k)
    assert aiter_double.log.calls[0]["stride0"] == width + 29


@pytest.mark.parametrize("family", ["decode", "prefill"])
def test_aiter_adapter_with_double_stable_equals_reference(aiter_double, gen, family):
    rows, width, k = 6, 400, 40
    x = data.logits(gen, rows, width, "ties")
    if family == "decode":
        lengths = torch.tensor([400, 0, 39, 40, 41, 500], dtype=torch.int32)
        got = dsa_ops.topk_decode(x, lengths, k, backend=NAME, stable=True)
        assert_decode_equivalent(got, x, lengths, k, stable=True)
    else:
        s = torch.tensor([0, 10, 100, 350, 5, 0], dtype=torch.int32)
        e = torch.tensor([400, 10, 399, 450, 30, 200], dtype=torch.int32)
        got = dsa_ops.topk_prefill(x, s, e, k, backend=NAME, stable=True)
        assert_prefill_equivalent(got, x, s, e, k, stable=True)
    assert aiter_double.log.calls[0]["stable"] is True


def test_aiter_adapter_with_double_prefill_matches_reference(aiter_double, gen):
    rows, width, k = 8, 600, 64
    # Nonzero starts (chunk-global windows), empty, short, exact-k, inverted, past the
    # width (clamped) and negative starts (clamped).
    s = torch.tensor([0, 100, 250, 250, 300, 590, 500, -20], dtype=torch.int32)
    e = torch.tensor([600, 100, 263, 314, 200, 700, 600, 50], dtype=torch.int32)
    x = data.logits(gen, rows, width, "ties")
    col = torch.arange(width)
    sc, ec = s.long().clamp(0, width), e.long().clamp(0, width)
    outside = (col[None, :] < sc[:, None]) | (col[None, :] >= ec[:, None])
    x = torch.where(outside, float("nan"), x)  # anything read outside the window shows
    got = dsa_ops.topk_prefill(x, s, e, k, backend=NAME, out=data.poisoned_out(rows, k))
    assert_prefill_equivalent(got, x, s, e, k)
    (call,) = aiter_double.log.calls
    assert call["values"] is None
    assert bool((call["rowStarts"] >= 0).all()) and bool((call["rowEnds"] <= width).all())
    assert bool((call["rowEnds"] >= call["rowStarts"]).all())


def test_aiter_adapter_with_double_prefill_keeps_minus_one(aiter_double, gen):
    x = data.logits(gen, 3, 100, "randn")
    s = torch.tensor([90, 50, 0], dtype=torch.int32)
    e = torch.tensor([95, 50, 3], dtype=torch.int32)
    got = dsa_ops.topk_prefill(x, s, e, 8, backend=NAME)
    assert got.tolist() == [[0, 1, 2, 3, 4, -1, -1, -1], [-1] * 8, [0, 1, 2, -1, -1, -1, -1, -1]]


def test_aiter_adapter_with_double_zero_rows_is_a_noop(aiter_double):
    x = torch.empty(0, 128)
    got = dsa_ops.topk_decode(x, torch.empty(0, dtype=torch.int32), 16, backend=NAME)
    got2 = dsa_ops.topk_prefill(x, torch.empty(0, dtype=torch.int32), torch.empty(0, dtype=torch.int32), 16,
                                backend=NAME)
    assert got.shape == got2.shape == (0, 16)
    assert aiter_double.log.calls == []


def test_aiter_double_flags_unclamped_lengths():
    """The double is strict: a length past the width is an AITER precondition violation."""
    double = AiterDouble()
    out = torch.empty(1, 4, dtype=torch.int32)
    with pytest.raises(KernelPreconditionError, match="reads past the row"):
        double.decode(torch.zeros(1, 8), 1, torch.tensor([9], dtype=torch.int32), out, 1, 8, 1, k=4)


def test_aiter_adapter_with_old_double_refuses_stable(monkeypatch, gen):
    double = _use_double(monkeypatch, with_stable=False)
    x = data.logits(gen, 2, 100, "randn")
    lengths = torch.tensor([100, 7], dtype=torch.int32)
    with pytest.raises(ValueError, match="stable"):
        dsa_ops.topk_decode(x, lengths, 16, backend=NAME, stable=True)
    got = dsa_ops.topk_decode(x, lengths, 16, backend=NAME)  # no `stable=` passed
    assert_decode_equivalent(got, x, lengths, 16)
    assert double.log.calls[0]["stable"] is False


def test_aiter_version_is_the_amd_aiter_distributions(aiter_double, monkeypatch):
    """The real ``aiter`` module sets no ``__version__``; pip's ``amd-aiter`` record is the
    version (it goes into the pass's cache key), and a module attribute does not override it."""
    import sys

    assert DOUBLE_BACKEND.version() == aiter_double.version == "0.1.25+double"
    monkeypatch.setattr(sys.modules["aiter"], "__version__", "9.9.9", raising=False)
    assert DOUBLE_BACKEND.version() == "0.1.25+double"


def test_aiter_version_without_the_distribution(monkeypatch):
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert aiter_backend._version() == "absent"


# --- AITER's newer default decode kernel: checks its inputs, clamps lengths itself ---

@pytest.fixture
def tiered_double(monkeypatch) -> AiterDouble:
    return _use_double(monkeypatch, decode_kernel="tiered")


@pytest.mark.parametrize("rows, width, k, kind, _", DECODE_CASES)
def test_aiter_adapter_with_tiered_double_decode_matches_reference(tiered_double, gen, rows, width, k, kind, _):
    lengths = _mixed_lengths(gen, rows, width, k)
    x = data.poison_tail(data.logits(gen, rows, width, kind), lengths.long())
    got = dsa_ops.topk_decode(x, lengths, k, backend=NAME, out=data.poisoned_out(rows, k))
    assert_decode_equivalent(got, x, lengths, k)
    (call,) = tiered_double.log.calls
    assert call["next_n"] == 1 and call["seqLens"].shape == (rows,)


@pytest.mark.parametrize("next_n", [2, 3])
def test_aiter_adapter_with_tiered_double_mtp_and_row_pitch(tiered_double, gen, next_n):
    batch, width, k = 3, 300, 40
    x = data.sliced(data.logits(gen, batch * next_n, width, "ties"), extra=13, fill=float("nan"))
    lengths = torch.tensor([0, 41, 299], dtype=torch.int32)
    got = dsa_ops.topk_decode(x, lengths, k, next_n=next_n, backend=NAME)
    assert_decode_equivalent(got, x, lengths, k, next_n=next_n)
    assert tiered_double.log.calls[0]["stride0"] == width + 13


def test_aiter_adapter_single_row_names_its_own_stride(tiered_double, gen):
    """One row whose stride(0) is not its width (a row of a wider buffer, or any stride at
    all: torch ignores a size-1 dim's stride). The newer kernel checks stride0 against
    logits.stride(0); the adapter passes a view whose stride(0) is the pitch it names."""
    width, k = 500, 32
    buf = data.logits(gen, 3, width + 20, "randn")
    for x in (buf[1:2, :width], buf[0, :width].as_strided((1, width), (7, 1))):
        assert x.stride(0) != width
        lengths = torch.tensor([450], dtype=torch.int32)
        got = dsa_ops.topk_decode(x, lengths, k, backend=NAME)
        assert_decode_equivalent(got, x, lengths, k)
    assert [c["stride0"] for c in tiered_double.log.calls] == [width, width]


def test_tiered_double_checks_inputs_and_clamps():
    """The double itself: what the newer kernel refuses, and the clamp it does."""
    double = AiterDouble(decode_kernel="tiered")
    x = torch.randn(4, 64)
    lens = torch.tensor([10, 500], dtype=torch.int32)  # 500 > W: clamped, not read past
    out = torch.empty(4, 8, dtype=torch.int32)
    double.decode(x, 2, lens, out, 4, 64, 1, k=8)
    assert_decode_equivalent(out, x, lens, 8, next_n=2)
    with pytest.raises(TypeError, match="seqLens"):
        double.decode(x, 2, lens.long(), out, 4, 64, 1, k=8)
    with pytest.raises(ValueError, match="stride0"):
        double.decode(x, 2, lens, out, 4, 65, 1, k=8)
    with pytest.raises(ValueError, match="seqLens entries"):
        double.decode(x, 4, lens[:0], out, 4, 64, 1, k=8)
    with pytest.raises(ValueError, match="next_n"):
        double.decode(x, 0, lens, out, 4, 64, 1, k=8)
    with pytest.raises(ValueError, match="indices"):
        double.decode(x, 2, lens, out[:, :4], 4, 64, 1, k=8)


# --- the availability probe, with the platform facts faked --------------------------

def _fake_rocm(monkeypatch, arch: str) -> None:
    """A ROCm host with device 0 of ``arch``, not capturing; the warm-up runs on the CPU."""
    monkeypatch.setattr(torch.version, "hip", "6.4.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(gcnArchName=arch))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(aiter_backend, "PROBE_DEVICE", "cpu")


def test_aiter_probe_refuses_cuda_and_cpu_builds(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", None)
    sup = aiter_backend._available()
    assert not sup and "ROCm" in sup.reason


def test_aiter_probe_refuses_other_archs(monkeypatch, aiter_double):
    _fake_rocm(monkeypatch, "gfx942:sramecc+:xnack-")
    sup = aiter_backend._available()
    assert not sup and "gfx942" in sup.reason


def test_aiter_probe_needs_a_k_parameter(monkeypatch, aiter_double):
    _fake_rocm(monkeypatch, "gfx950:sramecc+:xnack-")
    assert aiter_backend._available()
    aiter_double.log.calls.clear()
    mod = types.ModuleType("aiter.ops.topk")
    mod.top_k_per_row_decode = lambda logits, next_n, seqLens, indices, numRows, stride0, stride1: None
    mod.top_k_per_row_prefill = aiter_double.prefill
    monkeypatch.setitem(__import__("sys").modules, "aiter.ops.topk", mod)
    sup = aiter_backend._available()
    assert not sup and "'k'" in sup.reason and "top_k_per_row_decode" in sup.reason
    assert "0.1.25+double" in sup.reason and ">= 0.1.19" in sup.reason


def test_aiter_probe_without_aiter(monkeypatch, aiter_double):
    _fake_rocm(monkeypatch, "gfx950")
    monkeypatch.setitem(__import__("sys").modules, "aiter.ops.topk", None)  # import fails
    sup = aiter_backend._available()
    assert not sup and "does not import" in sup.reason


def test_aiter_probe_without_the_distribution(monkeypatch):
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    _fake_rocm(monkeypatch, "gfx950")
    monkeypatch.setattr(importlib.metadata, "version", missing)
    sup = aiter_backend._available()
    assert not sup and sup.reason == "the amd-aiter distribution is not installed (needs amd-aiter >= 0.1.19)"


@pytest.mark.parametrize("version, ok", [("0.1.18", False), ("0.1.18.post3", False), ("0.0.9", False),
                                         ("garbage", False), ("0.1.19", True), ("0.1.19.dev5+gabc", True),
                                         ("0.1.25", True), ("1.0.0", True)])
def test_aiter_probe_pins_the_minimum_version(monkeypatch, version, ok):
    """The pin and the message agree: what the probe refuses names the installed version
    and the minimum it wants."""
    double = AiterDouble(version=version)
    double.install(monkeypatch)
    _fake_rocm(monkeypatch, "gfx950")
    sup = aiter_backend._available()
    assert bool(sup) is ok, sup.reason
    if not ok:
        assert sup.reason == f"amd-aiter {version} is installed; needs >= 0.1.19"


def test_aiter_probe_warms_up_with_real_calls(monkeypatch, aiter_double):
    """Availability includes one decode and one prefill call through the adapters, checked
    against the reference: AITER builds its JIT module on the first call, so that happens
    here and not inside a graph capture."""
    _fake_rocm(monkeypatch, "gfx950")
    assert aiter_backend._available()
    assert [c["fn"] for c in aiter_double.log.calls] == ["decode", "prefill"]
    assert all(c["k"] == 2048 for c in aiter_double.log.calls)


def test_aiter_probe_reports_a_failing_warm_up(monkeypatch):
    double = AiterDouble(fail=RuntimeError("module_top_k_per_row: hipcc exited with 1"))
    double.install(monkeypatch)
    _fake_rocm(monkeypatch, "gfx950")
    sup = aiter_backend._available()
    assert not sup and "warm-up call of aiter.ops.topk failed" in sup.reason and "hipcc exited" in sup.reason


def test_aiter_probe_reports_a_wrong_warm_up_result(monkeypatch):
    double = AiterDouble()
    double.install(monkeypatch)
    _fake_rocm(monkeypatch, "gfx950")
    wrong = types.ModuleType("aiter.ops.topk")
    wrong.top_k_per_row_prefill = double.prefill

    def decode_all_zero(logits, next_n, seqLens, indices, numRows, stride0, stride1, k=2048, stable=False):
        indices.zero_()

    wrong.top_k_per_row_decode = decode_all_zero
    monkeypatch.setitem(__import__("sys").modules, "aiter.ops.topk", wrong)
    sup = aiter_backend._available()
    assert not sup and sup.reason.startswith("warm-up call returned a wrong result")


def test_aiter_probe_during_capture_is_not_cached(monkeypatch, aiter_double):
    """Asked first inside a graph capture, the probe cannot warm up: it says so, and the
    record asks again later instead of caching "not available" for the process."""
    _fake_rocm(monkeypatch, "gfx950")
    record = dataclasses.replace(aiter_backend.BACKEND, _cache={})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    sup = record.availability()
    assert not sup and "graph capture" in sup.reason and aiter_double.log.calls == []
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert record.availability() and len(aiter_double.log.calls) == 2
    assert record.availability() and len(aiter_double.log.calls) == 2  # cached now


@pytest.mark.parametrize("family", ["decode", "prefill"])
def test_aiter_adapter_with_double_ops_pass_opcheck(aiter_double, gen, family):
    """The backend ops (functional and out=) under schema, fake-tensor and AOT checks."""
    data.opcheck_backend_pair(NAME, family, gen)


def test_real_aiter_backend_matches_reference(gen):
    """Runs only where AITER really imports on a gfx950 GPU."""
    avail = aiter_backend.BACKEND.availability()
    if not avail:
        pytest.skip(f"real AITER unavailable: {avail.reason}")
    dev = "cuda"
    rows, width, k = 16, 40_000, 2048
    lengths = _mixed_lengths(gen, rows, width, k)
    x = data.poison_tail(data.logits(gen, rows, width, "ties"), lengths.long()).to(dev)
    got = dsa_ops.topk_decode(x, lengths.to(dev), k, backend="aiter", out=data.poisoned_out(rows, k).to(dev))
    assert_decode_equivalent(got, x, lengths, k)
    s = torch.randint(0, width // 2, (rows,), generator=gen, dtype=torch.int32)
    e = (s + torch.randint(0, width // 2, (rows,), generator=gen, dtype=torch.int32)).clamp(max=width)
    got = dsa_ops.topk_prefill(x, s.to(dev), e.to(dev), k, backend="aiter")
    assert_prefill_equivalent(got, x, s, e, k)
    if aiter_backend.has_stable():
        got = dsa_ops.topk_decode(x, lengths.to(dev), k, backend="aiter", stable=True)
        assert_decode_equivalent(got, x, lengths, k, stable=True)
