"""Test-only stand-in backends (for backends that cannot run here, e.g. AITER)."""

from __future__ import annotations

import contextlib
from typing import Iterator

from dsa_ops.backends import BACKENDS, reference, register
from dsa_ops.backends.base import YES, Backend, Support


@contextlib.contextmanager
def standin_backend(name: str, available: bool = True) -> Iterator[str]:
    """Register (once) a test-only backend that computes the reference; yield its name.

    Its ops stay registered (torch.library cannot unregister cleanly mid-process) but the
    registry entry is removed on exit, so nothing else sees it.
    """
    probe = (lambda: YES) if available else (lambda: Support(False, "stand-in marked unavailable"))
    backend = Backend(name, reference.decode, reference.prefill, probe, lambda q: YES, lambda: "standin",
                      description="test-only stand-in computing the reference", test_only=True)
    BACKENDS.pop(name, None)
    register(backend)
    try:
        yield name
    finally:
        BACKENDS.pop(name, None)
