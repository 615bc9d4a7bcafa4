"""Baseline backend ``torch_topk``: mask the tail with -inf and call ``torch.topk``.

This is what vLLM's "torch" debug path does. It is here to be measured against, not to
be chosen: it is not exact per the contract (``exact=False``). It orders NaN and +-0 the
way torch does, and a -inf inside the window ties with the masked tail, so such a row can
get columns past its length. Those slots are turned into -1 by position, so every output
is still in range. It needs no workspace and is graph-safe.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_ops.backends.base import YES, Backend, Query, Support
from dsa_ops.backends.rows import decode_ends, prefill_windows


def _masked_topk(logits: Tensor, starts: Tensor, ends: Tensor, k: int, out: Tensor) -> None:
    rows, width = logits.shape
    if rows == 0:
        return
    m = min(k, width)
    out[:, m:].fill_(-1)
    if m == 0:
        return
    col = torch.arange(width, device=logits.device)
    valid = (col >= starts[:, None]) & (col < ends[:, None])
    masked = torch.where(valid, logits, float("-inf"))
    idx = torch.topk(masked, m, dim=1, sorted=True).indices  # valid picks first
    length = (ends - starts).clamp(min=0)[:, None]
    slot = torch.arange(m, device=logits.device)
    local = idx - starts[:, None]
    ok = (slot < length) & (local >= 0) & (local < length)
    out[:, :m] = torch.where(ok, local, -1).to(torch.int32)


def decode(logits: Tensor, lengths: Tensor, k: int, next_n: int, stable: bool, out: Tensor) -> None:
    ends = decode_ends(logits, lengths, next_n)
    _masked_topk(logits, torch.zeros_like(ends), ends, k, out)


def prefill(logits: Tensor, row_starts: Tensor, row_ends: Tensor, k: int, stable: bool, out: Tensor) -> None:
    _masked_topk(logits, *prefill_windows(logits, row_starts, row_ends), k, out)


def _supports(query: Query) -> Support:
    if query.stable:
        return Support(False, "torch.topk has no stable (lowest-index ties, ascending) mode")
    return YES


BACKEND = Backend(
    name="torch_topk",
    decode=decode,
    prefill=prefill,
    available=lambda: YES,
    supports=_supports,
    version=lambda: torch.__version__,
    description="baseline: tail masked to -inf, torch.topk (not exact on NaN/-inf/-0)",
    exact=False,
)
