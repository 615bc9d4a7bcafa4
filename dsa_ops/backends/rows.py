"""Row bounds every backend adapter derives the same way (contract §1.1, §1.2).

Each helper is a few graph-safe torch ops on host-known shapes: no sync, no branch on
device data.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_ops.validate import decode_layout


def row_lengths(lengths: Tensor, rows: int, next_n: int, layout: str, clamp_to: int | None) -> Tensor:
    """Per-row lengths (int64, shape (rows,)) from any accepted layout of contract §1.1.

    ``layout`` comes from :func:`dsa_ops.validate.decode_layout`. ``per_request``:
    row r reads lengths[r // next_n] - next_n + 1 + r % next_n. Clamped to
    [0, clamp_to] unless ``clamp_to`` is None.
    """
    flat = lengths.reshape(-1).to(torch.int64)
    if layout == "per_request" and next_n > 1:
        r = torch.arange(rows, device=lengths.device)
        flat = flat[r // next_n] - next_n + 1 + r % next_n
    if clamp_to is not None:
        flat = flat.clamp(0, clamp_to)
    return flat


def decode_ends(logits: Tensor, lengths: Tensor, next_n: int, dtype: torch.dtype = torch.int64) -> Tensor:
    """One length per logits row, from any accepted lengths layout, clamped to [0, W].

    Returns a contiguous (R,) tensor of ``dtype`` (int32 for kernels that read it flat).
    """
    rows, width = logits.shape
    ends = row_lengths(lengths, rows, next_n, decode_layout(lengths, rows, next_n), clamp_to=width)
    return ends.to(dtype).contiguous()


def prefill_windows(logits: Tensor, row_starts: Tensor, row_ends: Tensor,
                    dtype: torch.dtype = torch.int64) -> tuple[Tensor, Tensor]:
    """Windows clamped to 0 <= s <= e <= W (an inverted window becomes empty, e = s)."""
    width = logits.shape[1]
    s = row_starts.to(dtype).clamp(0, width)
    e = torch.maximum(row_ends.to(dtype).clamp(0, width), s)
    return s, e


def row_pitch(logits: Tensor) -> int:
    """The row pitch a kernel should use: stride(0), or the width for a single row (whose
    stride(0) is arbitrary and unchecked)."""
    rows, width = logits.shape
    return int(logits.stride(0)) if rows > 1 else int(width)
