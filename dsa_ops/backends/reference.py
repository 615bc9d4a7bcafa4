"""The reference backend: the definition of the function, in plain PyTorch (CPU and GPU).

Ranking follows contract §1.1 exactly: each fp32 value maps to an unsigned 32-bit key
(sign clear: bits ^ 0x7FFFFFFF; sign set: bits unchanged) and the k *smallest* keys win,
so a sign-clear NaN beats +inf, a sign-set NaN loses to -inf and -0.0 ranks below +0.0.
Ties are broken by the lowest column, and the valid prefix is written in ascending index
order; that is the ``stable`` result, and the reference returns it in both modes (any
conforming tie choice and order is allowed when ``stable=False``).

Graph safety: no ``.item()``, no host branch on device data; the row-chunk loop depends
on (R, W) only. Columns at or past a row's length are read (whole rows are loaded) but
masked to a key worse than any real one before ranking, so their values never matter.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_ops.backends.base import YES, Backend, Query, Support
from dsa_ops.backends.rows import decode_ends, prefill_windows

_SIGN = 1 << 31
_MASKED = torch.iinfo(torch.int64).max  # worse than any (key << 31 | column)
_ABSENT = torch.iinfo(torch.int64).max  # placeholder for a -1 slot while sorting
_CHUNK_ELEMS = 1 << 24  # rows per pass bounded to ~16M elements (about 128 MiB of int64)


def order_key(logits: Tensor) -> Tensor:
    """int64 keys of contract §1.1 in [0, 2^32): smaller key = better value."""
    bits = logits.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return torch.where(bits < _SIGN, bits ^ 0x7FFFFFFF, bits)


def select_window(logits: Tensor, starts: Tensor, ends: Tensor, k: int, out: Tensor) -> None:
    """Core of both families: per row r, the best min(L, k) columns of [s_r, e_r).

    starts / ends are int64 (R,), already clamped to [0, W]; an empty or inverted window
    gives an all -1 row. Writes ``j - s_r`` for each chosen column j, ascending, then -1.
    """
    rows, width = logits.shape
    if rows == 0:
        return
    m = min(k, width)
    out[:, m:].fill_(-1)
    if m == 0:
        return
    step = max(1, _CHUNK_ELEMS // max(width, 1))
    col = torch.arange(width, device=logits.device, dtype=torch.int64)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        s, e = starts[r0:r1, None], ends[r0:r1, None]
        comp = (order_key(logits[r0:r1]) << 31) | col
        comp = torch.where((col >= s) & (col < e), comp, _MASKED)
        best, idx = torch.topk(comp, m, dim=1, largest=False, sorted=True)
        # A slot is valid iff it got a real column: the first min(L, k) slots.
        local = torch.where(best != _MASKED, idx - s, _ABSENT)
        local = torch.sort(local, dim=1).values
        out[r0:r1, :m] = torch.where(local == _ABSENT, -1, local).to(torch.int32)


def decode(logits: Tensor, lengths: Tensor, k: int, next_n: int, stable: bool, out: Tensor) -> None:
    """Decode writer: row r's window is [0, clamp(L_r, 0, W))."""
    ends = decode_ends(logits, lengths, next_n)
    select_window(logits, torch.zeros_like(ends), ends, k, out)


def prefill(logits: Tensor, row_starts: Tensor, row_ends: Tensor, k: int, stable: bool, out: Tensor) -> None:
    """Prefill writer: row r's window is [s_r, e_r) clamped to [0, W]; indices are j - s_r."""
    select_window(logits, *prefill_windows(logits, row_starts, row_ends), k, out)


def _supports(query: Query) -> Support:
    return YES


BACKEND = Backend(
    name="reference",
    decode=decode,
    prefill=prefill,
    available=lambda: YES,
    supports=_supports,
    version=lambda: torch.__version__,
    description="pure PyTorch, exact key order, stable result (the oracle)",
)
