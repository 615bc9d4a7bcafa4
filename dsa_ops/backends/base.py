"""What a backend is: a name, two writer functions and two host-only checks.

A backend never registers ops itself: :mod:`dsa_ops.ops` turns every record in
:data:`dsa_ops.backends.BACKENDS` into the ops ``dsa_ops::topk_decode_<name>`` and
``dsa_ops::topk_prefill_<name>`` (plus their ``_out`` forms) with the shared schemas.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Optional

from torch import Tensor

# Writers fill ``out`` (R, k) int32 in place. Arguments are already validated by
# dsa_ops.validate (dtypes, ranks, strides, layouts); writers must still never read a
# logit at or past a row's clamped length and must not synchronise with the device.
DecodeWriter = Callable[[Tensor, Tensor, int, int, bool, Tensor], None]
"""(logits, lengths, k, next_n, stable, out) -> None"""
PrefillWriter = Callable[[Tensor, Tensor, Tensor, int, bool, Tensor], None]
"""(logits, row_starts, row_ends, k, stable, out) -> None"""


@dataclass(frozen=True)
class Support:
    """A yes/no answer with the reason when it is no. Truthy iff ``ok``.

    ``final=False`` marks an availability answer that only holds for now (asked during
    graph capture, say): :meth:`Backend.availability` does not cache it.
    """

    ok: bool
    reason: str = ""
    final: bool = field(default=True, compare=False)

    def __bool__(self) -> bool:
        return self.ok


YES = Support(True)


@dataclass(frozen=True)
class Query:
    """Host facts a backend may look at to say whether it serves a call.

    Nothing here depends on device data, so a decision made from it holds for every
    replay of a captured graph.
    """

    family: str  # "decode" or "prefill"
    device_type: str  # "cpu", "cuda" (ROCm reports "cuda" too)
    k: int
    width: Optional[int]  # None when symbolic (a compiled prefill's chunk width)
    stable: bool = False
    compress_ratio: int = 1


@dataclass(frozen=True)
class Backend:
    """One provider of the top-k.

    Attributes:
        name: registry key; the op names derive from it.
        decode: writer for the decode family, or None if the backend has no decode.
        prefill: writer for the prefill family, or None.
        available: import / platform probe; called once, cached by :meth:`availability`
            (unless it answers with ``final=False``).
        supports: shape / dtype / k check for one call, from host facts only.
        version: version string of what the backend wraps (goes into pass cache keys).
        description: one line for tables and ``dsa-ops explain``.
        exact: False where the backend may differ from the contract on NaN / -inf / -0.
        faults: non-empty where the wrapped kernel is known to fault the process on some
            legal input (what input, and where it was measured). No policy picks such a
            backend; an explicit ``backend=`` still runs it.
    """

    name: str
    decode: Optional[DecodeWriter]
    prefill: Optional[PrefillWriter]
    available: Callable[[], Support]
    supports: Callable[[Query], Support]
    version: Callable[[], str]
    description: str = ""
    exact: bool = True  # False: may differ from the contract on NaN / -inf / -0 (baselines)
    faults: str = ""  # a known fault of the process on legal input (see the docstring)
    test_only: bool = False  # registered by tests; never listed by dsa_ops.backends()
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def availability(self) -> Support:
        """Cached :attr:`available` probe (import and platform checks run once)."""
        if "available" in self._cache:
            return self._cache["available"]
        try:
            answer = self.available()
        except Exception as exc:  # a probe that crashes means "not here"
            answer = Support(False, f"probe failed: {exc!r}")
        if answer.final:
            self._cache["available"] = answer
        return answer

    def check(self, query: Query) -> Support:
        """Availability, family and :attr:`supports`, with the first reason that fails."""
        avail = self.availability()
        if not avail:
            return Support(False, f"backend {self.name!r} is not available: {avail.reason}")
        writer = self.decode if query.family == "decode" else self.prefill
        if writer is None:
            return Support(False, f"backend {self.name!r} has no {query.family} kernel")
        sup = self.supports(query)
        if not sup:
            return Support(False, f"backend {self.name!r} does not support this call: {sup.reason}")
        return YES


@functools.lru_cache(maxsize=None)
def module_version(module: str) -> str:
    """``module.__version__`` if it imports, else "absent" (never raises)."""
    try:
        mod = __import__(module)
    except Exception:
        return "absent"
    return str(getattr(mod, "__version__", "unknown"))
