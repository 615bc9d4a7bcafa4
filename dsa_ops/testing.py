"""Checkers that every backend's tests reuse: order-free, tie-tolerant comparison.

A result conforms to the contract when, per row r with window [s_r, e_r) and
m_r = min(e_r - s_r, k): the first m_r slots hold distinct indices in [0, e_r - s_r),
the rest are -1, and the multiset of keys (contract §1.1) at the chosen columns equals
the multiset of the m_r best keys of the window. Comparing key multisets is what makes
the check tie-tolerant: any choice among equal keys passes, nothing else does. With
``stable=True`` the result must equal the reference exactly.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from dsa_ops.backends import reference
from dsa_ops.backends.rows import row_lengths
from dsa_ops.validate import decode_layout

POISON = 0x7EAD_BEEF  # what a poisoned ``out`` slot starts as: neither a column nor -1, so an unwritten slot shows


def _fail(msg: str, r: int, got: Tensor, want: Tensor) -> None:
    raise AssertionError(
        f"row {r}: {msg}\n  got[:16]  = {got[r, :16].tolist()}\n  want[:16] = {want[r, :16].tolist()}"
    )


def assert_window_equivalent(
    got: Tensor, logits: Tensor, starts: Tensor, ends: Tensor, k: int, *, stable: bool = False
) -> None:
    """Check ``got`` (R, k) against the contract for windows [starts, ends) (clamped to [0, W]).

    Raises AssertionError naming the first bad row and what is wrong with it.
    """
    rows, width = logits.shape
    assert got.dtype == torch.int32, f"dtype {got.dtype}, expected torch.int32"
    assert tuple(got.shape) == (rows, k), f"shape {tuple(got.shape)}, expected {(rows, k)}"
    if rows == 0:
        return
    # Everything stays on the logits' device: checking thousands of GPU replays is cheap.
    dev = logits.device
    got = got.to(dev)
    s = starts.to(dev, torch.int64).clamp(0, width)
    e = ends.to(dev, torch.int64).clamp(0, width)
    want = torch.empty((rows, k), dtype=torch.int32, device=dev)
    reference.select_window(logits, s, e, k, want)
    if stable:
        bad = (got != want).any(dim=1)
        if bool(bad.any()):
            _fail("stable result differs from the reference", int(bad.nonzero()[0, 0]), got, want)
        return
    length = (e - s).clamp(min=0)
    bad = shape_violation(got, length, k)
    if bad is not None:
        _fail(bad[0], bad[1], got, want)
    g = got.to(torch.int64)
    valid_slot = torch.arange(k, device=dev)[None, :] < length.clamp(max=k)[:, None]
    # Same key multiset as the reference's choice (tie-tolerant set comparison).
    cols_got = torch.where(valid_slot, g + s[:, None], 0).clamp(0, max(width - 1, 0))
    cols_want = torch.where(valid_slot, want.to(torch.int64) + s[:, None], 0).clamp(0, max(width - 1, 0))
    if width == 0:
        return
    keys = reference.order_key(logits)
    kg = torch.where(valid_slot, torch.gather(keys, 1, cols_got), -1)
    kw = torch.where(valid_slot, torch.gather(keys, 1, cols_want), -1)
    bad = (torch.sort(kg, dim=1).values != torch.sort(kw, dim=1).values).any(dim=1)
    if bool(bad.any()):
        _fail("chosen keys differ from the k best keys (not a tie)", int(bad.nonzero()[0, 0]), got, want)


def shape_violation(got: Tensor, length: Tensor, k: int) -> Optional[tuple[str, int]]:
    """The contract's shape, which every backend meets, exact on special values or not: per row
    r, the first min(L_r, k) slots hold distinct indices in [0, L_r) and the rest are -1.
    ``length``: (R,) window lengths, already clamped to [0, W]. (what is wrong, the first bad
    row), or None."""
    g = got.to(length.device, torch.int64)
    slot = torch.arange(k, device=length.device)[None, :]
    valid_slot = slot < length.to(torch.int64).clamp(max=k)[:, None]
    bad_tail = (~valid_slot & (g != -1)).any(dim=1)
    bad_range = (valid_slot & ((g < 0) | (g >= length[:, None]))).any(dim=1)
    # Distinct: the sorted valid prefix has no equal neighbours.
    srt = torch.sort(torch.where(valid_slot, g, -1 - slot), dim=1).values
    dup = ((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)).any(dim=1)
    for name, bad in (("slots past min(L, k) must be -1", bad_tail), ("index outside [0, L)", bad_range),
                      ("duplicate index", dup)):
        if bool(bad.any()):
            return name, int(bad.nonzero()[0, 0])
    return None


def assert_decode_equivalent(
    got: Tensor, logits: Tensor, lengths: Tensor, k: int, next_n: int = 1, *, stable: bool = False
) -> None:
    """:func:`assert_window_equivalent` for a decode call (any lengths layout)."""
    rows, width = logits.shape
    layout = decode_layout(lengths, rows, next_n)
    ends = row_lengths(lengths.to(logits.device), rows, next_n, layout, clamp_to=width)
    assert_window_equivalent(got, logits, torch.zeros_like(ends), ends, k, stable=stable)


def assert_prefill_equivalent(
    got: Tensor, logits: Tensor, row_starts: Tensor, row_ends: Tensor, k: int, *, stable: bool = False
) -> None:
    """:func:`assert_window_equivalent` for a prefill call (sequence-local indices)."""
    assert_window_equivalent(got, logits, row_starts, row_ends, k, stable=stable)


def sample_rows(rows: int, n: int) -> Tensor:
    """Up to ``n`` row indices of ``rows`` to check against the reference: the first, the last
    and evenly spaced ones between (what the bench and calibrate check before they time)."""
    return torch.unique(torch.linspace(0, rows - 1, steps=min(rows, n)).round().long())


# The generic checker's other name (the one the style guide's test sketch uses).
assert_topk_equivalent = assert_window_equivalent
