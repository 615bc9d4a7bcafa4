"""Property tests (hypothesis): whatever the data, lengths and k, every row holds min(L, k)
distinct indices in [0, L) then -1, and the chosen keys dominate every unchosen key of the
window. Run for each backend that is exact on the data drawn (torch_topk is exact=False,
so it only sees data without NaN, -inf and -0)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import dsa_ops
from tests import data, oracle

MAX_ROWS, MAX_WIDTH, MAX_K = 5, 48, 56

_TIES = [0x3F80_0000, 0x4000_0000, 0xBF80_0000, 0x0000_0000]  # 1, 2, -1, +0: frequent ties


def _any_bits():
    """Any fp32 pattern, biased towards specials and repeated values."""
    return st.one_of(
        st.sampled_from(list(data.SPECIAL_BITS.values())),
        st.sampled_from(_TIES),
        st.integers(0, 2**32 - 1),
    )


def _plain_bits():
    """Patterns torch.topk orders like the contract: no NaN, no -inf, no -0."""
    finite = st.floats(width=32, allow_nan=False, allow_infinity=False).filter(
        lambda f: not (f == 0 and str(f).startswith("-"))
    )
    as_bits = finite.map(lambda f: int(data.bits_of(torch.tensor([f], dtype=torch.float32))[0]))
    return st.one_of(st.sampled_from(_TIES), st.just(data.SPECIAL_BITS["+inf"]), as_bits)


@st.composite
def _logits(draw, rows: int, exact: bool):
    width = draw(st.integers(0, MAX_WIDTH))
    bits = draw(st.lists(_any_bits() if exact else _plain_bits(), min_size=rows * width, max_size=rows * width))
    x = data.from_bits(bits).reshape(rows, width)
    if rows and draw(st.booleans()):
        x = data.sliced(x, extra=draw(st.integers(1, 5)))  # row pitch > W, NaN in the gap
    return x


@st.composite
def decode_case(draw, exact: bool):
    layout = draw(st.sampled_from(["per_row", "per_row_2d", "per_request"]))
    next_n = draw(st.sampled_from([1, 2, 4]))
    groups = draw(st.integers(0, MAX_ROWS // next_n))
    rows = groups * next_n  # with next_n > 1 the rows are whole requests in every layout
    x = draw(_logits(rows, exact))
    n = groups if layout == "per_request" else rows
    vals = draw(st.lists(st.integers(-3, x.shape[1] + 3), min_size=n, max_size=n))
    lengths = data.i32(vals).reshape(groups, next_n) if layout == "per_row_2d" else data.i32(vals)
    k = draw(st.integers(1, MAX_K))
    per_row = oracle.decode_lengths(lengths, rows, next_n, "per_request" if layout == "per_request" else "per_row",
                                    x.shape[1])
    return x, lengths, next_n, k, [(0, n) for n in per_row]


@st.composite
def prefill_case(draw, exact: bool):
    rows = draw(st.integers(0, MAX_ROWS))
    x = draw(_logits(rows, exact))
    bound = st.integers(-3, x.shape[1] + 3)
    starts = data.i32(draw(st.lists(bound, min_size=rows, max_size=rows)))
    ends = data.i32(draw(st.lists(bound, min_size=rows, max_size=rows)))
    k = draw(st.integers(1, MAX_K))
    return x, starts, ends, k, oracle.prefill_windows(starts, ends, x.shape[1])


def assert_topk_properties(got, x, windows, k):
    assert got.dtype == torch.int32 and tuple(got.shape) == (x.shape[0], k)
    for r, (s, e) in enumerate(windows):
        length, row = e - s, got[r].tolist()
        m = min(length, k)
        assert row[m:] == [-1] * (k - m), f"row {r}: slots from {m} must be -1: {row}"
        chosen = row[:m]
        assert all(0 <= i < length for i in chosen) and len(set(chosen)) == m, f"row {r}: {chosen}"
        keys = oracle.row_keys(x[r, s:e])
        rest = set(range(length)) - set(chosen)
        if chosen and rest:
            assert max(keys[i] for i in chosen) <= min(keys[j] for j in rest), f"row {r}: a better key was left out"


def _backends(family: str) -> list:
    return [pytest.param(p.values[0], id=p.id, marks=p.marks) for p in data.backend_params(family)]


@pytest.mark.parametrize("backend", _backends("decode"))
@given(st.data())
def test_decode_properties(backend, draws):
    x, lengths, next_n, k, windows = draws.draw(decode_case(backend.exact))
    got = dsa_ops.topk_decode(x, lengths, k, next_n, backend=backend.name)
    assert_topk_properties(got, x, windows, k)


@pytest.mark.parametrize("backend", _backends("prefill"))
@given(st.data())
def test_prefill_properties(backend, draws):
    x, starts, ends, k, windows = draws.draw(prefill_case(backend.exact))
    got = dsa_ops.topk_prefill(x, starts, ends, k, backend=backend.name)
    assert_topk_properties(got, x, windows, k)


@given(decode_case(exact=True))
def test_decode_stable_is_the_oracle(case):
    """Stable: lowest index wins ties, prefix ascending: exactly the oracle's answer."""
    x, lengths, next_n, k, windows = case
    got = dsa_ops.topk_decode(x, lengths, k, next_n, stable=True)
    assert torch.equal(got, oracle.topk_windows(x, windows, k))


@given(prefill_case(exact=True))
def test_prefill_stable_is_the_oracle(case):
    x, starts, ends, k, windows = case
    got = dsa_ops.topk_prefill(x, starts, ends, k, stable=True)
    assert torch.equal(got, oracle.topk_windows(x, windows, k))
