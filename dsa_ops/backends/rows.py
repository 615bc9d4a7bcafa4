"""Row bounds every backend adapter derives the same way (contract §1.1, §1.2).

Each helper is a few graph-safe torch ops on host-known shapes: no sync, no branch on
device data.
"""

from __future__ import annotations

import torch
from torch import Tensor


def decode_ends(logits: Tensor, lengths: Tensor, next_n: int, dtype: torch.dtype = torch.int64) -> Tensor:
    """One length per logits row, from any accepted lengths layout, clamped to [0, W].

    Returns a contiguous (R,) tensor of ``dtype`` (int32 for kernels that read it flat).
    """
    from dsa_ops.backends.reference import row_lengths
    from dsa_ops.validate import decode_layout

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
