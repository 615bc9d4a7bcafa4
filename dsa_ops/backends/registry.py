"""The backend registry: name -> :class:`~dsa_ops.backends.base.Backend`.

Modules listed in ``_MODULES`` each define ``BACKEND`` (one record) or ``BACKENDS`` (a
tuple of records); importing them must not import optional dependencies (triton, aiter,
vllm), which load inside the writers and probes.

The registry knows nothing of ops: :mod:`dsa_ops.ops` subscribes (:func:`subscribe`) and
registers each new record's op pair, so the imports run one way (ops -> registry -> base).
"""

from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import Callable, Mapping

from dsa_ops.backends.base import Backend

_MODULES = (
    "dsa_ops.backends.reference",
    "dsa_ops.backends.torch_topk",
    "dsa_ops.backends.aiter",
    "dsa_ops.backends.vllm_intree",
    "dsa_ops.backends.vllm_radix",
    "dsa_ops.backends.triton",
    "dsa_ops.backends.cuda.backend",
)

BACKENDS: dict[str, Backend] = {}
_SUBSCRIBERS: list[Callable[[Backend], None]] = []


def subscribe(fn: Callable[[Backend], None]) -> None:
    """Call ``fn(record)`` for every backend registered so far and every one registered later."""
    _SUBSCRIBERS.append(fn)
    for backend in tuple(BACKENDS.values()):
        fn(backend)


def register(backend: Backend) -> Backend:
    """Add a backend (its ops are registered by the subscribers). Tests use this for stand-ins."""
    if backend.name in BACKENDS and BACKENDS[backend.name] is not backend:
        raise ValueError(f"backend: a backend named {backend.name!r} is already registered")
    BACKENDS[backend.name] = backend
    for fn in _SUBSCRIBERS:
        fn(backend)
    return backend


def load_builtin() -> None:
    for mod in _MODULES:
        module = importlib.import_module(mod)
        for backend in getattr(module, "BACKENDS", None) or (module.BACKEND,):
            if backend.name not in BACKENDS:
                register(backend)


def backends(include_test_only: bool = False) -> Mapping[str, Backend]:
    """Read-only mapping of every registered backend (available or not)."""
    return MappingProxyType(
        {n: b for n, b in BACKENDS.items() if include_test_only or not b.test_only}
    )


def get(name: str) -> Backend:
    """The backend called ``name``; a ValueError lists the registered ones otherwise."""
    try:
        return BACKENDS[name]
    except (KeyError, TypeError):  # TypeError: an unhashable name
        raise ValueError(f"backend: no backend named {name!r}; registered: {sorted(BACKENDS)}") from None
