"""The two op families, decode and prefill, described as data.

Each :class:`Family` says what its arguments are (the index tensors after ``logits``, the int
arguments after ``k``), which host and device-value checks apply and how an eager call's
route-cache key is built. :mod:`dsa_ops.ops` registers every family's ops from it and
:mod:`dsa_ops.api` runs both families' eager and compiled paths through it, so the two
families differ here only.

Argument orders, shared by every op and writer of a family:

* op: ``(logits, *index, k, *ints, compress_ratio, stable[, out])``
* writer: ``(logits, *index, k, *ints, stable, out)``
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from torch import Tensor

from dsa_ops import validate

REQUIRED = object()  # a parameter without a default (the tensors)


@dataclass(frozen=True)
class Family:
    """One op family.

    Attributes:
        name: "decode" or "prefill"; the op names derive from it.
        index: names of the int32 index tensors after ``logits`` (lengths; row starts, ends).
        ints: names of the int arguments between ``k`` and ``compress_ratio``, with their
            schema defaults (decode: ``next_n=1``).
        check: every host check: ``(logits, *index, k, *ints, compress_ratio)`` -> the
            decode lengths layout or None; raises :class:`~dsa_ops.validate.ArgumentError`.
        values: the ``check=True`` device-value checks: ``(logits, index, ints, layout)``;
            synchronise.
        key: the eager route cache's key, ``(pol_id, logits, index, out, k, ints,
            compress_ratio, stable, backend, long)`` -> a tuple of every host fact the route
            depends on. The types of the int / bool arguments are part of it, so ``k=8.0`` or
            ``stable=1`` (equal to ``8`` and ``True``) never reuse a good call's route. It
            raises AttributeError / TypeError for a non-tensor or an unhashable argument (the
            caller then runs the checks, which say what). Written out per family, flat: a
            generic loop over the index tensors cost ~0.5 us a call more.
        guarded: the backend is picked by the host int ``max_seqlen_k`` against the
            policy's threshold (prefill).
    """

    name: str
    index: tuple[str, ...]
    ints: tuple[tuple[str, int], ...]
    check: Callable[..., Optional[str]]
    values: Callable[[Tensor, tuple, tuple, Optional[str]], None]
    key: Callable[..., tuple]
    guarded: bool = False

    @property
    def tensors(self) -> tuple[str, ...]:
        """The tensor arguments' names, logits first (``out`` aside)."""
        return ("logits",) + self.index

    @property
    def params(self) -> tuple[tuple[str, object], ...]:
        """(name, schema default or :data:`REQUIRED`) per functional-op argument, in order."""
        return (tuple((n, REQUIRED) for n in self.tensors) + (("k", 2048),) + self.ints
                + (("compress_ratio", 1), ("stable", False)))

    @property
    def schema(self) -> str:
        """The functional ops' schema (every op of the family has this one)."""
        return f"({self._args(defaults=True)}) -> Tensor"

    @property
    def out_schema(self) -> str:
        """The ``_out`` ops' schema: the same arguments without defaults (custom_op allows no
        kwarg-only tensors, so ``out`` is the last positional one) and no return."""
        return f"({self._args(defaults=False)}, Tensor(a!) out) -> ()"

    def _args(self, defaults: bool) -> str:
        kinds = {"k": "int", "compress_ratio": "int", "stable": "bool"}
        parts = []
        for name, default in self.params:
            kind = "Tensor" if default is REQUIRED else kinds.get(name, "int")
            parts.append(f"{kind} {name}" + (f"={default}" if defaults and default is not REQUIRED else ""))
        return ", ".join(parts)

    def bind(self, args: tuple, kwargs: dict, out: bool = False) -> tuple:
        """An op call's arguments as one positional tuple with the defaults filled in (and
        ``out`` last for an ``_out`` op): the dispatcher hands a Python kernel only what the
        caller passed, positionally or by name."""
        params = self.params + ((("out", REQUIRED),) if out else ())
        if not kwargs and len(args) == len(params):
            return args
        return args + tuple(kwargs[n] if n in kwargs else d for n, d in params[len(args):])


def _decode_values(logits: Tensor, index: tuple, ints: tuple, layout: Optional[str]) -> None:
    (lengths,), (next_n,) = index, ints
    if layout in (None, "symbolic"):
        layout = validate.decode_layout(lengths, logits.shape[0], next_n)
    validate.check_decode_values(logits, lengths, next_n, layout)


def _prefill_values(logits: Tensor, index: tuple, ints: tuple, layout: Optional[str]) -> None:
    validate.check_prefill_values(logits, *index)


def _decode_key(pol_id: int, logits: Tensor, index: tuple, out: Optional[Tensor], k, ints: tuple, compress_ratio,
                stable, backend, long: bool) -> tuple:
    (lengths,), (next_n,) = index, ints
    return ("decode", pol_id, backend, k, k.__class__, next_n, next_n.__class__, compress_ratio,
            compress_ratio.__class__, stable, stable.__class__, logits.dtype, logits.device, logits.shape,
            logits.stride(), lengths.dtype, lengths.device, lengths.shape, lengths.stride(),
            None if out is None else (out.dtype, out.device, out.shape, out.stride()))


def _prefill_key(pol_id: int, logits: Tensor, index: tuple, out: Optional[Tensor], k, ints: tuple, compress_ratio,
                 stable, backend, long: bool) -> tuple:
    starts, ends = index
    return ("prefill", pol_id, backend, long, k, k.__class__, compress_ratio, compress_ratio.__class__, stable,
            stable.__class__, logits.dtype, logits.device, logits.shape, logits.stride(), starts.dtype,
            starts.device, starts.shape, starts.stride(), ends.dtype, ends.device, ends.shape, ends.stride(),
            None if out is None else (out.dtype, out.device, out.shape, out.stride()))


DECODE = Family("decode", ("lengths",), (("next_n", 1),), validate.check_decode, _decode_values, _decode_key)
PREFILL = Family("prefill", ("row_starts", "row_ends"), (), validate.check_prefill, _prefill_values, _prefill_key,
                 guarded=True)
FAMILIES: dict[str, Family] = {f.name: f for f in (DECODE, PREFILL)}
