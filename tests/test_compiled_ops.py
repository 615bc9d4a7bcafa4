"""The public API and the ops under torch.compile(fullgraph=True): same results as eager,
no recompile when device values change, fake kernels that handle symbolic row counts."""

from __future__ import annotations

import pytest
import torch

import dsa_ops
from tests import data, oracle

W, K = 300, 32
pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _decode_inputs(gen, rows=6):
    x = data.logits(gen, rows, W, "ties")
    lengths = data.i32([0, 1, K - 1, K, K + 1, W, W + 4, 150][:rows])
    return x, lengths


def _prefill_inputs(gen):
    x = data.logits(gen, 6, W, "ties")
    return x, data.i32([0, 5, 100, 290, -2, 40]), data.i32([0, 60, 300, 350, 20, 10])


@pytest.mark.parametrize("out", [False, True], ids=["functional", "out"])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_decode_compiled_matches_eager(gen, backend, out):
    x, lengths = _decode_inputs(gen)

    def f(x, lengths, buf):
        return dsa_ops.topk_decode(x, lengths, K, out=buf if out else None)

    want = f(x, lengths, data.poisoned_out(6, K))
    buf = data.poisoned_out(6, K)
    got = torch.compile(f, fullgraph=True, backend=backend)(x, lengths, buf)
    assert torch.equal(got, want) and torch.equal(want, oracle.topk_decode(x, lengths, K))
    if out:
        assert torch.equal(buf, want), "the compiled out= call did not write the caller's buffer"


@pytest.mark.parametrize("out", [False, True], ids=["functional", "out"])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_prefill_compiled_matches_eager(gen, backend, out):
    x, starts, ends = _prefill_inputs(gen)

    def f(x, starts, ends, buf):
        return dsa_ops.topk_prefill(x, starts, ends, K, out=buf if out else None)

    want = f(x, starts, ends, data.poisoned_out(6, K))
    buf = data.poisoned_out(6, K)
    got = torch.compile(f, fullgraph=True, backend=backend)(x, starts, ends, buf)
    assert torch.equal(got, want) and torch.equal(want, oracle.topk_prefill(x, starts, ends, K))
    if out:
        assert torch.equal(buf, want)


def test_inductor_decode_prefill_and_out(gen):
    """One inductor compile (slow on small CPUs) covering both families and an out= call."""
    x, lengths = _decode_inputs(gen)
    _, starts, ends = _prefill_inputs(gen)

    def f(x, lengths, starts, ends, buf):
        d = dsa_ops.topk_decode(x * 2.0, lengths, K, stable=True)
        p = dsa_ops.topk_prefill(x, starts, ends, K)
        dsa_ops.topk_decode(x, lengths.flip(0), K, out=buf)
        return d, p

    want = f(x, lengths, starts, ends, data.poisoned_out(6, K))
    buf = data.poisoned_out(6, K)
    got = torch.compile(f, fullgraph=True, backend="inductor")(x, lengths, starts, ends, buf)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert torch.equal(buf, oracle.topk_decode(x, lengths.flip(0), K))


def test_new_lengths_replay_without_recompile(gen):
    """Lengths are device data: new values reuse the graph (no host decision on them)."""
    x, lengths = _decode_inputs(gen)
    f = torch.compile(lambda x, l: dsa_ops.topk_decode(x, l, K), fullgraph=True, backend="aot_eager")
    f(x, lengths)
    with torch.compiler.set_stance("fail_on_recompile"):
        for _ in range(5):
            new = torch.randint(-5, W + 6, (6,), generator=gen, dtype=torch.int32)
            assert torch.equal(f(x, new), oracle.topk_decode(x, new, K))


@pytest.mark.parametrize("next_n", [1, 2])
def test_dynamic_row_count(gen, next_n):
    """mark_dynamic rows: one graph serves every batch size, through the public API."""

    def f(x, lengths):
        return dsa_ops.topk_decode(x, lengths, K, next_n)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    layout = "per_request" if next_n > 1 else "per_row"
    for i, batch in enumerate((3, 5, 8)):
        x = data.logits(gen, batch * next_n, W, "randn")
        lengths = torch.randint(0, W + 1, (batch,), generator=gen, dtype=torch.int32)
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(lengths, 0)
        with torch.compiler.set_stance("fail_on_recompile" if i else "default"):
            got = compiled(x, lengths)
        assert torch.equal(got, oracle.topk_decode(x, lengths, K, next_n, layout))


def _selected(mask: torch.Tensor) -> torch.Tensor:
    return torch.nonzero(mask).squeeze(1)  # data-dependent length: an unbacked row count


@pytest.mark.parametrize("out", [False, True], ids=["functional", "out"])
@pytest.mark.parametrize("family", ["decode", "prefill"])
def test_unbacked_row_count_ops(gen, family, out):
    """Rows picked by torch.nonzero have an unbacked count; the fake kernels must accept it."""
    x, starts, ends = _prefill_inputs(gen)
    mask = torch.tensor([1, 0, 1, 1, 0, 1], dtype=torch.bool)
    op = dsa_ops.ops.generic_op(family, out=out)

    def f(x, starts, ends, mask):
        idx = _selected(mask)
        bounds = (ends[idx],) if family == "decode" else (starts[idx], ends[idx])
        if family == "decode":
            args = (x[idx], *bounds, K, 1, 1, False)
        else:
            args = (x[idx], *bounds, K, 1, False)
        if not out:
            return op(*args)
        buf = x.new_empty((idx.shape[0], K), dtype=torch.int32)
        op(*args, buf)
        return buf

    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        got = torch.compile(f, fullgraph=True, backend="aot_eager")(x, starts, ends, mask)
    assert torch.equal(got, f(x, starts, ends, mask))
    assert got.shape == (4, K)


@pytest.mark.parametrize("family", ["decode", "prefill"])
def test_unbacked_row_count_api(gen, family):
    """The same through dsa_ops.topk_*: the host checks must not guard on an unbacked size."""
    x, starts, ends = _prefill_inputs(gen)
    mask = torch.tensor([1, 1, 0, 1, 0, 1], dtype=torch.bool)

    def f(x, starts, ends, mask):
        idx = _selected(mask)
        if family == "decode":
            return dsa_ops.topk_decode(x[idx], ends[idx], K)
        return dsa_ops.topk_prefill(x[idx], starts[idx], ends[idx], K)

    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        got = torch.compile(f, fullgraph=True, backend="aot_eager")(x, starts, ends, mask)
    assert torch.equal(got, f(x, starts, ends, mask))


def test_bad_input_under_compile_names_the_argument(gen):
    """Host checks run at trace time too; without fullgraph the user's ValueError surfaces."""
    x, lengths = _decode_inputs(gen)
    f = torch.compile(lambda x, lengths: dsa_ops.topk_decode(x, lengths, K), backend="aot_eager")
    with pytest.raises(ValueError, match="^lengths:"):
        f(x, lengths[:-1])
    with pytest.raises(ValueError, match="^logits:"):
        f(x.double(), lengths)
