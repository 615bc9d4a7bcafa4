"""The ``vllm`` (in-tree) backend: adapters against test doubles of vLLM's compiled ops,
its probe, and a real check that runs only where vLLM's compiled ops import on a GPU.

No machine here can run vLLM's kernels (the CPU box has no GPU; the GPU box has no vLLM
CUDA build), so the adapters in ``dsa_ops/backends/vllm_intree.py`` are pointed at real
torch ops in a test namespace that carry vLLM 0.33.0's exact schemas and implement the
in-tree contract (``tests.kernel_doubles``): 2-D ``seq_lens`` read per row, 1-D per
request, clamp at 0 only, row-local prefill output, and an error where the real kernel
would read past a row, write before one, or launch a zero-size grid.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import dsa_ops
from dsa_ops import ops
from dsa_ops.backends import BACKENDS
from dsa_ops.backends import vllm_intree
from dsa_ops.backends.base import YES
from dsa_ops.testing import assert_decode_equivalent, assert_prefill_equivalent
from tests import data
from tests.kernel_doubles import VLLM_LOG, VLLM_SCHEMAS, register_vllm_double

NAME = "vllm_test_double"
DOUBLE_BACKEND = dataclasses.replace(
    vllm_intree.BACKEND,
    name=NAME,
    available=lambda: YES,
    supports=lambda q: vllm_intree._supports(dataclasses.replace(q, device_type="cuda")),
    description="vllm in-tree adapters driving the torch.ops doubles in tests.kernel_doubles",
    test_only=True,
    _cache={},
)


@pytest.fixture
def vllm_double(monkeypatch):
    ns = register_vllm_double()
    monkeypatch.setattr(vllm_intree, "NAMESPACE", ns)
    monkeypatch.setitem(BACKENDS, NAME, DOUBLE_BACKEND)
    ops.register_backend_ops(DOUBLE_BACKEND)
    VLLM_LOG.calls.clear()
    yield VLLM_LOG
    VLLM_LOG.calls.clear()


def test_double_schemas_are_vllms():
    """The doubles are dispatched through schemas identical to the compiled ones."""
    ns = register_vllm_double()
    for name, schema in VLLM_SCHEMAS.items():
        got = str(getattr(getattr(torch.ops, ns), name).default._schema)
        want = str(torch._C.parse_schema(f"{ns}::{name}{schema}"))
        assert got == want


@pytest.mark.parametrize("rows, width, k, kind", [
    (6, 300, 64, "ties"), (5, 64, 64, "ties"), (4, 40, 64, "randn"), (7, 2500, 2048, "ties"),
    (3, 500, 16, "specials"),
])
def test_vllm_intree_adapter_with_double_decode_matches_reference(vllm_double, gen, rows, width, k, kind):
    pool = torch.tensor([0, 1, min(k, width) - 1, k, k + 1, width, width + 9, 3 * width])
    lengths = pool[torch.randint(0, len(pool), (rows,), generator=gen)].clamp(min=0).to(torch.int32)
    lengths[0] = 0
    col = torch.arange(width)
    x = data.logits(gen, rows, width, kind)
    x = torch.where(col[None, :] >= lengths[:, None].long(), float("nan"), x)  # poisoned tail
    got = dsa_ops.topk_decode(x, lengths, k, backend=NAME, out=data.poisoned_out(rows, k))
    assert_decode_equivalent(got, x, lengths, k)
    (call,) = vllm_double.calls
    assert call["next_n"] == 1 and call["seq_lens"].dim() == 1 and call["seq_lens"].shape == (rows,)
    assert int(call["seq_lens"].max()) <= width


@pytest.mark.parametrize("next_n, shape", [(2, "1d"), (4, "1d"), (2, "2d")])
def test_vllm_intree_adapter_with_double_decode_mtp(vllm_double, gen, next_n, shape):
    batch, width, k = 3, 150, 20
    if shape == "1d":
        lengths = torch.tensor([1, 30, 150], dtype=torch.int32)
    else:
        lengths = torch.randint(0, width + 1, (batch, next_n), generator=gen, dtype=torch.int32)
    x = data.sliced(data.logits(gen, batch * next_n, width, "ties"), extra=11)
    got = dsa_ops.topk_decode(x, lengths, k, next_n=next_n, backend=NAME)
    assert_decode_equivalent(got, x, lengths, k, next_n=next_n)
    (call,) = vllm_double.calls
    assert call["next_n"] == 1 and call["stride0"] == width + 11


def test_vllm_intree_adapter_with_double_prefill_matches_reference(vllm_double, gen):
    rows, width, k = 8, 600, 64
    s = torch.tensor([0, 100, 250, 250, 300, 590, 500, -20], dtype=torch.int32)
    e = torch.tensor([600, 100, 263, 314, 200, 700, 600, 50], dtype=torch.int32)
    x = data.logits(gen, rows, width, "ties")
    col = torch.arange(width)
    sc, ec = s.long().clamp(0, width), e.long().clamp(0, width)
    x = torch.where((col[None, :] < sc[:, None]) | (col[None, :] >= ec[:, None]), float("nan"), x)
    got = dsa_ops.topk_prefill(x, s, e, k, backend=NAME, out=data.poisoned_out(rows, k))
    assert_prefill_equivalent(got, x, s, e, k)
    (call,) = vllm_double.calls
    assert bool((call["rowEnds"] >= call["rowStarts"]).all()) and bool((call["rowEnds"] <= width).all())


def test_vllm_intree_adapter_with_double_zero_rows_never_launches(vllm_double):
    x = torch.empty(0, 64)
    empty = torch.empty(0, dtype=torch.int32)
    assert dsa_ops.topk_decode(x, empty, 8, backend=NAME).shape == (0, 8)
    assert dsa_ops.topk_prefill(x, empty, empty, 8, backend=NAME).shape == (0, 8)
    assert vllm_double.calls == []


def test_vllm_intree_refuses_stable(vllm_double, gen):
    x = data.logits(gen, 2, 50, "randn")
    with pytest.raises(ValueError, match="stable"):
        dsa_ops.topk_decode(x, torch.tensor([50, 3], dtype=torch.int32), 8, backend=NAME, stable=True)


def test_vllm_intree_probe_without_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    sup = vllm_intree._available()
    assert not sup and "GPU" in sup.reason


def test_vllm_intree_probe_without_compiled_ops(monkeypatch):
    import sys

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for ext in vllm_intree._EXTENSIONS:
        monkeypatch.setitem(sys.modules, ext, None)  # import raises ImportError
    sup = vllm_intree._available()
    assert not sup and "do not import" in sup.reason


def test_vllm_intree_record_is_named_vllm_and_inexact():
    assert vllm_intree.BACKEND.name == "vllm" and dsa_ops.backends()["vllm"] is vllm_intree.BACKEND
    assert vllm_intree.BACKEND.exact is False  # -inf at W >= 200000, NaN in the insertion sort


@pytest.mark.parametrize("family", ["decode", "prefill"])
def test_vllm_intree_adapter_with_double_ops_pass_opcheck(vllm_double, gen, family):
    """The backend ops (functional and out=) under schema, fake-tensor and AOT checks."""
    data.opcheck_backend_pair(NAME, family, gen)


def test_real_vllm_intree_backend_matches_reference(gen):
    """Runs only where vLLM's compiled ops import on a CUDA/ROCm GPU."""
    avail = vllm_intree.BACKEND.availability()
    if not avail:
        pytest.skip(f"vLLM's compiled ops unavailable: {avail.reason}")
    dev = "cuda"
    rows, width, k = 16, 40_000, 2048  # single-block path; no -inf in the data (W < 200000 anyway)
    pool = torch.tensor([0, 1, 2047, 2048, 2049, 30_000, 40_000, 90_000])
    lengths = pool[torch.randint(0, len(pool), (rows,), generator=gen)].to(torch.int32)
    x = data.logits(gen, rows, width, "ties").to(dev)
    got = dsa_ops.topk_decode(x, lengths.to(dev), k, backend="vllm", out=data.poisoned_out(rows, k).to(dev))
    assert_decode_equivalent(got, x, lengths, k)
    s = torch.randint(0, width // 2, (rows,), generator=gen, dtype=torch.int32)
    e = (s + torch.randint(0, width // 2, (rows,), generator=gen, dtype=torch.int32)).clamp(max=width)
    got = dsa_ops.topk_prefill(x, s.to(dev), e.to(dev), k, backend="vllm")
    assert_prefill_equivalent(got, x, s, e, k)
