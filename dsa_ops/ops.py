"""torch.library registration: the generic ops and one op pair per backend.

Families and their schemas (every op of a family has the same one; a test asserts it):

* decode:  ``(Tensor logits, Tensor lengths, int k=2048, int next_n=1, int compress_ratio=1,
  bool stable=False) -> Tensor``
* prefill: ``(Tensor logits, Tensor row_starts, Tensor row_ends, int k=2048,
  int compress_ratio=1, bool stable=False) -> Tensor``

Each family has a functional op (returns a fresh (R, k) int32 tensor) and an ``_out`` op
that writes a caller buffer (a last positional ``Tensor(a!) out``, no defaults) and
returns nothing, so no op ever
returns an alias of a mutated input. Names: ``dsa_ops::topk_decode`` /
``dsa_ops::topk_decode_out`` (generic; the kernel is the reference) and
``dsa_ops::topk_decode_<backend>`` / ``dsa_ops::topk_decode_<backend>_out``; likewise for
prefill. Every real kernel and fake kernel runs the host checks of :mod:`dsa_ops.validate`.
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable

import torch
from torch import Tensor

from dsa_ops import validate
from dsa_ops.backends.base import Backend, Query

NAMESPACE = "dsa_ops"
FAMILIES = ("decode", "prefill")
_ARGS = {
    "decode": "Tensor logits, Tensor lengths, int k=2048, int next_n=1, int compress_ratio=1, bool stable=False",
    "prefill": "Tensor logits, Tensor row_starts, Tensor row_ends, int k=2048, int compress_ratio=1, "
    "bool stable=False",
}
SCHEMAS = {fam: f"({args}) -> Tensor" for fam, args in _ARGS.items()}
# custom_op allows no kwarg-only tensors, so ``out`` is the last positional argument and
# the out forms carry no defaults.
OUT_SCHEMAS = {
    fam: "(" + ", ".join(a.split("=")[0] for a in args.split(", ")) + ", Tensor(a!) out) -> ()"
    for fam, args in _ARGS.items()
}

_OPS: dict[tuple[str, str, bool], object] = {}  # (backend or "", family, out) -> CustomOpDef


def op_name(backend: str | None, family: str, out: bool = False) -> str:
    """Unqualified op name, e.g. ``topk_decode_triton_out``."""
    return f"topk_{family}" + (f"_{backend}" if backend else "") + ("_out" if out else "")


def _query(family: str, logits: Tensor, k: int, compress_ratio: int, stable: bool) -> Query:
    return Query(family, logits.device.type, k, int(logits.shape[1]), stable, compress_ratio)


def _register(qualname: str, family: str, writer_of: Callable[[], Callable], backend: Backend | None) -> None:
    from dsa_ops.backends import BACKENDS

    """Register the functional and the ``_out`` op for one (backend, family)."""

    def run(logits, args, k, compress_ratio, stable, out):
        # args: the writer's arguments between logits and stable, in its own order.
        if backend is not None:
            # Look the record up at call time: a re-registered backend replaces the old one.
            current = BACKENDS.get(backend.name)
            if current is None:
                raise ValueError(f"{NAMESPACE}::{qualname}: backend {backend.name!r} is no longer registered")
            sup = current.check(_query(family, logits, k, compress_ratio, stable))
            if not sup:
                raise ValueError(f"{NAMESPACE}::{qualname}: {sup.reason}")
            getattr(current, family)(logits, *args, stable, out)
            return
        if _scoped_pass_left:
            _warn_generic_after_scope(family, logits.device.type)
        elif logits.device.type != "cpu":
            _warn_generic_on_device(family, logits.device.type)
        writer_of()(logits, *args, stable, out)

    if family == "decode":

        def functional(logits, lengths, k=2048, next_n=1, compress_ratio=1, stable=False):
            validate.check_decode(logits, lengths, k, next_n, compress_ratio)
            out = torch.empty((logits.shape[0], k), dtype=torch.int32, device=logits.device)
            run(logits, (lengths, k, next_n), k, compress_ratio, stable, out)
            return out

        def out_variant(logits, lengths, k=2048, next_n=1, compress_ratio=1, stable=False, out=None):
            validate.check_decode(logits, lengths, k, next_n, compress_ratio)
            validate.check_out(out, logits, k)
            validate.check_no_overlap(out, logits=logits, lengths=lengths)
            run(logits, (lengths, k, next_n), k, compress_ratio, stable, out)

        def fake(logits, lengths, k=2048, next_n=1, compress_ratio=1, stable=False):
            validate.check_decode(logits, lengths, k, next_n, compress_ratio)
            return logits.new_empty((logits.shape[0], k), dtype=torch.int32)

        def fake_out(logits, lengths, k=2048, next_n=1, compress_ratio=1, stable=False, out=None):
            validate.check_decode(logits, lengths, k, next_n, compress_ratio)
            validate.check_out(out, logits, k)

    else:

        def functional(logits, row_starts, row_ends, k=2048, compress_ratio=1, stable=False):
            validate.check_prefill(logits, row_starts, row_ends, k, compress_ratio)
            out = torch.empty((logits.shape[0], k), dtype=torch.int32, device=logits.device)
            run(logits, (row_starts, row_ends, k), k, compress_ratio, stable, out)
            return out

        def out_variant(logits, row_starts, row_ends, k=2048, compress_ratio=1, stable=False, out=None):
            validate.check_prefill(logits, row_starts, row_ends, k, compress_ratio)
            validate.check_out(out, logits, k)
            validate.check_no_overlap(out, logits=logits, row_starts=row_starts, row_ends=row_ends)
            run(logits, (row_starts, row_ends, k), k, compress_ratio, stable, out)

        def fake(logits, row_starts, row_ends, k=2048, compress_ratio=1, stable=False):
            validate.check_prefill(logits, row_starts, row_ends, k, compress_ratio)
            return logits.new_empty((logits.shape[0], k), dtype=torch.int32)

        def fake_out(logits, row_starts, row_ends, k=2048, compress_ratio=1, stable=False, out=None):
            validate.check_prefill(logits, row_starts, row_ends, k, compress_ratio)
            validate.check_out(out, logits, k)

    key = backend.name if backend is not None else ""
    f = torch.library.custom_op(f"{NAMESPACE}::{qualname}", functional, mutates_args=(), schema=SCHEMAS[family])
    f.register_fake(fake)
    o = torch.library.custom_op(
        f"{NAMESPACE}::{qualname}_out", out_variant, mutates_args=("out",), schema=OUT_SCHEMAS[family]
    )
    o.register_fake(fake_out)
    _OPS[(key, family, False)] = f
    _OPS[(key, family, True)] = o


@functools.lru_cache(maxsize=None)
def _warn_generic_on_device(family: str, device_type: str) -> None:
    warnings.warn(
        f"{NAMESPACE}::topk_{family} ran its reference kernel on {device_type}: nothing chose a "
        f"faster backend (install passes.IndexerTopKPass, or pass backend= to dsa_ops.topk_{family})",
        stacklevel=3,
    )


# Set once a ``with passes.install():`` block has ended in this process. From then on a
# generic op that runs belongs to a graph compiled without the pass, typically a recompile
# after the block: that is worth a warning on every device, the CPU included.
_scoped_pass_left = False


def note_scoped_pass_left() -> None:
    """Called by ``passes.install`` when its block ends."""
    global _scoped_pass_left
    _scoped_pass_left = True


@functools.lru_cache(maxsize=None)
def _warn_generic_after_scope(family: str, device_type: str) -> None:
    warnings.warn(
        f"{NAMESPACE}::topk_{family} ran its reference kernel on {device_type}: this graph was compiled "
        f"without the decode pass, after a `with passes.install():` block had ended (a recompile, e.g. on "
        f"a new shape, after the block does not see the pass). Compile with "
        f"torch.compile(..., options=passes.inductor_options()) to keep the pass on every recompile",
        stacklevel=3,
    )


def register_backend_ops(backend: Backend) -> None:
    for family in FAMILIES:
        if (backend.name, family, False) in _OPS:
            continue
        writer_of = functools.partial(getattr, backend, family)
        if getattr(backend, family) is None:
            continue
        _register(op_name(backend.name, family), family, writer_of, backend)


def _register_generic() -> None:
    from dsa_ops.backends import reference

    for family in FAMILIES:
        _register(op_name(None, family), family, functools.partial(getattr, reference, family), None)


def backend_op(backend: str | None, family: str, out: bool = False):
    """The OpOverload ``torch.ops.dsa_ops.<name>.default`` for (backend or None, family)."""
    if family not in FAMILIES:
        raise ValueError(f"family: expected one of {FAMILIES}, got {family!r}")
    if (backend or "", family, out) not in _OPS:
        raise ValueError(f"backend: {backend!r} registers no {family} op")
    return getattr(getattr(torch.ops, NAMESPACE), op_name(backend, family, out)).default


def generic_op(family: str, out: bool = False):
    return backend_op(None, family, out)


_register_generic()


# ``check=True`` under torch.compile: the device-value checks synchronise and branch on device
# data, which dynamo cannot trace, so compiled calls run them in these ops. Each returns a
# fresh copy of the index tensors it checked, which the top-k op then reads: the data
# dependency keeps the check in the graph (an op with no output would be dead code) and
# orders it before any write to ``out``. Eager calls run the checks directly.
@torch.library.custom_op(f"{NAMESPACE}::check_decode_values", mutates_args=())
def check_decode_values(logits: Tensor, lengths: Tensor, next_n: int) -> Tensor:
    """``lengths`` (a copy) once every length lies in [0, W]; else the ValueError of
    :func:`dsa_ops.validate.check_decode_values`."""
    validate.check_decode_values(logits, lengths, next_n, validate.decode_layout(lengths, logits.shape[0], next_n))
    return lengths.clone()


@check_decode_values.register_fake
def _(logits: Tensor, lengths: Tensor, next_n: int) -> Tensor:
    return torch.empty_like(lengths)


@torch.library.custom_op(f"{NAMESPACE}::check_prefill_values", mutates_args=())
def check_prefill_values(logits: Tensor, row_starts: Tensor, row_ends: Tensor) -> tuple[Tensor, Tensor]:
    """``(row_starts, row_ends)`` (copies) once 0 <= start <= end <= W in every row; else the
    ValueError of :func:`dsa_ops.validate.check_prefill_values`."""
    validate.check_prefill_values(logits, row_starts, row_ends)
    return row_starts.clone(), row_ends.clone()


@check_prefill_values.register_fake
def _(logits: Tensor, row_starts: Tensor, row_ends: Tensor) -> tuple[Tensor, Tensor]:
    return torch.empty_like(row_starts), torch.empty_like(row_ends)
