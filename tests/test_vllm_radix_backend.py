"""The ``vllm_persistent`` / ``vllm_cooperative`` backends: adapters against test doubles of
vLLM's ``persistent_topk`` / ``cooperative_topk``, their probes and support checks, and
real-kernel checks that run only where vLLM's compiled ops import on a CUDA GPU.

No machine here runs these kernels (the CPU box has no GPU; the GPU box has no vLLM CUDA
build), so ``dsa_ops/backends/vllm_radix.py`` is pointed at torch ops in a test namespace
that carry vLLM 0.33.0's schema and implement the kernels' contract
(``tests.kernel_doubles``): one length per row, k in {512, 1024, 2048}, a minimum
workspace, persistent's uint32 lengths clamped by ``max_seq_len``, cooperative's 64-row
and row-pitch limits, and an error wherever the real kernel would misbehave.
"""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest
import torch

import dsa_ops
from dsa_ops import ops
from dsa_ops.backends import BACKENDS, vllm_radix
from dsa_ops.backends.base import YES, Query, module_version
from dsa_ops.backends.rows import row_lengths
from dsa_ops.testing import assert_decode_equivalent
from tests import data
from tests.kernel_doubles import (
    VLLM_RADIX,
    VLLM_RADIX_SCHEMAS,
    KernelPreconditionError,
    register_vllm_radix_double,
)


def _double(record):
    return dataclasses.replace(
        record,
        name=record.name + "_test_double",
        available=lambda: YES,
        supports=lambda q, s=record.supports: s(dataclasses.replace(q, device_type="cuda")),
        description=f"{record.name} adapters driving the torch.ops doubles in tests.kernel_doubles",
        test_only=True,
        _cache={},
    )


PERSISTENT, COOPERATIVE = _double(vllm_radix.PERSISTENT), _double(vllm_radix.COOPERATIVE)
BOTH = pytest.mark.parametrize("backend", [PERSISTENT, COOPERATIVE], ids=lambda b: b.name)


@pytest.fixture
def radix(monkeypatch):
    ns = register_vllm_radix_double()
    monkeypatch.setattr(vllm_radix, "NAMESPACE", ns)
    monkeypatch.setattr(vllm_radix, "_platform", lambda device_type: ("cuda", "sm_90"))
    monkeypatch.setattr(vllm_radix, "_WORKSPACES", {})
    for b in (PERSISTENT, COOPERATIVE):
        monkeypatch.setitem(BACKENDS, b.name, b)
        ops.register_backend_ops(b)
    VLLM_RADIX.log.calls.clear()
    VLLM_RADIX.unwritten = 0
    yield VLLM_RADIX
    VLLM_RADIX.log.calls.clear()
    VLLM_RADIX.unwritten = 0


def _lengths(gen, rows: int, width: int, k: int):
    """L = 0, L < k, L = k, L > k, L = W, L > W and L < 0, drawn per row; row 0 is empty."""
    pool = torch.tensor([-5, 0, 1, min(k, width) - 1, k, k + 1, width, width + 9, 3 * width])
    lengths = pool[torch.randint(0, len(pool), (rows,), generator=gen)].to(torch.int32)
    lengths[0] = 0
    return lengths


def test_double_schemas_are_vllms():
    """The doubles are dispatched through schemas identical to the compiled ones."""
    ns = register_vllm_radix_double()
    for name, schema in VLLM_RADIX_SCHEMAS.items():
        got = str(getattr(getattr(torch.ops, ns), name).default._schema)
        assert got == str(torch._C.parse_schema(f"{ns}::{name}{schema}"))


@BOTH
@pytest.mark.parametrize("rows, width, k, kind", [
    (6, 700, 512, "ties"), (5, 512, 512, "ties"), (4, 300, 512, "randn"), (9, 2500, 2048, "ties"),
    (3, 1200, 1024, "specials"),
])
def test_vllm_radix_adapter_with_double_matches_reference(radix, gen, backend, rows, width, k, kind):
    lengths = _lengths(gen, rows, width, k)
    x = data.poison_tail(data.logits(gen, rows, width, kind), lengths)
    got = dsa_ops.topk_decode(x, lengths, k, backend=backend.name, out=data.poisoned_out(rows, k))
    assert_decode_equivalent(got, x, lengths, k)
    (call,) = radix.log.calls
    assert call["fn"] == backend.name.split("_")[1]
    ends = call["lengths"]
    assert call["max_seq_len"] == width
    if backend is PERSISTENT:  # <= 32 rows: the kernel clamps, so the lengths go in untouched
        assert torch.equal(ends, lengths)
        return
    assert ends.dtype == torch.int32 and ends.shape == (rows,) and ends.is_contiguous()
    assert int(ends.min()) >= 0 and int(ends.max()) <= width


@BOTH
@pytest.mark.parametrize("shape", ["per_request", "per_row_2d"])
def test_vllm_radix_adapter_with_double_mtp(radix, gen, backend, shape):
    batch, next_n, width, k = 4, 2, 1000, 512
    if shape == "per_request":
        lengths = torch.tensor([0, 1, 600, 1000], dtype=torch.int32)
    else:
        lengths = torch.randint(-2, width + 20, (batch, next_n), generator=gen, dtype=torch.int32)
    x = data.sliced(data.logits(gen, batch * next_n, width, "ties"), extra=12)  # pitch 1012
    got = dsa_ops.topk_decode(x, lengths, k, next_n=next_n, backend=backend.name)
    assert_decode_equivalent(got, x, lengths, k, next_n=next_n)
    (call,) = radix.log.calls
    layout = "per_request" if shape == "per_request" else "per_row"
    want = row_lengths(lengths, batch * next_n, next_n, layout, clamp_to=width).to(torch.int32)
    if backend is PERSISTENT and shape == "per_row_2d":  # one int32 per row: passed untouched
        want = lengths
    assert torch.equal(call["lengths"], want)


@pytest.mark.parametrize("rows, width, untouched", [
    (1, 4096, True), (32, 4096, True), (33, 4096, False), (64, 163840, False), (65, 4096, False),
    (65, 65535, False), (65, 65536, True), (80, 163840, True),
])
def test_vllm_persistent_clamps_where_its_kernel_path_does_not(radix, gen, rows, width, untouched):
    """FilteredTopK (33..64 rows, or > 64 rows with W below kMinSampledLength) reads lengths
    unclamped: there the adapter clamps; elsewhere the kernel does, and lengths go in as is."""
    k = 2048
    lengths = torch.randint(-3, width + 50, (rows,), generator=gen, dtype=torch.int32)
    x = data.logits(gen, rows, width, "ties")
    got = dsa_ops.topk_decode(x, lengths, k, backend=PERSISTENT.name)
    assert_decode_equivalent(got, x, lengths, k)
    (call,) = radix.log.calls
    if untouched:
        assert torch.equal(call["lengths"], lengths)
    else:
        assert torch.equal(call["lengths"], lengths.clamp(0, width))


@BOTH
def test_vllm_radix_zero_rows_never_launch(radix, backend):
    x = torch.empty(0, 64)
    got = dsa_ops.topk_decode(x, torch.empty(0, dtype=torch.int32), 512, backend=backend.name)
    assert got.shape == (0, 512) and radix.log.calls == []


@pytest.mark.parametrize("rows, fn", [(64, "cooperative"), (65, "persistent"), (70, "persistent")])
def test_vllm_cooperative_over_64_rows_runs_persistent(radix, gen, rows, fn):
    width, k = 600, 512
    lengths = _lengths(gen, rows, width, k)
    x = data.poison_tail(data.logits(gen, rows, width, "ties"), lengths)
    got = dsa_ops.topk_decode(x, lengths, k, backend=COOPERATIVE.name, out=data.poisoned_out(rows, k))
    assert_decode_equivalent(got, x, lengths, k)
    assert [c["fn"] for c in radix.log.calls] == [fn]


def test_vllm_cooperative_unwritten_slots_read_minus_one(radix, gen):
    """The kernel may leave slots unwritten (vLLM 0.33.0); the adapter pre-fills -1."""
    radix.unwritten = 7
    rows, width, k = 5, 1500, 512
    lengths = torch.tensor([0, 100, 512, 1200, 1500], dtype=torch.int32)
    x = data.logits(gen, rows, width, "randn")
    got = dsa_ops.topk_decode(x, lengths, k, backend=COOPERATIVE.name, out=data.poisoned_out(rows, k))
    assert not bool((got == data.POISON).any())
    assert_decode_equivalent(got[:3], x[:3], lengths[:3], k)  # L <= k: complete
    for r in (3, 4):
        head = got[r, : k - 7]
        assert bool((got[r, k - 7:] == -1).all()) and len(set(head.tolist())) == k - 7
        assert bool(((head >= 0) & (head < lengths[r])).all())


@pytest.mark.parametrize("rows", [3, 80])
def test_vllm_cooperative_rejects_row_pitch_not_multiple_of_4(radix, gen, rows):
    x = data.sliced(data.logits(gen, rows, 600, "randn"), extra=3)  # pitch 603
    out = data.poisoned_out(rows, 512)
    with pytest.raises(ValueError, match=r"logits: .*stride\(0\) must be a multiple of 4; got 603"):
        dsa_ops.topk_decode(x, torch.full((rows,), 600, dtype=torch.int32), 512, backend=COOPERATIVE.name,
                            out=out)
    assert bool((out == data.POISON).all()) and radix.log.calls == []
    # persistent has no such requirement
    got = dsa_ops.topk_decode(x, torch.full((rows,), 600, dtype=torch.int32), 512, backend=PERSISTENT.name)
    assert_decode_equivalent(got, x, torch.full((rows,), 600, dtype=torch.int32), 512)


def test_vllm_cooperative_rejects_misaligned_base(radix, gen):
    flat = data.logits(gen, 1, 4 * 600 + 1, "randn").reshape(-1)
    x = flat[1:].view(4, 600)  # pitch 600, but the base is 4 bytes past a 16-byte boundary
    with pytest.raises(ValueError, match="logits: .*16-byte aligned"):
        dsa_ops.topk_decode(x, torch.full((4,), 600, dtype=torch.int32), 512, backend=COOPERATIVE.name)


@BOTH
def test_vllm_radix_workspace_is_cached_1mib_per_device_and_stream(radix, gen, backend):
    x = data.logits(gen, 3, 600, "randn")
    for _ in range(2):
        dsa_ops.topk_decode(x, torch.tensor([0, 600, 513], dtype=torch.int32), 512, backend=backend.name)
    a, b = (c["workspace"] for c in radix.log.calls)
    assert a is b and a is vllm_radix.workspace(torch.device("cpu"))
    assert a.dtype == torch.uint8 and a.numel() == 1 << 20


def _direct_args(rows=4, width=600, k=512, **over):
    args = dict(logits=torch.zeros(rows, width), lengths=torch.full((rows,), width, dtype=torch.int32),
                output=torch.empty(rows, k, dtype=torch.int32), workspace=torch.empty(1 << 20, dtype=torch.uint8),
                k=k, max_seq_len=width)
    args.update(over)
    return args


@pytest.mark.parametrize("fn", ["persistent_topk", "cooperative_topk"])
@pytest.mark.parametrize("bad, match", [
    (dict(lengths=torch.full((2, 4), 600, dtype=torch.int32)), "lengths size mismatch"),
    (dict(k=256, output=torch.empty(4, 256, dtype=torch.int32)), "k=512, k=1024, or k=2048"),
    (dict(rows=40, workspace=torch.empty(1000, dtype=torch.uint8)), "workspace too small"),
    (dict(lengths=torch.tensor([600, 601, 0, 1], dtype=torch.int32), max_seq_len=10_000), "reads past the row"),
    (dict(output=torch.empty(512, 4, dtype=torch.int32).t()), "output must be contiguous"),
])
def test_radix_doubles_raise_where_the_kernels_misbehave(fn, bad, match):
    if fn == "persistent_topk" and "rows" in bad:
        bad = dict(bad, rows=8)  # > 32 rows takes FilteredTopK, which needs no workspace
    if fn == "persistent_topk" and match == "reads past the row":
        # Only its FilteredTopK path (33..64 rows) reads lengths unclamped.
        bad = dict(bad, rows=40, lengths=torch.tensor([600, 601] + [0] * 38, dtype=torch.int32))
    args = _direct_args(**{k: v for k, v in bad.items() if k == "rows"})
    args.update({k: v for k, v in bad.items() if k != "rows"})
    op = getattr(getattr(torch.ops, register_vllm_radix_double()), fn)
    with pytest.raises(KernelPreconditionError, match=match):
        op(**args)


@pytest.mark.parametrize("fn, bad, match", [
    ("cooperative_topk", dict(rows=65), "<=64 rows"),
    ("cooperative_topk", dict(logits=torch.zeros(4, 603)[:, :600]), "multiple of 4"),
])
def test_radix_doubles_kernel_specific_limits(fn, bad, match):
    """(vLLM 0.33.0's persistent_topk clamps negative lengths to 0 on every path, so it has
    no uint32 limit left: see test_persistent_double_reads_a_negative_length_as_empty.)"""
    args = _direct_args(**{k: v for k, v in bad.items() if k == "rows"})
    args.update({k: v for k, v in bad.items() if k != "rows"})
    op = getattr(getattr(torch.ops, register_vllm_radix_double()), fn)
    with pytest.raises(KernelPreconditionError, match=match):
        op(**args)


@pytest.mark.parametrize("rows", [4, 40, 80])
def test_persistent_double_reads_a_negative_length_as_empty(rows):
    lengths = torch.full((rows,), 600, dtype=torch.int32)
    lengths[1] = -1
    args = _direct_args(rows=rows, lengths=lengths, max_seq_len=600)
    getattr(torch.ops, register_vllm_radix_double()).persistent_topk(**args)
    assert bool((args["output"][1] == -1).all()) and bool((args["output"][0] >= 0).all())


@BOTH
@pytest.mark.parametrize("layout", ["contiguous", "sliced", "zero_rows"])
def test_vllm_radix_adapter_with_double_ops_pass_opcheck(radix, gen, backend, layout):
    """The backend ops (functional and out=) under schema, fake-tensor and AOT checks."""
    rows = 0 if layout == "zero_rows" else 4
    x = data.logits(gen, rows, 600, "ties")
    if layout == "sliced":
        x = data.sliced(x, extra=8)
    lengths = torch.tensor([0, 5, 600, 900][:rows], dtype=torch.int32)
    args = (x, lengths, 512, 1, 1, False)
    torch.library.opcheck(ops.backend_op(backend.name, "decode"), args)
    torch.library.opcheck(ops.backend_op(backend.name, "decode", out=True), args + (data.poisoned_out(rows, 512),))


@pytest.mark.parametrize("arch, ok", [
    ("sm_80", False), ("sm_89", False), ("sm_90", True), ("sm_100", True), ("sm_103", True),
    ("sm_120", False), ("sm_121", False), ("", False),
])
def test_vllm_cooperative_arch_gate(monkeypatch, arch, ok):
    monkeypatch.setattr(vllm_radix, "_platform", lambda device_type: ("cuda", arch))
    q = Query("decode", "cuda", 2048, 163840)
    sup = vllm_radix.COOPERATIVE.supports(q)
    assert bool(sup) is ok and (ok or "SM90" in sup.reason)
    assert vllm_radix.PERSISTENT.supports(q)  # no arch gate beyond CUDA


@pytest.mark.parametrize("record", [vllm_radix.PERSISTENT, vllm_radix.COOPERATIVE], ids=lambda b: b.name)
def test_vllm_radix_supports_refusals(monkeypatch, record):
    monkeypatch.setattr(vllm_radix, "_platform", lambda device_type: ("cuda", "sm_90"))
    assert record.supports(Query("decode", "cuda", 1024, 4096))
    for q, why in ((Query("decode", "cpu", 2048, 4096), "CUDA"), (Query("decode", "cuda", 256, 4096), "k must be"),
                   (Query("decode", "cuda", 4096, 8192), "k must be"),
                   (Query("decode", "cuda", 2048, 4096, stable=True), "stable")):
        sup = record.supports(q)
        assert not sup and why in sup.reason
    monkeypatch.setattr(vllm_radix, "_platform", lambda device_type: ("rocm", "gfx950"))
    sup = record.supports(Query("decode", "cuda", 2048, 4096))
    assert not sup and "CUDA-only" in sup.reason


def test_vllm_radix_probe_without_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    sup = vllm_radix._available()
    assert not sup and "GPU" in sup.reason


def test_vllm_radix_probe_refuses_rocm(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.4.0")
    sup = vllm_radix._available()
    assert not sup and "ROCm" in sup.reason


def test_vllm_radix_probe_without_compiled_ops(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for ext in vllm_radix._EXTENSIONS:
        monkeypatch.setitem(sys.modules, ext, None)  # import raises ImportError
    sup = vllm_radix._available()
    assert not sup and "do not import" in sup.reason


def test_vllm_radix_probe_with_ops_missing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for ext in vllm_radix._EXTENSIONS:
        monkeypatch.setitem(sys.modules, ext, types.ModuleType(ext))
    monkeypatch.setattr(vllm_radix, "NAMESPACE", "dsa_ops_test_no_such_ops")
    sup = vllm_radix._available()
    assert not sup and "persistent_topk" in sup.reason and "cooperative_topk" in sup.reason


def test_vllm_radix_records_are_registered_decode_only():
    reg = dsa_ops.backends()
    assert reg["vllm_persistent"] is vllm_radix.PERSISTENT and reg["vllm_cooperative"] is vllm_radix.COOPERATIVE
    for b in vllm_radix.BACKENDS:
        assert b.decode is not None and b.prefill is None and b.version() == module_version("vllm")
        with pytest.raises(ValueError, match="prefill"):
            ops.backend_op(b.name, "prefill")
    # Measured on the H200 (docs/vllm-kernels.md): exact on finite logits, ties included,
    # but special values (NaN, -0, +-inf) leave the contract's key order.
    assert vllm_radix.PERSISTENT.exact is False and vllm_radix.COOPERATIVE.exact is False


def _real_or_skip(record, width: int, k: int) -> None:
    sup = record.check(Query("decode", "cuda", k, width))
    if not sup:
        pytest.skip(f"{record.name} cannot run here: {sup.reason}")


@pytest.mark.parametrize("record, rows", [(vllm_radix.PERSISTENT, 16), (vllm_radix.PERSISTENT, 48),
                                          (vllm_radix.COOPERATIVE, 16), (vllm_radix.COOPERATIVE, 80)],
                         ids=["persistent-16", "persistent-48", "cooperative-16", "cooperative-80"])
def test_real_vllm_radix_backend_matches_reference(gen, record, rows):
    """Runs only where vLLM's compiled ops import on a CUDA GPU (SM90+ for cooperative)."""
    width, k = 40_000, 2048
    _real_or_skip(record, width, k)
    pool = torch.tensor([0, 1, 2047, 2048, 2049, 9000, 33_000, 40_000, 90_000])  # every kernel path
    lengths = pool[torch.randint(0, len(pool), (rows,), generator=gen)].to(torch.int32)
    kind = "ties"  # measured exact on ties (tests/test_vllm_real_kernels.py); special values are not
    x = data.logits(gen, rows, width, kind).cuda()
    got = dsa_ops.topk_decode(x, lengths.cuda(), k, backend=record.name, out=data.poisoned_out(rows, k).cuda())
    assert_decode_equivalent(got, x, lengths, k)


@pytest.mark.parametrize("record", [vllm_radix.PERSISTENT, vllm_radix.COOPERATIVE], ids=lambda b: b.name)
def test_real_vllm_radix_backend_cuda_graph_replay(gen, record):
    """Captured once, replayed with new device lengths (workspace and memset are graph nodes)."""
    rows, width, k = 8, 40_000, 2048
    _real_or_skip(record, width, k)
    x = data.logits(gen, rows, width, "randn").cuda()
    lengths = torch.full((rows,), width, dtype=torch.int32, device="cuda")
    out = torch.empty(rows, k, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        dsa_ops.topk_decode(x, lengths, k, backend=record.name, out=out)  # warm-up: allocates the workspace
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            dsa_ops.topk_decode(x, lengths, k, backend=record.name, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    for new in ([0, 1, 2048, 2049, 33_000, 40_000, 5, 39_999], [40_000] * rows):
        lengths.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        assert_decode_equivalent(out, x, lengths, k)


def test_bench_raw_columns_call_the_kernel_alone(radix, gen):
    """dsa-ops bench's raw columns: the op itself on lengths already clamped, plus only the -1
    fill for cooperative's raw+fill; cooperative has no raw column above 64 rows."""
    from dsa_ops.commands import bench_raw

    assert bench_raw.raw_names(["triton", "vllm_persistent", "vllm_cooperative"]) == [
        "vllm_persistent:raw", "vllm_cooperative:raw", "vllm_cooperative:raw+fill"]
    assert not bench_raw.supported("vllm_cooperative:raw+fill", 65) and bench_raw.supported("vllm_persistent:raw", 65)
    x = data.logits(gen, 3, 600, "randn")
    lens = torch.tensor([5, 700, 600], dtype=torch.int32)
    for raw, fn in (("vllm_persistent:raw", "persistent"), ("vllm_cooperative:raw+fill", "cooperative")):
        radix.log.calls.clear()
        out = torch.full((3, 512), 9, dtype=torch.int32)
        bench_raw.raw_call(raw, x, lens, 512, out)()
        (call,) = radix.log.calls
        assert call["fn"] == fn and call["lengths"].tolist() == [5, 600, 600] and call["max_seq_len"] == 600
        assert_decode_equivalent(out, x, lens, 512)
    with pytest.raises(ValueError, match="raw"):
        bench_raw.raw_call("vllm_x:raw", x, lens, 512, out)
