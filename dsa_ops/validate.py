"""Host-side argument checks shared by the public wrappers, the ops and their fake kernels.

Every check reads host facts only (dtype, device, rank, sizes, strides), so it never
synchronises and is safe under graph capture. Each failure is a ValueError that names the
argument and what was expected. Checks on device values (lengths beyond the width, ends
before starts) live in :func:`check_decode_values` / :func:`check_prefill_values`, which
synchronise and run only when the caller asks for them (``check=True``; under torch.compile
inside the ops :func:`dsa_ops.ops.check_decode_values` / :func:`~dsa_ops.ops.check_prefill_values`).
"""

from __future__ import annotations

import functools
from typing import NoReturn

import torch
from torch import Tensor
from torch._guards import TracingContext  # loaded by torch itself (dynamo is not)

MAX_K = 4096


class ArgumentError(ValueError):
    """A bad argument to a dsa_ops entry point or op; the message names the argument and what
    was expected. A ValueError, so ``except ValueError`` catches it."""


def _fail(msg: str) -> NoReturn:
    """Raise :class:`ArgumentError`. Dynamo calls this at trace time with the message as a
    constant (it is marked as having a constant result), so under ``torch.compile`` the error
    is raised as is, as a subclass that dynamo lets through (not its "Observed exception")."""
    if TracingContext.try_get() is not None:
        raise _traced_error()(msg)
    raise ArgumentError(msg)


_fail._dynamo_marked_constant = True  # what torch.compiler.assume_constant_result sets (no dynamo import)


@functools.lru_cache(maxsize=None)
def _traced_error() -> type:
    """ArgumentError that is also dynamo's TorchRuntimeError, which dynamo re-raises unchanged
    (made on first use: importing dynamo at import time would cost a second)."""
    from torch._dynamo.exc import TorchRuntimeError

    return type("ArgumentError", (ArgumentError, TorchRuntimeError), {"__module__": __name__})


def _surely(cond) -> bool:
    """True iff ``cond`` certainly holds: a plain bool as is, a symbolic one only if provable.

    Never adds a guard, so an unbacked size (e.g. rows from ``torch.nonzero``) cannot fail
    tracing. ``isinstance(x, int)`` cannot tell sizes apart: under dynamo a SymInt passes it.
    The symbolic-shapes module (and sympy) load only when a symbolic condition comes.
    """
    if isinstance(cond, bool) and not torch.compiler.is_compiling():  # (dynamo says a SymBool is a bool)
        return cond
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return statically_known_true(cond)


def _decided_eq(a, b) -> bool:
    """Whether ``a == b`` is known either way without guarding."""
    return _surely(a == b) or _surely(a != b)


def _desc(t: Tensor) -> str:
    return f"{t.dtype}, shape {tuple(t.shape)}, stride {tuple(t.stride())}, device {t.device}"


# What each int argument must be, for the messages of :func:`not_an_int`.
_WANT_INT = {"k": f"an int in [1, {MAX_K}]", "next_n": "an int >= 1", "compress_ratio": "an int >= 1",
             "max_seqlen_k": "a host int >= 0 or None"}


def shown(x) -> str:
    """A bad argument as messages show it: its repr, except a tensor or a numpy value (a
    numpy int, say), shown by kind only. Under torch.compile dynamo traces both (a numpy
    scalar becomes a 0-d array), so their values are unknown at trace time (``repr`` of
    one is dynamo's 'Unsupported'), and eager and compiled calls must say the same."""
    if isinstance(x, Tensor):
        return "a tensor"
    if type(x).__module__ == "numpy":
        return "a numpy value"
    return repr(x)


def traced_value(x) -> bool:
    """Whether dynamo would trace ``x`` rather than see a constant: a tensor or a numpy value."""
    return isinstance(x, Tensor) or type(x).__module__ == "numpy"


def not_an_int(name: str, x) -> NoReturn:
    """Raise the ValueError for an int argument (k, next_n, compress_ratio, max_seqlen_k) that is
    not an int; traceable by dynamo for a tensor or numpy ``x`` (see :func:`shown`)."""
    hint = " (pass a Python int)" if traced_value(x) else ""
    _fail(f"{name}: expected {_WANT_INT[name]}, got {shown(x)}{hint}")


def check_k(k) -> None:
    if isinstance(k, bool) or not isinstance(k, int):
        not_an_int("k", k)
    if not 1 <= k <= MAX_K:
        _fail(f"k: expected 1 <= k <= {MAX_K}, got {k}")


def check_logits(logits) -> None:
    if not isinstance(logits, Tensor):
        _fail(f"logits: expected a torch.Tensor, got {type(logits).__name__}")
    if logits.dtype != torch.float32:
        _fail(f"logits: expected dtype torch.float32, got {_desc(logits)}")
    if logits.dim() != 2:
        _fail(f"logits: expected a 2-D (rows, width) tensor, got {_desc(logits)}")
    rows, width = logits.shape
    s0, s1 = logits.stride()
    # A size-1 dimension's stride is meaningless, and an empty tensor addresses no memory
    # (numpy's (0, W) arrays come with strides (0, 0)): only check strides that address memory.
    if _surely(rows == 0) or _surely(width == 0):
        return
    if _surely(width > 1) and _surely(s1 != 1):
        _fail(f"logits: expected stride(1) == 1 (rows contiguous), got {_desc(logits)}")
    if _surely(rows > 1) and _surely(s0 < width):
        _fail(f"logits: expected row pitch stride(0) >= width, got {_desc(logits)}")


def _check_index_tensor(name: str, t, device: torch.device) -> None:
    if not isinstance(t, Tensor):
        _fail(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        _fail(f"{name}: expected dtype torch.int32, got {_desc(t)}")
    if t.device != device:
        _fail(f"{name}: expected device {device} (the logits' device), got {_desc(t)}")
    if not t.is_contiguous():
        _fail(f"{name}: expected a contiguous tensor, got {_desc(t)}")


def check_next_n(next_n) -> None:
    if isinstance(next_n, bool) or not isinstance(next_n, int) or next_n < 1:
        not_an_int("next_n", next_n)


def check_stable(stable) -> None:
    if stable is not None and not isinstance(stable, bool):
        _fail(f"stable: expected True, False or None (the policy's flag), got {shown(stable)}")


def check_max_seqlen_k(max_seqlen_k) -> None:
    if max_seqlen_k is None:
        return
    if isinstance(max_seqlen_k, bool) or not isinstance(max_seqlen_k, int):
        not_an_int("max_seqlen_k", max_seqlen_k)
    if max_seqlen_k < 0:
        if torch.compiler.is_compiling():  # a dynamic (symbolic) int cannot be formatted into the message
            _fail("max_seqlen_k: expected a host int >= 0 or None, got a negative int")
        _fail(f"max_seqlen_k: expected a host int >= 0 or None, got {max_seqlen_k!r}")


def check_static(metas: tuple, k, ints: tuple, compress_ratio, stable) -> None:
    """The checks that need no shapes: each tensor argument's type, dtype, device and rank,
    and the int / bool arguments. ``metas``: (name, (dtype, device, dim) or a type name) per
    tensor argument, logits first; ``ints``: (name, value) per family int argument (decode's
    next_n). Under ``torch.compile`` the public wrappers call this with constants only
    (dynamo runs it at trace time, so a bad argument raises this ValueError, not dynamo's
    "Observed exception"); shapes and strides are checked by the fake kernels."""
    device = metas[0][1][1] if isinstance(metas[0][1], tuple) else None
    for name, meta in metas:
        if not isinstance(meta, tuple):
            _fail(f"{name}: expected a torch.Tensor, got {meta}")
        dtype, dev, dim = meta
        want = torch.float32 if name == "logits" else torch.int32
        if dtype != want:
            _fail(f"{name}: expected dtype {want}, got {dtype} (device {dev}, {dim}-D)")
        if dev != device:
            _fail(f"{name}: expected device {device} (the logits' device), got {dev}")
        dims = {"logits": (2,), "out": (2,), "lengths": (1, 2)}.get(name, (1,))
        if dim not in dims:
            _fail(f"{name}: expected a {' or '.join(f'{d}-D' for d in dims)} tensor, got {dim}-D")
    check_k(k)
    for name, value in ints:
        _INT_CHECKS[name](value)
    check_compress_ratio(compress_ratio)
    check_stable(stable)


def check_compress_ratio(compress_ratio) -> None:
    if isinstance(compress_ratio, bool) or not isinstance(compress_ratio, int) or compress_ratio < 1:
        not_an_int("compress_ratio", compress_ratio)


_INT_CHECKS = {"next_n": check_next_n}  # a family's int arguments (dsa_ops.family.Family.ints)


def decode_layout(lengths: Tensor, rows, next_n: int) -> str:
    """Which lengths layout of contract §1.1 applies: "per_row" or "per_request".

    Raises ValueError for the ambiguous (B, 1) layout with next_n > 1, for per-row lengths
    whose row count is no multiple of next_n > 1 (next_n would be silently meaningless), and
    for sizes that fit no layout, naming what is wrong. With symbolic sizes the layout cannot
    be decided without guarding; we then return "symbolic" and leave the check to the real
    kernel.
    """
    numel = lengths.numel()
    if not (_decided_eq(numel, rows) and _decided_eq(numel * next_n, rows)):
        return "symbolic"
    shape = tuple(lengths.shape)
    if lengths.dim() not in (1, 2):
        _fail(f"lengths: expected a 1-D or 2-D int32 tensor, got {_desc(lengths)}")
    if lengths.dim() == 2 and next_n > 1 and shape[1] == 1 and numel * next_n == rows and numel != rows:
        _fail(
            f"lengths: shape {shape} with next_n={next_n} is ambiguous (backends disagree on it, "
            f"docs/contract.md); pass per-row lengths of shape ({rows},) or "
            f"({rows // next_n}, {next_n}), or per-request lengths of shape ({rows // next_n},)"
        )
    if numel == rows:
        if next_n > 1 and rows % next_n:
            _fail(
                f"next_n: {rows} logits rows are not a multiple of next_n={next_n} (rows = requests x "
                f"next_n); with one length per row pass next_n=1, or fix the row count"
            )
        return "per_row"
    if lengths.dim() == 2:
        _fail(
            f"lengths: a 2-D lengths tensor must hold one length per logits row ({rows}), got shape {shape}"
        )
    if numel * next_n == rows:
        return "per_request"
    if next_n == 1:
        _fail(f"lengths: expected shape ({rows},), one length per logits row, got shape {shape}")
    if rows % next_n:
        _fail(
            f"lengths: shape {shape} fits neither layout: per-row lengths need ({rows},), and per-request "
            f"lengths need rows = requests x next_n, but {rows} logits rows are not a multiple of "
            f"next_n={next_n}"
        )
    _fail(
        f"lengths: expected shape ({rows},) (one per row) or ({rows // next_n},) (one per request, "
        f"next_n={next_n}) for {rows} logits rows, got shape {shape}"
    )


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
            _fail(f"{name}: expected a 1-D tensor of shape ({rows},), got {_desc(t)}")
        if _surely(t.shape[0] != rows):
            _fail(f"{name}: expected shape ({rows},) (one per logits row), got {_desc(t)}")
    check_k(k)
    check_compress_ratio(compress_ratio)


def check_out(out, logits: Tensor, k: int) -> None:
    """``out`` must be int32 (rows, k) with row pitch exactly k, on the logits' device."""
    if not isinstance(out, Tensor):
        _fail(f"out: expected a torch.Tensor, got {type(out).__name__}")
    rows = logits.shape[0]
    if out.dtype != torch.int32:
        _fail(f"out: expected dtype torch.int32, got {_desc(out)}")
    if out.device != logits.device:
        _fail(f"out: expected device {logits.device} (the logits' device), got {_desc(out)}")
    if out.dim() != 2 or out.shape[0] != rows or out.shape[1] != k:
        _fail(f"out: expected shape ({rows}, {k}), got {_desc(out)}")
    if not out.is_contiguous():
        _fail(f"out: expected a contiguous tensor (row pitch exactly k={k}), got {_desc(out)}")


def check_decode_values(logits: Tensor, lengths: Tensor, next_n: int, layout: str) -> None:
    """Device-value checks (synchronises): every length given must lie in [0, width].

    Per-request lengths are checked as given: the rows they derive
    (``L - next_n + 1 + j``) may be negative for a short or padded request, which the
    contract clamps to 0 as a normal padded row.
    """
    raw = lengths.reshape(-1).to(torch.int64)
    width = logits.shape[1]
    bad = (raw < 0) | (raw > width)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        what = "request" if layout == "per_request" else "row"
        _fail(
            f"lengths: {what} {i} has length {int(raw[i])}, expected 0 <= length <= width ({width}); "
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
            _fail(
                f"{name}: row {r} has start {int(s[r])} and end {int(e[r])}, expected {what}; "
                f"without check=True the window would be clamped to [0, {width}]"
            )


def extent(t: Tensor) -> int:
    """Bytes from a tensor's first element to past its last (0 for no elements): a function of
    its shape, strides and dtype only, so callers may cache it per host facts."""
    if t.numel() == 0:
        return 0
    return (sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride())) + 1) * t.element_size()


def _span(t: Tensor, nbytes: int | None = None) -> tuple[int, int]:
    """The byte range [lo, hi) a tensor's elements occupy (empty for no elements)."""
    nbytes = extent(t) if nbytes is None else nbytes
    lo = t.data_ptr() if nbytes else 0
    return lo, lo + nbytes


def first_overlap(out: Tensor, extents: tuple, inputs: tuple) -> int:
    """The index of the first input whose bytes overlap ``out``'s, or -1 (the eager route's
    per-call test: ``extents`` are out's and then each input's, from :func:`extent`)."""
    o_lo = out.data_ptr()
    o_hi = o_lo + extents[0]
    if o_hi == o_lo:
        return -1
    for i, t in enumerate(inputs):
        n = extents[i + 1]
        if n:
            lo = t.data_ptr()
            if lo < o_hi and o_lo < lo + n:
                return i
    return -1


def check_no_overlap(out: Tensor, extents: tuple | None = None, **inputs: Tensor) -> None:
    """``out`` must not share memory with an input: a kernel writing it while reading the
    logits or the lengths would read its own output. Real tensors only (needs data pointers);
    a conservative byte-range test, so two interleaved views are refused too. ``extents``:
    the byte extents of out and then each input (:func:`extent`), when the caller has them."""
    ext = extents or (None,) * (len(inputs) + 1)
    o_lo, o_hi = _span(out, ext[0])
    if o_lo == o_hi:
        return
    for (name, t), nbytes in zip(inputs.items(), ext[1:]):
        lo, hi = _span(t, nbytes)
        if lo < o_hi and o_lo < hi:
            _fail(
                f"out: overlaps {name} in memory (out bytes [{o_lo:#x}, {o_hi:#x}), {name} bytes "
                f"[{lo:#x}, {hi:#x})); pass a separate buffer"
            )
