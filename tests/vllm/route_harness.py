"""What the route tests share: a mixed DSA batch in vLLM's own metadata classes, a counting
dsa-ops backend, and torch stand-ins for the few vLLM kernels that cannot run on a CPU.

The batch: 2 decode requests with next_n = 2 (native MTP: per-row seq_lens (B, next_n))
and 2 prefill requests (3 and 2 new tokens) in one chunk, k = 2048, so some rows are
longer than k and some shorter (-1 filled).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch
from vllm.v1.attention.backends.mla.indexer import (
    DeepseekV32IndexerMetadata, DeepseekV32IndexerPrefillChunkMetadata, DeepseekV32IndexerPrefillMetadata,
    DeepSeekV32IndexerDecodeMetadata,
)

from dsa_ops import policy as P
from dsa_ops.backends import BACKENDS, reference, register
from dsa_ops.backends.base import YES, Backend

K = 2048
MAX_MODEL_LEN = 4096
PREFIX = "model.layers.0.self_attn.indexer.k_cache"
COUNTING = "route_counting"
HEADS, HEAD_DIM = 2, 128

counts = {"decode_rows": 0, "prefill_rows": 0, "stock_decode": 0, "stock_prefill": 0, "localize": 0,
          "aiter_decode": 0, "aiter_prefill": 0}


def reset_counts() -> None:
    for key in counts:
        counts[key] = 0


def _count_decode(logits, lengths, k, next_n, stable, out):
    counts["decode_rows"] += logits.shape[0]
    reference.decode(logits, lengths, k, next_n, stable, out)


def _count_prefill(logits, starts, ends, k, stable, out):
    counts["prefill_rows"] += logits.shape[0]
    reference.prefill(logits, starts, ends, k, stable, out)


@contextlib.contextmanager
def counting_policy() -> Iterator[P.Policy]:
    """A test-only backend computing the reference and counting rows; a policy routing CPU to it."""
    BACKENDS.pop(COUNTING, None)
    register(Backend(COUNTING, _count_decode, _count_prefill, lambda: YES, lambda q: YES, lambda: "test",
                     description="test-only: reference, counting rows", test_only=True))
    policy = P.Policy(decode=(P.Rule(COUNTING, "test", platform="cpu"),),
                      prefill=(P.Rule(COUNTING, "test", platform="cpu"),), name="route-test")
    try:
        with P.use(policy):
            yield policy
    finally:
        BACKENDS.pop(COUNTING, None)


# ------------------------------------------------------------------ the batch

@dataclass
class Batch:
    meta: DeepseekV32IndexerMetadata
    decode_logits: torch.Tensor  # (4, MAX_MODEL_LEN)
    decode_lengths: torch.Tensor  # (4,) per row
    prefill_logits: torch.Tensor  # (5, max_seqlen_k), compressed: row r's window is [0, ends[r])
    prefill_ends: torch.Tensor  # (5,) compressed row ends (CUDA)
    prefill_ks: torch.Tensor  # (5,) chunk-global window starts (ROCm)
    prefill_ke: torch.Tensor  # (5,) chunk-global window ends (ROCm)
    num_tokens: int = 9
    num_decode_tokens: int = 4


def make_batch(seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    i32 = dict(dtype=torch.int32)
    # Decode: requests of 3000 and 900 tokens, next_n = 2: rows L-1, L.
    decode_lengths = torch.tensor([2999, 3000, 899, 900], **i32)
    seq_lens = decode_lengths.view(2, 2).clone()
    decode_logits = torch.randint(-50, 50, (4, MAX_MODEL_LEN), generator=g).float()  # ties
    decode = DeepSeekV32IndexerDecodeMetadata(
        block_table=torch.zeros(2, 64, **i32), seq_lens=seq_lens, decode_lens=torch.tensor([2, 2], **i32),
        requires_padding=False, schedule_metadata=torch.zeros(1, 2, **i32))
    # Prefill: request A (2600 tokens, 3 new) then request B (1000 tokens, 2 new).
    ks = torch.tensor([0, 0, 0, 2600, 2600], **i32)
    ke = torch.tensor([2598, 2599, 2600, 3599, 3600], **i32)
    max_seqlen_k = int((ke - ks).max())
    prefill_logits = torch.randn(5, max_seqlen_k, generator=g)
    chunk = DeepseekV32IndexerPrefillChunkMetadata(
        block_table=torch.zeros(2, 64, **i32), cu_seqlen_ks=ks, cu_seqlen_ke=ke,
        cu_seq_lens=torch.tensor([0, 2600, 3600], **i32), token_to_seq=torch.tensor([0, 0, 0, 1, 1], **i32),
        total_seq_lens=3600, max_seqlen_k=max_seqlen_k, token_start=4, token_end=9, num_reqs=2,
        skip_kv_gather=True,  # the K gather is vLLM's CUDA op; the logits stand-in does not read K
        local_cu_seq_lens=torch.tensor([0, 2600, 3600], **i32), local_total_seq_lens=3600,
        max_local_total_seq_lens=3600)
    meta = DeepseekV32IndexerMetadata(
        seq_lens=torch.tensor([3000, 900, 2600, 1000], **i32), max_seq_len=3000,
        slot_mapping=torch.arange(9, dtype=torch.int64), num_decodes=2, num_decode_tokens=4, num_prefills=2,
        num_prefill_tokens=5, decode=decode, prefill=DeepseekV32IndexerPrefillMetadata(chunks=[chunk]))
    return Batch(meta, decode_logits, decode_lengths, prefill_logits, ke - ks, ks, ke)


def indexer_inputs(batch: Batch) -> dict:
    """The tensors vLLM's indexer function takes (values unused by the stand-ins)."""
    n = batch.num_tokens
    return dict(
        hidden_states=torch.zeros(n, 16, dtype=torch.bfloat16),
        kv_cache=torch.zeros(4, 64, HEAD_DIM + 4, dtype=torch.uint8),
        k=torch.zeros(n, HEAD_DIM, dtype=torch.bfloat16),
        weights=torch.ones(n, HEADS),
        topk_indices_buffer=torch.full((n + 3, K), 7, dtype=torch.int32),
    )


def global_to_chunk_logits(batch: Batch) -> torch.Tensor:
    """The prefill logits laid out chunk-globally (ROCm's mqa logits): row r's window
    [ks[r], ke[r]) holds the compressed row; other columns are junk that must not win."""
    out = torch.full((5, 3600), 1e6)
    for r in range(5):
        s, e = int(batch.prefill_ks[r]), int(batch.prefill_ke[r])
        out[r, s:e] = batch.prefill_logits[r, : e - s]
    return out


# ------------------------------------------------------------------ stand-ins for vLLM's _C ops

_stock_lib = None


def _rows_of(seq_lens: torch.Tensor, next_n: int, rows: int) -> torch.Tensor:
    flat = seq_lens.reshape(-1).long()
    if flat.numel() == rows:
        return flat
    return (flat.repeat_interleave(next_n) - next_n + 1 + torch.arange(rows) % next_n).clamp(min=0)


def _masked_topk(logits: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, k: int) -> torch.Tensor:
    """Per row the k best columns of [starts, ends), relative to starts, -1 filled."""
    cols = torch.arange(logits.shape[1])
    inside = (cols >= starts[:, None]) & (cols < ends[:, None])
    masked = logits.masked_fill(~inside, float("-inf"))
    take = min(k, logits.shape[1])
    idx = masked.topk(take, dim=1).indices - starts[:, None]
    n = (ends - starts).clamp(min=0)
    idx = torch.where(torch.arange(take)[None, :] < n[:, None], idx, -1)
    out = torch.full((logits.shape[0], k), -1, dtype=torch.int64)
    out[:, :take] = idx
    return out.int()


def _stock_decode(logits, next_n, seq_lens, out, num_rows, stride0, stride1, k):
    counts["stock_decode"] += 1
    ends = _rows_of(seq_lens, next_n, num_rows)
    out[:num_rows] = _masked_topk(logits[:num_rows], torch.zeros_like(ends), ends, k)


def _stock_prefill(logits, row_starts, row_ends, out, num_rows, stride0, stride1, k):
    counts["stock_prefill"] += 1
    out[:num_rows] = _masked_topk(logits[:num_rows], row_starts.long(), row_ends.long(), k)


def define_stock_topk_ops() -> None:
    """Torch stand-ins for ``torch.ops._C.top_k_per_row_decode`` / ``_prefill`` (vLLM's CUDA
    build does not load on this machine), with the 0.33.0 call signatures; they count calls."""
    global _stock_lib
    if _stock_lib is not None:
        return
    lib = torch.library.Library("_C", "FRAGMENT")
    for name, fn, args in (
        ("top_k_per_row_decode", _stock_decode, "Tensor logits, int next_n, Tensor seq_lens"),
        ("top_k_per_row_prefill", _stock_prefill, "Tensor logits, Tensor row_starts, Tensor row_ends"),
    ):
        if not hasattr(torch.ops._C, name):
            lib.define(f"{name}({args}, Tensor(a!) out, int num_rows, int stride0, int stride1, int k) -> ()")
            lib.impl(name, fn, "CompositeExplicitAutograd")
    _stock_lib = lib


def pack_seq(x: torch.Tensor, lengths: torch.Tensor, pad_value: float = -float("inf"), **_: object) -> torch.Tensor:
    """Torch stand-in for vLLM's Triton ``pack_seq_triton``: (sum L, ...) -> (B, max L, ...)."""
    lens = [int(v) for v in lengths]
    out = x.new_full((len(lens), max(lens), *x.shape[1:]), pad_value) if x.dtype.is_floating_point else \
        x.new_zeros((len(lens), max(lens), *x.shape[1:]))
    start = 0
    for b, n in enumerate(lens):
        out[b, :n] = x[start:start + n]
        start += n
    return out


def unpack_seq(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Torch stand-in for vLLM's Triton ``unpack_seq_triton``: the inverse of :func:`pack_seq`."""
    return torch.cat([x[b, : int(n)] for b, n in enumerate(lengths)])
