"""Installing the pass without clobbering anyone else's: composition and scoped installs."""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any, Callable, Iterator, Optional, Sequence

from torch import fx
from torch._inductor import config
from torch._inductor.custom_graph_pass import CustomGraphPass

from dsa_ops import ops
from dsa_ops import policy as policy_mod
from passes.indexer_topk import IndexerTopKPass

GraphPass = Callable[[fx.Graph], None]


class ComposedPass(CustomGraphPass):
    """Runs several post-grad passes in order; its uuid covers all of them.

    A member that is a plain callable (no ``uuid``) makes :meth:`uuid` return None, which
    tells Inductor not to cache: we cannot vouch for what it does.
    """

    def __init__(self, passes: Sequence[GraphPass]) -> None:
        flat: list[GraphPass] = []
        for p in passes:
            flat.extend(p.passes if isinstance(p, ComposedPass) else [p])
        self.passes = tuple(flat)

    def __call__(self, graph: fx.Graph) -> None:
        for p in self.passes:
            p(graph)

    def uuid(self) -> Optional[str]:
        h = hashlib.sha256(b"dsa_ops.ComposedPass")
        for p in self.passes:
            u = p.uuid() if hasattr(p, "uuid") else None
            if u is None:
                return None
            h.update(repr(u).encode())
        return h.hexdigest()


def compose(existing: Any, ours: GraphPass) -> GraphPass:
    """``existing`` (None, a pass, or a list/tuple of passes) followed by ``ours``."""
    if existing is None:
        return ours
    if isinstance(existing, (list, tuple)):
        return ComposedPass([*existing, ours])
    return ComposedPass([existing, ours])


def inductor_options(policy: policy_mod.PolicyArg = None, existing: Any = None,
                     pass_: Optional[IndexerTopKPass] = None) -> dict[str, Any]:
    """Options for ``torch.compile(options=...)`` that add the pass after ``existing``.

    ``policy`` is what :class:`IndexerTopKPass` takes (a Policy, a JSON path or None),
    checked here.

    Example:
        >>> torch.compile(step, fullgraph=True, options=passes.inductor_options())  # doctest: +SKIP
    """
    pol = policy_mod.resolve(policy)
    if existing is None:
        existing = config.post_grad_custom_post_pass
    return {"post_grad_custom_post_pass": compose(existing, pass_ or IndexerTopKPass(pol))}


@contextlib.contextmanager
def install(policy: policy_mod.PolicyArg = None) -> Iterator[IndexerTopKPass]:
    """Scoped install into ``torch._inductor.config`` (composed with what is there).

    ``policy`` is what :class:`IndexerTopKPass` takes (a Policy, a JSON path or None),
    checked on entry. Yields the pass, whose ``rewrites`` list what it did. The previous value is restored
    on exit. Compilation happens at the first call, and Inductor reads its config at each
    compile: a graph compiled after the block (a recompile on a new shape, say) runs
    without the pass. It still computes the right answer (the generic op's kernel is the
    reference), and dsa_ops warns when such a graph runs. For a compiled function that
    outlives the block, use ``torch.compile(fn, options=inductor_options())``, which keeps
    the pass on every recompile.
    """
    ours = IndexerTopKPass(policy)  # checks the policy before anything is patched
    try:
        with config.patch(post_grad_custom_post_pass=compose(config.post_grad_custom_post_pass, ours)):
            yield ours
    finally:
        ops.note_scoped_pass_left()
