"""The backends: their records (:mod:`~dsa_ops.backends.base`) and the registry
(:mod:`~dsa_ops.backends.registry`), re-exported here. The package is also callable:
``dsa_ops.backends()`` is :func:`~dsa_ops.backends.registry.backends`.
"""

from __future__ import annotations

import sys
import types
from typing import Mapping

from dsa_ops.backends.base import Backend, Query, Support
from dsa_ops.backends.registry import BACKENDS, backends, get, load_builtin, register


class _CallableModule(types.ModuleType):
    """Lets ``dsa_ops.backends`` be both this package and the function ``backends()``."""

    def __call__(self, include_test_only: bool = False) -> Mapping[str, Backend]:
        return backends(include_test_only)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["Backend", "Query", "Support", "BACKENDS", "backends", "get", "register", "load_builtin"]
