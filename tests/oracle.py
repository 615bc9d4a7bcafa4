"""Brute-force top-k oracle, written from contract §1.1 and independent of ``dsa_ops``.

Keys: the raw fp32 bits of each logit, read with :mod:`struct` (small rows) or a numpy
``uint32`` view (large rows); a sign-clear pattern maps to ``bits ^ 0x7FFFFFFF``, a
sign-set one keeps its bits, and the smallest key is the best value. The stable answer
of a window is its ``min(L, k)`` best columns by ``(key, column)``, in ascending column
order, then -1. Nothing here calls into ``dsa_ops``, so a bug in the reference backend
cannot hide in its own oracle.
"""

from __future__ import annotations

import struct
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

SIGN = 0x8000_0000
# Rows at least this long use the vectorised numpy path; shorter ones the pure-Python sort.
NUMPY_FROM = 20_000


def key_of_bits(bits: int) -> int:
    """Contract §1.1 key of one fp32 bit pattern (unsigned 32-bit int): smaller is better."""
    return bits ^ 0x7FFF_FFFF if bits < SIGN else bits


def row_bits(row: Tensor) -> list[int]:
    """The unsigned fp32 bit patterns of a 1-D float32 CPU tensor, via struct."""
    raw = row.detach().cpu().contiguous().numpy().tobytes()
    return list(struct.unpack(f"<{row.numel()}I", raw))


def row_keys(row: Tensor) -> list[int]:
    return [key_of_bits(b) for b in row_bits(row)]


def np_keys(row: Tensor) -> np.ndarray:
    """Vectorised :func:`row_keys` (uint32 array)."""
    bits = row.detach().cpu().contiguous().numpy().view(np.uint32)
    return np.where(bits < np.uint32(SIGN), bits ^ np.uint32(0x7FFF_FFFF), bits)


def best_columns(keys: Sequence[int], m: int) -> list[int]:
    """The m best columns by (key, column), in ascending column order (pure Python)."""
    return sorted(sorted(range(len(keys)), key=lambda c: (keys[c], c))[:m])


def best_columns_np(keys: np.ndarray, m: int) -> list[int]:
    """:func:`best_columns` for long rows: lexsort by key, then column."""
    order = np.lexsort((np.arange(keys.size), keys))[:m]
    return np.sort(order).tolist()


def window_topk(row: Tensor, start: int, end: int, k: int) -> list[int]:
    """Stable answer for one row's window [start, end) (already clamped): local indices then -1."""
    length = max(end - start, 0)
    m = min(length, k)
    win = row[start : start + length]
    if length >= NUMPY_FROM:
        picked = best_columns_np(np_keys(win), m)
    else:
        picked = best_columns(row_keys(win), m)
    return picked + [-1] * (k - m)


def clamp(x: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, x))


def decode_lengths(lengths: Tensor, rows: int, next_n: int, layout: str, width: int) -> list[int]:
    """Per-row L_r of contract §1.1, clamped to [0, width].

    ``layout`` is what the test built: "per_row" (1-D (R,) or 2-D with R elements, read
    flat) or "per_request" ((B,) with R = B * next_n).
    """
    flat = [int(v) for v in lengths.reshape(-1).tolist()]
    if layout == "per_row":
        assert len(flat) == rows
        raw = flat
    elif layout == "per_request":
        assert len(flat) * next_n == rows
        raw = [flat[r // next_n] - next_n + 1 + r % next_n for r in range(rows)]
    else:
        raise AssertionError(f"unknown layout {layout!r}")
    return [clamp(v, 0, width) for v in raw]


def prefill_windows(row_starts: Tensor, row_ends: Tensor, width: int) -> list[tuple[int, int]]:
    """Per-row (start, end) clamped to [0, width]; an inverted window becomes empty."""
    out = []
    for s, e in zip(row_starts.tolist(), row_ends.tolist()):
        s, e = clamp(int(s), 0, width), clamp(int(e), 0, width)
        out.append((s, max(s, e)))
    return out


def topk_windows(logits: Tensor, windows: list[tuple[int, int]], k: int) -> Tensor:
    """Stable oracle answer (R, k) int32 for explicit per-row windows."""
    rows = logits.shape[0]
    assert len(windows) == rows
    res = [window_topk(logits[r], s, e, k) for r, (s, e) in enumerate(windows)]
    return torch.tensor(res, dtype=torch.int32).reshape(rows, k)


def topk_decode(logits: Tensor, lengths: Tensor, k: int, next_n: int = 1, layout: str = "per_row") -> Tensor:
    ls = decode_lengths(lengths, logits.shape[0], next_n, layout, logits.shape[1])
    return topk_windows(logits, [(0, n) for n in ls], k)


def topk_prefill(logits: Tensor, row_starts: Tensor, row_ends: Tensor, k: int) -> Tensor:
    return topk_windows(logits, prefill_windows(row_starts, row_ends, logits.shape[1]), k)


def assert_conforms(got: Tensor, logits: Tensor, windows: list[tuple[int, int]], k: int) -> None:
    """Tie-tolerant check of ``got`` against the oracle, with its own (non-dsa_ops) logic.

    Per row: the first min(L, k) slots are distinct indices in [0, L), the rest are -1, and
    the chosen keys are, as a multiset, the oracle's keys.
    """
    assert got.dtype == torch.int32 and tuple(got.shape) == (logits.shape[0], k), (got.dtype, got.shape)
    want = topk_windows(logits, windows, k)
    for r, (s, e) in enumerate(windows):
        g = got[r].tolist()
        m = min(e - s, k)
        assert g[m:] == [-1] * (k - m), f"row {r}: tail past m={m} is not all -1: {g[m:m + 8]}"
        prefix = g[:m]
        assert all(0 <= i < e - s for i in prefix), f"row {r}: index outside [0, {e - s}): {prefix[:8]}"
        assert len(set(prefix)) == m, f"row {r}: duplicate index"
        if e - s >= NUMPY_FROM:
            keys = np_keys(logits[r, s:e])
            assert np.array_equal(np.sort(keys[prefix]), np.sort(keys[want[r, :m].numpy()])), f"row {r}: keys"
        else:
            keys = row_keys(logits[r, s:e])
            assert sorted(keys[i] for i in prefix) == sorted(keys[i] for i in want[r, :m].tolist()), (
                f"row {r}: chosen keys are not the {m} best"
            )
