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

One set of kernels serves both families: each op is registered from the family's
description (:class:`dsa_ops.family.Family`: schema, argument order, checks), and a
backend's op pair is registered when the registry adds the record (a subscriber, so the
registry never imports this module).
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable

import torch
from torch import Tensor

from dsa_ops import validate
from dsa_ops.backends import reference, registry
from dsa_ops.backends.base import Backend, Query
from dsa_ops.family import FAMILIES as _FAMILIES
from dsa_ops.family import Family

NAMESPACE = "dsa_ops"
FAMILIES = tuple(_FAMILIES)
SCHEMAS = {name: fam.schema for name, fam in _FAMILIES.items()}
OUT_SCHEMAS = {name: fam.out_schema for name, fam in _FAMILIES.items()}

_OPS: dict[tuple[str, str, bool], object] = {}  # (backend or "", family, out) -> CustomOpDef


def op_name(backend: str | None, family: str, out: bool = False) -> str:
    """Unqualified op name, e.g. ``topk_decode_triton_out``."""
    return f"topk_{family}" + (f"_{backend}" if backend else "") + ("_out" if out else "")


def _register(qualname: str, fam: Family, writer_of: Callable[[], Callable], backend: Backend | None) -> None:
    """Register the functional and the ``_out`` op of one (backend or the generic, family).

    The kernels take the family's arguments as one tuple ``a`` (:meth:`Family.bind`):
    ``a[:-2]`` is the writer's ``(logits, *index, k, *ints)``, ``a[-2:]`` is
    ``(compress_ratio, stable)``, ``a[0]`` the logits and ``a[kpos]`` k.
    """
    kpos = len(fam.tensors)

    def run(a: tuple, out: Tensor) -> None:
        logits, k, (compress_ratio, stable) = a[0], a[kpos], a[-2:]
        if backend is not None:
            # Look the record up at call time: a re-registered backend replaces the old one.
            current = registry.BACKENDS.get(backend.name)
            if current is None:
                raise ValueError(f"{NAMESPACE}::{qualname}: backend {backend.name!r} is no longer registered")
            sup = current.check(Query(fam.name, logits.device.type, k, int(logits.shape[1]), stable, compress_ratio))
            if not sup:
                raise ValueError(f"{NAMESPACE}::{qualname}: {sup.reason}")
            getattr(current, fam.name)(*a[:-2], stable, out)
            return
        if _scoped_pass_left:
            _warn_generic_after_scope(fam.name, logits.device.type)
        elif logits.device.type != "cpu":
            _warn_generic_on_device(fam.name, logits.device.type)
        writer_of()(*a[:-2], stable, out)

    def functional(*args, **kwargs):
        a = fam.bind(args, kwargs)
        fam.check(*a[:-1])
        out = torch.empty((a[0].shape[0], a[kpos]), dtype=torch.int32, device=a[0].device)
        run(a, out)
        return out

    def out_variant(*args, **kwargs):
        *a, out = fam.bind(args, kwargs, out=True)
        a = tuple(a)
        fam.check(*a[:-1])
        validate.check_out(out, a[0], a[kpos])
        validate.check_no_overlap(out, **dict(zip(fam.tensors, a)))
        run(a, out)

    def fake(*args, **kwargs):
        a = fam.bind(args, kwargs)
        fam.check(*a[:-1])
        return a[0].new_empty((a[0].shape[0], a[kpos]), dtype=torch.int32)

    def fake_out(*args, **kwargs):
        *a, out = fam.bind(args, kwargs, out=True)
        fam.check(*a[:-1])
        validate.check_out(out, a[0], a[kpos])

    key = backend.name if backend is not None else ""
    f = torch.library.custom_op(f"{NAMESPACE}::{qualname}", functional, mutates_args=(), schema=fam.schema)
    f.register_fake(fake)
    o = torch.library.custom_op(f"{NAMESPACE}::{qualname}_out", out_variant, mutates_args=("out",),
                                schema=fam.out_schema)
    o.register_fake(fake_out)
    _OPS[(key, fam.name, False)] = f
    _OPS[(key, fam.name, True)] = o


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
    """Register a backend's op pair per family it has a writer for (once; a registry subscriber)."""
    for fam in _FAMILIES.values():
        if (backend.name, fam.name, False) in _OPS or getattr(backend, fam.name) is None:
            continue
        _register(op_name(backend.name, fam.name), fam, functools.partial(getattr, backend, fam.name), backend)


def _register_generic() -> None:
    for fam in _FAMILIES.values():
        _register(op_name(None, fam.name), fam, functools.partial(getattr, reference, fam.name), None)


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
registry.subscribe(register_backend_ops)


# ``check=True`` under torch.compile: the device-value checks synchronise and branch on device
# data, which dynamo cannot trace, so compiled calls run them in these ops,
# ``dsa_ops::check_<family>_values(logits, *index, *ints)``. Each returns fresh copies of the
# index tensors it checked, which the top-k op then reads: the data dependency keeps the check
# in the graph (an op with no output would be dead code) and orders it before any write to
# ``out``. Eager calls run the checks directly.
_CHECK_OPS: dict[str, object] = {}


def _register_check(fam: Family) -> None:
    ints = ", ".join(f"int {n}" for n, _ in fam.ints)
    args = ", ".join(["Tensor logits", *(f"Tensor {n}" for n in fam.index)] + ([ints] if ints else []))
    returns = "Tensor" if len(fam.index) == 1 else "(" + ", ".join("Tensor" for _ in fam.index) + ")"
    n = len(fam.tensors)

    def check_values(*a):
        fam.values(a[0], a[1:n], a[n:], None)
        copies = tuple(t.clone() for t in a[1:n])
        return copies[0] if len(copies) == 1 else copies

    def fake(*a):
        copies = tuple(torch.empty_like(t) for t in a[1:n])
        return copies[0] if len(copies) == 1 else copies

    op = torch.library.custom_op(f"{NAMESPACE}::check_{fam.name}_values", check_values, mutates_args=(),
                                 schema=f"({args}) -> {returns}")
    op.register_fake(fake)
    _CHECK_OPS[fam.name] = op


def checked(family: str, logits: Tensor, index: tuple, ints: tuple) -> tuple:
    """``index`` checked by ``check=True``'s value checks, as an op of the graph (the copies to
    read instead of ``index``); raises their ValueError when the graph runs."""
    got = _CHECK_OPS[family](logits, *index, *ints)
    return (got,) if isinstance(got, Tensor) else tuple(got)


def check_op(family: str):
    """The OpOverload ``torch.ops.dsa_ops.check_<family>_values.default``."""
    return getattr(getattr(torch.ops, NAMESPACE), f"check_{family}_values").default


for _fam in _FAMILIES.values():
    _register_check(_fam)
