"""dsa_ops.testing's checkers: they must reject every kind of wrong answer and accept
every conforming one (any tie choice, any order unless stable)."""

from __future__ import annotations

import pytest
import torch

from dsa_ops.testing import (
    assert_decode_equivalent,
    assert_prefill_equivalent,
    assert_topk_equivalent,
    assert_window_equivalent,
)
from tests import data, oracle

K = 8


def _case():
    """Row 0: 20 columns, values 3 x4 at cols 0..3, then 2 x10 at cols 4..13, then 1 x6.
    With L = 20 and k = 8 the cut-off falls inside the 2s: 4 threes + 4 of the 10 twos.
    Row 1: L = 5 < k (all five columns, then -1). Row 2: L = 0 (all -1)."""
    row = [3.0] * 4 + [2.0] * 10 + [1.0] * 6
    x = torch.tensor([row, row, row])
    ends = data.i32([20, 5, 0])
    starts = torch.zeros(3, dtype=torch.int32)
    want = oracle.topk_windows(x, [(0, 20), (0, 5), (0, 0)], K)
    return x, starts, ends, want


def test_accepts_the_oracle_answer():
    x, s, e, want = _case()
    assert_window_equivalent(want, x, s, e, K)
    assert_window_equivalent(want, x, s, e, K, stable=True)


def test_accepts_tie_swap_and_any_order():
    x, s, e, want = _case()
    got = want.clone()
    got[0, 4:8] = data.i32([13, 9, 11, 6])  # other twos: a different, equally valid tie choice
    got[0] = got[0, torch.randperm(K, generator=torch.Generator().manual_seed(1))]  # any order
    got[1, :5] = got[1, :5].flip(0)
    assert_window_equivalent(got, x, s, e, K)
    with pytest.raises(AssertionError, match="stable"):
        assert_window_equivalent(got, x, s, e, K, stable=True)


WRONG = {
    # name: (row, slot, value, message fragment)
    "duplicate": (0, 1, 0, "duplicate"),
    "out_of_range_high": (0, 0, 20, "outside"),
    "out_of_range_past_L": (1, 0, 5, "outside"),
    "minus_one_in_prefix": (1, 2, -1, "outside"),
    "wrong_set": (0, 7, 15, "keys differ"),  # a 1 instead of a 2
    "wrong_tail": (1, 6, 0, "past min"),
    "tail_of_empty_row": (2, 0, 0, "past min"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_rejects_wrong_answer(name):
    row, slot, value, msg = WRONG[name]
    x, s, e, want = _case()
    got = want.clone()
    got[row, slot] = value
    assert not torch.equal(got, want)
    with pytest.raises(AssertionError, match=msg):
        assert_window_equivalent(got, x, s, e, K)


def test_rejects_wrong_dtype_and_shape():
    x, s, e, want = _case()
    with pytest.raises(AssertionError, match="dtype"):
        assert_window_equivalent(want.long(), x, s, e, K)
    with pytest.raises(AssertionError, match="shape"):
        assert_window_equivalent(want[:, :-1], x, s, e, K)


def test_keys_not_values_decide():
    """+0 and -0 compare equal as floats but not as keys: picking -0 over +0 is wrong; a
    NaN with its sign set ranks last, so picking it over -inf is wrong too."""
    b = data.SPECIAL_BITS
    x = data.from_bits([[b["+0"], b["-0"], b["+1"]], [b["-inf"], b["-nan"], b["+1"]]])
    s, e = torch.zeros(2, dtype=torch.int32), data.i32([3, 3])
    good = data.i32([[0, 2], [0, 2]])
    assert_window_equivalent(good, x, s, e, 2)
    for bad in (data.i32([[1, 2], [0, 2]]), data.i32([[0, 2], [1, 2]])):
        with pytest.raises(AssertionError, match="keys differ"):
            assert_window_equivalent(bad, x, s, e, 2)


def test_decode_wrapper_uses_the_lengths_layout():
    """Per request with next_n = 2: rows get L = lengths[b] - 1 and lengths[b]."""
    x = torch.arange(12.0).repeat(4, 1)  # best columns are the last ones of each window
    lengths = data.i32([6, 3])  # rows: L = 5, 6, 2, 3
    want = oracle.topk_decode(x, lengths, 4, 2, "per_request")
    assert_decode_equivalent(want, x, lengths, 4, 2, stable=True)
    per_row_view = oracle.topk_decode(x, data.i32([6, 6, 3, 3]), 4)  # what a misread layout gives
    assert not torch.equal(per_row_view, want)
    with pytest.raises(AssertionError):
        assert_decode_equivalent(per_row_view, x, lengths, 4, 2)


def test_prefill_wrapper_uses_sequence_local_indices():
    x = torch.arange(30.0).repeat(2, 1)
    starts, ends = data.i32([10, 0]), data.i32([14, 3])
    local = data.i32([[0, 1, 2, 3, -1], [0, 1, 2, -1, -1]])
    assert_prefill_equivalent(local, x, starts, ends, 5)
    glob = data.i32([[10, 11, 12, 13, -1], [0, 1, 2, -1, -1]])  # chunk-global columns (AITER's space)
    with pytest.raises(AssertionError, match="outside"):
        assert_prefill_equivalent(glob, x, starts, ends, 5)


def test_generic_alias_is_the_window_checker():
    assert assert_topk_equivalent is assert_window_equivalent


def test_sample_rows_keeps_the_first_and_last_row_and_at_most_n():
    """The rows bench and calibrate check: first, last, evenly spaced, never more than n."""
    from dsa_ops.testing import sample_rows

    assert sample_rows(1, 8).tolist() == [0]
    assert sample_rows(5, 8).tolist() == [0, 1, 2, 3, 4]
    got = sample_rows(512, 64).tolist()
    assert len(got) == 64 and got[0] == 0 and got[-1] == 511 and got == sorted(set(got))
