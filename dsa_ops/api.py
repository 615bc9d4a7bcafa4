"""Public entry points: :func:`topk_decode` and :func:`topk_prefill`."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from dsa_ops import ops, validate
from dsa_ops.backends import get
from dsa_ops.backends.base import Query


def _backend_op(name: str, family: str, logits: Tensor, k: int, compress_ratio: int, stable: bool, out: bool):
    backend = get(name)
    sup = backend.check(Query(family, logits.device.type, k, int(logits.shape[1]), stable, compress_ratio))
    if not sup:
        raise ValueError(f"backend: {sup.reason}")
    return ops.backend_op(name, family, out=out)


def topk_decode(
    logits: Tensor,
    lengths: Tensor,
    k: int = 2048,
    next_n: int = 1,
    *,
    backend: Optional[str] = None,
    out: Optional[Tensor] = None,
    compress_ratio: int = 1,
    stable: bool = False,
    check: bool = False,
) -> Tensor:
    """Per row, the columns of the k best logits among the row's first L_r (contract §1.1).

    Args:
        logits: (R, W) float32, ``stride(1) == 1``, row pitch >= W. Columns at or past a
            row's length may hold anything; they are never ranked.
        lengths: int32, contiguous, one of: (R,) or a 2-D tensor with R elements (per row,
            read flat); (B,) with R = B * next_n (per request: row r has length
            ``lengths[r // next_n] - next_n + 1 + r % next_n``). A (B, 1) tensor with
            next_n > 1 is ambiguous and rejected. Lengths are clamped to [0, W].
        k: slots per row, 1..4096.
        next_n: draft tokens per request (MTP); only the per-request layout uses it.
        backend: a name from :func:`dsa_ops.backends`; None emits the generic op
            ``dsa_ops::topk_decode`` (whose own kernel is the reference) for the compile
            pass to retarget.
        out: optional (R, k) int32 contiguous buffer to write; it is returned.
        compress_ratio: the indexer's KV compression ratio (1 for DSA); read by the pass.
        stable: lowest index wins ties and the valid prefix is in ascending index order.
        check: also check device values (lengths within [0, W]); synchronises.

    Returns:
        (R, k) int32. Row r holds min(L_r, k) distinct columns in [0, L_r), in no
        particular order unless ``stable``, then -1 in the remaining slots.

    Raises:
        ValueError: naming the argument, for any bad dtype, device, rank, stride, size,
            layout, k or out; nothing is written to ``out`` then.

    Example:
        >>> idx = dsa_ops.topk_decode(logits, seq_lens, k=2048)  # doctest: +SKIP
    """
    validate.check_decode(logits, lengths, k, next_n, compress_ratio)
    if out is not None:
        validate.check_out(out, logits, k)
    if check:
        layout = validate.decode_layout(lengths, logits.shape[0], next_n)
        validate.check_decode_values(logits, lengths, next_n, layout)
    if backend is None:
        op = ops.generic_op("decode", out=out is not None)
    else:
        op = _backend_op(backend, "decode", logits, k, compress_ratio, stable, out is not None)
    if out is None:
        return op(logits, lengths, k, next_n, compress_ratio, stable)
    op(logits, lengths, k, next_n, compress_ratio, stable, out)
    return out


def topk_prefill(
    logits: Tensor,
    row_starts: Tensor,
    row_ends: Tensor,
    k: int = 2048,
    *,
    max_seqlen_k: Optional[int] = None,
    backend: Optional[str] = None,
    out: Optional[Tensor] = None,
    compress_ratio: int = 1,
    stable: bool = False,
    check: bool = False,
) -> Tensor:
    """Per row, the k best logits of the window [row_starts[r], row_ends[r]) (contract §1.2).

    Args:
        logits: (R, N) float32, ``stride(1) == 1``, row pitch >= N; N is the chunk's
            gathered K length. Columns outside a row's window may hold anything.
        row_starts, row_ends: (R,) int32, contiguous. Clamped to [0, N]; an empty or
            inverted window gives an all -1 row.
        k: slots per row, 1..4096.
        max_seqlen_k: host int bound on the longest row (vLLM's ``chunk.max_seqlen_k``);
            chooses the backend when ``backend`` is None. None derives nothing from device
            data.
        backend: a name from :func:`dsa_ops.backends`; None lets the policy choose.
        out: optional (R, k) int32 contiguous buffer to write; it is returned.
        compress_ratio: the indexer's KV compression ratio (1 for DSA).
        stable: lowest index wins ties and the valid prefix is in ascending order.
        check: also check device values (0 <= start <= end <= N); synchronises.

    Returns:
        (R, k) int32 sequence-local indices ``j - row_starts[r]``, min(L_r, k) of them,
        then -1.
    """
    validate.check_prefill(logits, row_starts, row_ends, k, compress_ratio)
    if out is not None:
        validate.check_out(out, logits, k)
    if max_seqlen_k is not None and (isinstance(max_seqlen_k, bool) or not isinstance(max_seqlen_k, int)):
        raise ValueError(f"max_seqlen_k: expected a host int or None, got {max_seqlen_k!r}")
    if check:
        validate.check_prefill_values(logits, row_starts, row_ends)
    if backend is None:
        op = ops.generic_op("prefill", out=out is not None)
    else:
        op = _backend_op(backend, "prefill", logits, k, compress_ratio, stable, out is not None)
    if out is None:
        return op(logits, row_starts, row_ends, k, compress_ratio, stable)
    op(logits, row_starts, row_ends, k, compress_ratio, stable, out)
    return out
