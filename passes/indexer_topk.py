"""The decode rewrite: retarget ``dsa_ops::topk_decode`` nodes to the policy's backend op.

A captured decode graph cannot see the live context length, so the backend is chosen
once per node from host facts: the device's platform and arch, k, compress_ratio, the
width, the row count and the stable flag, read from the node's arguments and
``meta["val"]``. A symbolic width or row count (``dynamic=True``) gives its whole value
range instead, and a band rule applies only when the range lies inside its band. The
lengths are never looked at. Every backend op has the generic op's schema,
so a rewrite only changes the call target (functional form) or the mutable op carried by
``auto_functionalized`` / ``auto_functionalized_v2`` (the ``out=`` form).
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Union

import torch
from torch import fx
from torch._inductor.custom_graph_pass import CustomGraphPass

import dsa_ops
from dsa_ops import ops
from dsa_ops import policy as policy_mod
from dsa_ops.backends import get as get_backend

log = logging.getLogger("dsa_ops.passes")

_SCHEMA_DEFAULTS = {"k": 2048, "next_n": 1, "compress_ratio": 1, "stable": False}
_ARG_ORDER = ("logits", "lengths", "k", "next_n", "compress_ratio", "stable")


@dataclass(frozen=True)
class Rewrite:
    """One retargeted node: which, to what, and why."""

    node: str
    form: str  # "functional" or "out"
    backend: str
    reason: str
    k: int
    compress_ratio: int
    width: Optional[int]
    rows: Optional[int] = None  # None when symbolic
    rows_bounds: tuple[int, Optional[int]] = (0, None)  # the symbolic row count's range
    skipped: tuple[str, ...] = ()  # rules that matched but could not serve, with why


def _auto_functionalized_targets() -> tuple[Any, ...]:
    hops = []
    for name in ("auto_functionalized", "auto_functionalized_v2"):
        hop = getattr(torch.ops.higher_order, name, None)
        if hop is not None:
            hops.append(hop)
    return tuple(hops)


def _arg(node_args: tuple, node_kwargs: dict, name: str) -> Any:
    i = _ARG_ORDER.index(name)
    if i < len(node_args):
        return node_args[i]
    return node_kwargs.get(name, _SCHEMA_DEFAULTS.get(name))


def _dim(logits: Any, i: int) -> tuple[Optional[int], tuple[int, Optional[int]]]:
    """(size, bounds) of ``logits``' dim ``i`` (0: rows, 1: width): the size when it is an
    int; for a symbolic size None and its value range from the ShapeEnv ([lo, hi], hi None
    when unbounded), which a band rule must cover whole to apply
    (:meth:`dsa_ops.policy.Rule.band_holds`, :meth:`~dsa_ops.policy.Rule.rows_hold`)."""
    val = logits.meta.get("val") if isinstance(logits, fx.Node) else None
    if val is None:
        return None, (0, None)
    n = val.shape[i]
    if isinstance(n, int):
        return n, (n, n)
    try:
        rng = n.node.shape_env.bound_sympy(n.node.expr)
    except Exception:  # no range known: unbounded
        return None, (0, None)
    return None, (max(_finite(rng.lower) or 0, 0), _finite(rng.upper))


def _finite(bound: Any) -> Optional[int]:
    """A sympy range end as an int, None when infinite. (torch's ``int_oo`` reports
    ``is_finite`` True on torch 2.13, so the test is whether ``int()`` takes it.)"""
    try:
        v = int(bound)
    except (TypeError, ValueError, AttributeError, OverflowError):
        return None
    return v if abs(v) < 1 << 62 else None


def _device(logits: Any) -> str:
    val = logits.meta.get("val") if isinstance(logits, fx.Node) else None
    return val.device.type if val is not None else "cpu"


def _generic_decode_nodes(graph: fx.Graph) -> Iterable[tuple[fx.Node, str, tuple, dict]]:
    """(node, form, args, kwargs) for each generic decode call, functional or out form."""
    functional = ops.generic_op("decode")
    out_op = ops.generic_op("decode", out=True)
    hops = _auto_functionalized_targets()
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is functional or node.target is functional.overloadpacket:
            yield node, "functional", tuple(node.args), dict(node.kwargs)
        elif node.target is out_op:  # a mutating call left unfunctionalized (plain FX graphs)
            yield node, "out", tuple(node.args), dict(node.kwargs)
        elif node.target in hops and node.args and node.args[0] is out_op:
            yield node, "auto_functionalized", (), dict(node.kwargs)


def rewrite_graph(graph: fx.Graph, policy: policy_mod.PolicyArg = None) -> list[Rewrite]:
    """Retarget every generic decode node in ``graph``; return what was done.

    ``policy``: a Policy, a policy JSON path or None (:func:`dsa_ops.policy.current`).
    """
    pol = policy_mod.resolve(policy) or policy_mod.current()
    done = []
    for node, form, args, kwargs in _generic_decode_nodes(graph):
        logits = _arg(args, kwargs, "logits")
        k, cr = _arg(args, kwargs, "k"), _arg(args, kwargs, "compress_ratio")
        stable = bool(_arg(args, kwargs, "stable"))
        width, bounds = _dim(logits, 1)
        rows, rows_bounds = _dim(logits, 0)
        facts = policy_mod.facts_for(_device(logits), k, cr, width, stable, bounds, rows, rows_bounds)
        choice = pol.choose("decode", facts)
        backend = get_backend(choice.backend)
        if form == "functional":
            node.target = ops.backend_op(backend.name, "decode")
        elif form == "out":
            node.target = ops.backend_op(backend.name, "decode", out=True)
        else:
            node.args = (ops.backend_op(backend.name, "decode", out=True),) + tuple(node.args[1:])
        rw = Rewrite(node.name, "functional" if form == "functional" else "out", backend.name,
                     choice.reason, k, cr, width, rows, rows_bounds, choice.skipped)
        log.info("dsa_ops pass: %s (%s) -> %s: %s", rw.node, rw.form, rw.backend, rw.reason)
        for why in choice.skipped:
            log.info("dsa_ops pass:   skipped %s", why)
        done.append(rw)
    return done


def rewrite_topk(gm_or_graph: Union[fx.GraphModule, fx.Graph], policy: policy_mod.PolicyArg = None) -> int:
    """Plain FX entry point (aot_eager, custom backends): rewrite in place, return the count."""
    graph = gm_or_graph.graph if isinstance(gm_or_graph, fx.GraphModule) else gm_or_graph
    n = len(rewrite_graph(graph, policy))
    if isinstance(gm_or_graph, fx.GraphModule) and n:
        gm_or_graph.recompile()
    return n


_SOURCES = tuple(
    os.path.join(os.path.dirname(mod.__file__), name)
    for mod, name in ((dsa_ops, "policy.py"), (dsa_ops, "ops.py"), (dsa_ops, "validate.py"))
) + (os.path.abspath(__file__),)


class IndexerTopKPass(CustomGraphPass):
    """Inductor post-grad pass: decode top-k nodes -> the policy's backend op.

    Args:
        policy: a :class:`dsa_ops.policy.Policy`, or the path of a policy JSON file (read
            here, once); None reads :func:`dsa_ops.policy.current` at each call (and at each
            :meth:`uuid`). Anything else, or a path with no file, is an ArgumentError (a
            ValueError) raised here, not at compile time.

    ``rewrites`` accumulates every :class:`Rewrite` made; ``count`` is its length.
    """

    def __init__(self, policy: policy_mod.PolicyArg = None) -> None:
        self.policy = policy_mod.resolve(policy)
        self.rewrites: list[Rewrite] = []

    @property
    def count(self) -> int:
        return len(self.rewrites)

    def _policy(self) -> policy_mod.Policy:
        return self.policy or policy_mod.current()

    def __call__(self, graph: fx.Graph) -> None:
        self.rewrites.extend(rewrite_graph(graph, self._policy()))

    def uuid(self) -> str:
        """Covers the pass and policy sources, the policy hash, the device arch and the
        versions of the backends this policy can pick, so Inductor's cache never reuses an
        artifact compiled under another policy or another backend build."""
        pol = self._policy()
        h = hashlib.sha256()
        for path in _SOURCES:
            with open(path, "rb") as f:
                h.update(f.read())
        h.update(pol.content_hash().encode())
        for dev in ("cpu", "cuda"):
            h.update(repr(policy_mod.device_platform(dev)).encode())
        for name in pol.backends_named():
            try:
                b = get_backend(name)
            except ValueError:
                h.update(f"{name}:unregistered".encode())
                continue
            avail = b.availability()
            h.update(f"{name}:{bool(avail)}:{b.version() if avail else ''}".encode())
        return h.hexdigest()
