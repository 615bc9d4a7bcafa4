"""Host-side argument checks shared by the public wrappers, the ops and their fake kernels.

Every check reads host facts only (dtype, device, rank, sizes, strides), so it never
synchronises and is safe under graph capture. Each failure is a ValueError that names the
argument and what was expected. Checks on device values (lengths beyond the width, ends
before starts) live in :func:`check_decode_values` / :func:`check_prefill_values`, which
synchronise and run only when the caller asks for them (``check=True``).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.fx.experimental.symbolic_shapes import statically_known_true

MAX_K = 4096


def _surely(cond) -> bool:
    """True iff ``cond`` certainly holds: a plain bool as is, a symbolic one only if provable.

    Never adds a guard, so an unbacked size (e.g. rows from ``torch.nonzero``) cannot fail
    tracing. ``isinstance(x, int)`` cannot tell sizes apart: under dynamo a SymInt passes it.
    """
    return statically_known_true(cond)


def _decided_eq(a, b) -> bool:
    """Whether ``a == b`` is known either way without guarding."""
    return _surely(a == b) or _surely(a != b)


def _desc(t: Tensor) -> str:
    return f"{t.dtype}, shape {tuple(t.shape)}, stride {tuple(t.stride())}, device {t.device}"


def check_k(k) -> None:
    if isinstance(k, bool) or not isinstance(k, int):
        raise ValueError(f"k: expected an int in [1, {MAX_K}], got {k!r}")
    if not 1 <= k <= MAX_K:
        raise ValueError(f"k: expected 1 <= k <= {MAX_K}, got {k}")


def check_logits(logits) -> None:
    if not isinstance(logits, Tensor):
        raise ValueError(f"logits: expected a torch.Tensor, got {type(logits).__name__}")
    if logits.dtype != torch.float32:
        raise ValueError(f"logits: expected dtype torch.float32, got {_desc(logits)}")
    if logits.dim() != 2:
        raise ValueError(f"logits: expected a 2-D (rows, width) tensor, got {_desc(logits)}")
    rows, width = logits.shape
    s0, s1 = logits.stride()
    # A size-1 dimension's stride is meaningless; only check strides that address memory.
    if _surely(width > 1) and _surely(s1 != 1):
        raise ValueError(f"logits: expected stride(1) == 1 (rows contiguous), got {_desc(logits)}")
    if _surely(rows > 1) and _surely(s0 < width):
        raise ValueError(f"logits: expected row pitch stride(0) >= width, got {_desc(logits)}")


def _check_index_tensor(name: str, t, device: torch.device) -> None:
    if not isinstance(t, Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise ValueError(f"{name}: expected dtype torch.int32, got {_desc(t)}")
    if t.device != device:
        raise ValueError(f"{name}: expected device {device} (the logits' device), got {_desc(t)}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got {_desc(t)}")


def check_next_n(next_n) -> None:
    if isinstance(next_n, bool) or not isinstance(next_n, int) or next_n < 1:
        raise ValueError(f"next_n: expected an int >= 1, got {next_n!r}")


def check_compress_ratio(compress_ratio) -> None:
    if isinstance(compress_ratio, bool) or not isinstance(compress_ratio, int) or compress_ratio < 1:
        raise ValueError(f"compress_ratio: expected an int >= 1, got {compress_ratio!r}")


def decode_layout(lengths: Tensor, rows, next_n: int) -> str:
    """Which lengths layout of contract §1.1 applies: "per_row" or "per_request".

    Raises ValueError for the ambiguous (B, 1) layout with next_n > 1 and for sizes that
    fit no layout. With symbolic sizes the layout cannot be decided without guarding; we
    then return "symbolic" and leave the check to the real kernel.
    """
    numel = lengths.numel()
    if not (_decided_eq(numel, rows) and _decided_eq(numel * next_n, rows)):
        return "symbolic"
    if lengths.dim() == 2:
        if next_n > 1 and lengths.shape[1] == 1 and numel * next_n == rows and numel != rows:
            raise ValueError(
                f"lengths: shape {tuple(lengths.shape)} with next_n={next_n} is ambiguous (contract §1.1 "
                f"layout 3: backends disagree on it); pass per-row lengths of shape ({rows},) or "
                f"({rows // next_n}, {next_n}), or per-request lengths of shape ({rows // next_n},)"
            )
        if numel == rows:
            return "per_row"
        raise ValueError(
            f"lengths: a 2-D lengths tensor must hold one length per logits row ({rows}), "
            f"got shape {tuple(lengths.shape)}"
        )
    if lengths.dim() == 1:
        if numel == rows:
            return "per_row"
        if numel * next_n == rows:
            return "per_request"
        raise ValueError(
            f"lengths: expected shape ({rows},) (one per row) or ({rows // next_n if next_n else rows},) "
            f"(one per request with next_n={next_n}) for {rows} logits rows, got shape {tuple(lengths.shape)}"
        )
    raise ValueError(f"lengths: expected a 1-D or 2-D int32 tensor, got {_desc(lengths)}")


def check_decode(logits, lengths, k, next_n, compress_ratio=1) -> str:
    """All host checks of a decode call; returns the lengths layout."""
    check_logits(logits)
    _check_index_tensor("lengths", lengths, logits.device)
    check_k(k)
    check_next_n(next_n)
    check_compress_ratio(compress_ratio)
    return decode_layout(lengths, logits.shape[0], next_n)


def check_prefill(logits, row_starts, row_ends, k, compress_ratio=1) -> None:
    """All host checks of a prefill call."""
    check_logits(logits)
    rows = logits.shape[0]
    for name, t in (("row_starts", row_starts), ("row_ends", row_ends)):
        _check_index_tensor(name, t, logits.device)
        if t.dim() != 1:
            raise ValueError(f"{name}: expected a 1-D tensor of shape ({rows},), got {_desc(t)}")
        if _surely(t.shape[0] != rows):
            raise ValueError(f"{name}: expected shape ({rows},) (one per logits row), got {_desc(t)}")
    check_k(k)
    check_compress_ratio(compress_ratio)


def check_out(out, logits: Tensor, k: int) -> None:
    """``out`` must be int32 (rows, k) with row pitch exactly k, on the logits' device."""
    if not isinstance(out, Tensor):
        raise ValueError(f"out: expected a torch.Tensor, got {type(out).__name__}")
    rows = logits.shape[0]
    if out.dtype != torch.int32:
        raise ValueError(f"out: expected dtype torch.int32, got {_desc(out)}")
    if out.device != logits.device:
        raise ValueError(f"out: expected device {logits.device} (the logits' device), got {_desc(out)}")
    if out.dim() != 2 or out.shape[0] != rows or out.shape[1] != k:
        raise ValueError(f"out: expected shape ({rows}, {k}), got {_desc(out)}")
    if not out.is_contiguous():
        raise ValueError(f"out: expected a contiguous tensor (row pitch exactly k={k}), got {_desc(out)}")


def check_decode_values(logits: Tensor, lengths: Tensor, next_n: int, layout: str) -> None:
    """Device-value checks (synchronises): every row length must lie in [0, width]."""
    from dsa_ops.backends.reference import row_lengths

    raw = row_lengths(lengths, logits.shape[0], next_n, layout, clamp_to=None)
    width = logits.shape[1]
    bad = (raw < 0) | (raw > width)
    if bool(bad.any()):
        r = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"lengths: row {r} has length {int(raw[r])}, expected 0 <= length <= width ({width}); "
            f"without check=True it would be clamped to [0, {width}]"
        )


def check_prefill_values(logits: Tensor, row_starts: Tensor, row_ends: Tensor) -> None:
    """Device-value checks (synchronises): 0 <= row_starts <= row_ends <= width."""
    width = logits.shape[1]
    s, e = row_starts.long(), row_ends.long()
    for name, bad, what in (
        ("row_starts", s < 0, "row_starts >= 0"),
        ("row_ends", e < s, "row_ends >= row_starts"),
        ("row_ends", e > width, f"row_ends <= width ({width})"),
    ):
        if bool(bad.any()):
            r = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"{name}: row {r} has start {int(s[r])} and end {int(e[r])}, expected {what}; "
                f"without check=True the window would be clamped to [0, {width}]"
            )
