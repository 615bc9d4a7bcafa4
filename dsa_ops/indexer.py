"""A small, honest DSA lightning-indexer decode step (DeepSeek-V3.2 style).

Per request b and cached token j: ``logit[b, j] = sum_h w[b, h] * relu(q[b, h] . k[b, j])``,
then the top-k columns of each row among its first ``lengths[b]`` tokens. The index keys
are cached per request in a dense (B, W, D) buffer (a stand-in for the paged cache);
columns at or past a request's length hold stale data, as they do in vLLM's workspace.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

import dsa_ops


def indexer_logits(q: Tensor, k_cache: Tensor, weights: Tensor) -> Tensor:
    """Weighted-ReLU indexer scores.

    Args:
        q: (R, H, D) index queries (bf16 or fp32).
        k_cache: (R, W, D) cached index keys, same dtype as q.
        weights: (R, H) per-head weights.

    Returns:
        (R, W) float32 logits.
    """
    scores = torch.einsum("rhd,rwd->rhw", q, k_cache).float().relu()
    return torch.einsum("rhw,rh->rw", scores, weights.float())


class IndexerTopK(nn.Module):
    """One indexer layer's scoring + top-k (the top-k stays its own graph node)."""

    def __init__(self, k: int = 2048, backend: Optional[str] = None) -> None:
        super().__init__()
        self.k, self.backend = k, backend

    def forward(self, q: Tensor, k_cache: Tensor, weights: Tensor, lengths: Tensor) -> Tensor:
        logits = indexer_logits(q, k_cache, weights)
        return dsa_ops.topk_decode(logits, lengths, self.k, backend=self.backend)


class DecodeStep(nn.Module):
    """``layers`` indexer layers in one decode step (GLM-5.2 has 21).

    Each layer has its own query projection of the shared hidden state; all layers score
    the same cached keys here, which keeps the example small without changing the
    top-k's work. Returns the stacked (layers, R, k) indices.
    """

    def __init__(self, layers: int, hidden: int, heads: int, dim: int, k: int = 2048,
                 backend: Optional[str] = None, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.heads, self.dim = heads, dim
        self.q_proj = nn.ModuleList(nn.Linear(hidden, heads * dim, bias=False, dtype=dtype) for _ in range(layers))
        self.w_proj = nn.ModuleList(nn.Linear(hidden, heads, bias=False, dtype=dtype) for _ in range(layers))
        self.topk = IndexerTopK(k, backend)

    def forward(self, hidden: Tensor, k_cache: Tensor, lengths: Tensor) -> Tensor:
        rows = hidden.shape[0]
        outs = []
        for qp, wp in zip(self.q_proj, self.w_proj):
            q = qp(hidden).view(rows, self.heads, self.dim)
            outs.append(self.topk(q, k_cache, wp(hidden), lengths))
        return torch.stack(outs)


def random_inputs(batch: int, width: int, hidden: int, dim: int, *, device: str = "cpu",
                  dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Random hidden states (batch, hidden) and key cache (batch, width, dim)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    h = torch.randn(batch, hidden, generator=g).to(device=device, dtype=dtype)
    kc = torch.randn(batch, width, dim, generator=g).to(device=device, dtype=dtype)
    return h, kc
