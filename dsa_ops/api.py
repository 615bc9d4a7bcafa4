"""Public entry points: :func:`topk_decode` and :func:`topk_prefill`."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from dsa_ops import ops, validate
from dsa_ops import policy as policy_mod
from dsa_ops.backends import get
from dsa_ops.backends.base import Query


@torch.compiler.assume_constant_result
def _policy_backend(family: str, device_type: str, k: int, compress_ratio: int, width: Optional[int], stable: bool,
                    long: bool) -> str:
    """The policy's backend name for a call; a host-only decision that dynamo folds to a
    constant (the inputs it depends on are already guarded: shapes, and ``long``)."""
    facts = policy_mod.facts_for(device_type, k, compress_ratio, width, stable)
    return policy_mod.current().choose(family, facts, long if family == "prefill" else None).backend


def _stable(stable: Optional[bool]) -> bool:
    return policy_mod.current().stable if stable is None else bool(stable)


def _width(logits: Tensor) -> Optional[int]:
    """The width as a host int, or None under compile: ``int()`` on a symbolic width would
    specialize the graph on it (a prefill chunk's width changes every step)."""
    return None if torch.compiler.is_compiling() else int(logits.shape[1])


def _backend_op(name: str, family: str, logits: Tensor, k: int, compress_ratio: int, stable: bool, out: bool):
    backend = get(name)
    sup = backend.check(Query(family, logits.device.type, k, _width(logits), stable, compress_ratio))
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
    stable: Optional[bool] = None,
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
        backend: a name from :func:`dsa_ops.backends`. None: under ``torch.compile`` emit
            the generic op ``dsa_ops::topk_decode`` for ``passes.IndexerTopKPass`` to
            retarget (its own kernel is the reference); eagerly, call the backend the
            policy (:func:`dsa_ops.policy.current`) picks from host facts.
        out: optional (R, k) int32 contiguous buffer to write; it is returned.
        compress_ratio: the indexer's KV compression ratio (1 for DSA); read by the pass.
        stable: lowest index wins ties and the valid prefix is in ascending index order;
            None takes the policy's ``stable`` flag.
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
    stable = _stable(stable)
    if check:
        layout = validate.decode_layout(lengths, logits.shape[0], next_n)
        validate.check_decode_values(logits, lengths, next_n, layout)
    if backend is None and torch.compiler.is_compiling():
        op = ops.generic_op("decode", out=out is not None)
    else:
        if backend is None:
            backend = _policy_backend("decode", logits.device.type, k, compress_ratio, _width(logits), stable,
                                      False)
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
    stable: Optional[bool] = None,
    check: bool = False,
) -> Tensor:
    """Per row, the k best logits of the window [row_starts[r], row_ends[r]) (contract §1.2).

    Args:
        logits: (R, N) float32, ``stride(1) == 1``, row pitch >= N; N is the chunk's
            gathered K length. Columns outside a row's window may hold anything.
        row_starts, row_ends: (R,) int32, contiguous. Clamped to [0, N]; an empty or
            inverted window gives an all -1 row.
        k: slots per row, 1..4096.
        max_seqlen_k: host int bound on the longest row (vLLM's ``chunk.max_seqlen_k``).
            With ``backend=None`` the policy compares it with its ``prefill_threshold``
            in plain Python: a host branch eagerly, a dynamo guard when compiled (two
            specializations: below / at-or-above; compile with the int dynamic, see
            ``docs/policy.md``). None derives nothing from device data (no sync) and
            takes the below-threshold backend.
        backend: a name from :func:`dsa_ops.backends`; None lets the policy choose.
        out: optional (R, k) int32 contiguous buffer to write; it is returned.
        compress_ratio: the indexer's KV compression ratio (1 for DSA).
        stable: lowest index wins ties and the valid prefix is in ascending order;
            None takes the policy's ``stable`` flag.
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
    stable = _stable(stable)
    if check:
        validate.check_prefill_values(logits, row_starts, row_ends)
    if backend is None:
        # The host branch (a guard under dynamo): which side of the threshold are we on?
        # An explicit `if` so dynamo guards on the comparison and passes on a constant.
        long = False
        if max_seqlen_k is not None and max_seqlen_k >= policy_mod.current().prefill_threshold:
            long = True
        backend = _policy_backend("prefill", logits.device.type, k, compress_ratio, _width(logits), stable, long)
    op = _backend_op(backend, "prefill", logits, k, compress_ratio, stable, out is not None)
    if out is None:
        return op(logits, row_starts, row_ends, k, compress_ratio, stable)
    op(logits, row_starts, row_ends, k, compress_ratio, stable, out)
    return out
