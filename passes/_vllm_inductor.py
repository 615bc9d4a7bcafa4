"""The pass object vLLM sees. Imports vLLM at module import: only :mod:`passes.vllm`
imports this module, and only inside functions, so ``import passes.vllm`` stays light.

vLLM 0.33.0 accepts only its own ``InductorPass`` in
``inductor_compile_config["post_grad_custom_post_pass"]`` (``compilation/backends.py:990-998``
asserts it; ``PostGradPassManager.add`` asserts it again, ``pass_manager.py:225-227``) and
JSON-encodes every pass's ``uuid()`` into the manager's uuid (``pass_manager.py:229-250``)
and the compilation-config hash (``config/utils.py:309-312``), so the uuid must be a str.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Optional, Sequence

from torch import fx
from vllm.compilation.passes.inductor_pass import InductorPass, get_pass_context

from passes.indexer_topk import IndexerTopKPass

GraphPass = Callable[[fx.Graph], None]


def member_uuid(member: GraphPass) -> str:
    """A JSON-safe cache key for one member pass.

    A member without ``uuid()`` (or whose uuid is None) is keyed by its source, which is
    what vLLM's own ``CallableInductorPass`` does for plain callables.
    """
    fn = getattr(member, "uuid", None)
    u: Any = fn() if callable(fn) else None
    if u is None:
        return "source:" + InductorPass.hash_source(member)
    if isinstance(u, (bytes, bytearray)):
        return bytes(u).hex()
    if isinstance(u, str):
        return u
    return json.dumps(u, sort_keys=True, default=repr)


class VllmComposedPass(InductorPass):
    """Runs ``members`` in order (a pass that was already configured first, ours last).

    Args:
        members: post-grad passes; each takes an ``fx.Graph`` and edits it in place.

    ``uuid()`` hashes every member's uuid, so vLLM's manager uuid and its compile-cache
    hash change whenever any member (or our policy) does.
    """

    def __init__(self, members: Sequence[GraphPass]) -> None:
        if not members:
            raise ValueError("members: expected at least one graph pass")
        for m in members:
            if not callable(m):
                raise ValueError(f"members: {m!r} is not callable (expected a pass taking an fx.Graph)")
        self.members: tuple[GraphPass, ...] = tuple(members)

    @property
    def topk_pass(self) -> Optional[IndexerTopKPass]:
        """Our :class:`passes.IndexerTopKPass` member (its ``rewrites`` say what it did)."""
        found = [m for m in self.members if isinstance(m, IndexerTopKPass)]
        return found[-1] if found else None

    def foreign(self) -> tuple[GraphPass, ...]:
        """The members that are not ours."""
        return tuple(m for m in self.members if not isinstance(m, IndexerTopKPass))

    def __call__(self, graph: fx.Graph) -> None:
        try:
            compile_range = get_pass_context().compile_range
        except (AssertionError, AttributeError):  # outside vLLM's pass context: every member applies
            compile_range = None
        for m in self.members:
            applicable = getattr(m, "is_applicable_for_range", None)
            if compile_range is None or applicable is None or applicable(compile_range):
                m(graph)

    def uuid(self) -> str:
        h = hashlib.sha256(b"dsa_ops.passes.vllm.VllmComposedPass")
        for m in self.members:
            h.update(member_uuid(m).encode())
            h.update(b"\0")
        return h.hexdigest()

    def __repr__(self) -> str:
        return f"VllmComposedPass({', '.join(type(m).__name__ for m in self.members)})"
