"""Public entry points: :func:`topk_decode` and :func:`topk_prefill`.

Both run through one pair of paths, driven by the family's description
(:class:`dsa_ops.family.Family`: its index tensors, int arguments, checks and cache key):

* **Eager** (:func:`_eager`, the common serving case): the host checks, the policy's choice
  and the backend's support check are made once per (shapes, strides, dtypes, devices, k,
  next_n, stable, backend, policy, and the types of the int / bool arguments, so that
  ``k=8.0`` or ``stable=1`` never reuse the route of ``k=8`` or ``stable=True``) and cached
  as a :class:`_Route`; a repeat call costs a dict lookup, an overlap test of ``out`` and
  the writer. On plain tensors with no torch function / dispatch mode and no profiler
  active, the route calls the backend's writer directly (what the backend op's kernel
  runs), skipping the dispatcher; otherwise it calls the backend op.
* **Compiled** (:func:`_compiled`, under ``torch.compile``): the checks that need no shapes
  run at trace time with constant arguments (a bad argument raises the ValueError at trace
  time); the fake kernels check shapes and strides. Decode emits the generic op for
  ``passes.IndexerTopKPass``; prefill (a guarded family) picks its backend with a host
  branch on ``max_seqlen_k`` (a dynamo guard).
"""

from __future__ import annotations

import operator
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from dsa_ops import ops, validate
from dsa_ops import policy as policy_mod
from dsa_ops.backends.base import Backend, Query
from dsa_ops.backends.registry import BACKENDS, get
from dsa_ops.family import DECODE, FAMILIES, PREFILL, Family


def _policy_backend(family: str, device_type: str, k: int, compress_ratio: int, width: Optional[int], stable: bool,
                    long: bool, rows: Optional[int] = None) -> str:
    """The policy's backend name for a call; a host-only decision that dynamo folds to a
    constant (the inputs it depends on are already guarded: shapes, and ``long``). ``rows``
    None (compiled prefill: the chunk's row count is symbolic) fits no row band."""
    facts = policy_mod.facts_for(device_type, k, compress_ratio, width, stable, rows=rows)
    return policy_mod.current().choose(family, facts, long if FAMILIES[family].guarded else None).backend


def _static_checks(metas: tuple, k, ints: tuple, compress_ratio, stable) -> None:
    validate.check_static(metas, k, ints, compress_ratio, stable)


def _policy_scalars() -> tuple[bool, int]:
    """The current policy's ``stable`` flag and ``prefill_threshold``, for the compiled paths:
    ``policy.current()`` may stat ``$DSA_OPS_POLICY``'s file, which dynamo cannot trace, so
    it runs here, outside the trace, and the two values fold to constants."""
    pol = policy_mod.current()
    return pol.stable, pol.prefill_threshold


def _check_backend(name, family: str, device_type: str, k: int, width: Optional[int], stable: bool,
                   compress_ratio: int) -> None:
    """Raise the ValueError naming ``backend`` when no backend of that name is registered or it
    does not serve the call. Constant-folded under dynamo (marked below), so an unknown name
    raises this error at trace time, not dynamo's 'Observed exception' of the registry's."""
    try:
        backend = get(name)
    except ValueError as exc:
        validate._fail(str(exc))
    sup = backend.check(Query(family, device_type, k, width, stable, compress_ratio))
    if not sup:
        validate._fail(f"backend: {sup.reason}")


# What ``torch.compiler.assume_constant_result`` does, without importing dynamo at import time
# (``import dsa_ops`` stays cheap; tests/test_api_paths.py checks the two stay the same): dynamo
# calls these with constant arguments at trace time and folds the result.
for _fn in (_policy_backend, _static_checks, _policy_scalars, _check_backend):
    _fn._dynamo_marked_constant = True


def _meta(t) -> tuple | str:
    """(dtype, device, rank) of a tensor, or its type's name: constants under dynamo."""
    return (t.dtype, t.device, t.dim()) if isinstance(t, Tensor) else type(t).__name__


def _host_int(x, name: str):
    """A plain int argument (k, next_n, compress_ratio) as a constant: under dynamo with
    ``dynamic=True`` an int argument is traced symbolically, and ``operator.index``
    specializes it (a guard), so the policy and the checks see a constant. A float is
    refused here, by name only: after recompiles dynamo traces it as a symbolic float, which
    cannot be put into the message (nor passed to the constant-folded checks); so is a
    tensor or numpy value (traced too), by kind."""
    if isinstance(x, int) and not isinstance(x, bool):
        return operator.index(x)
    if isinstance(x, float):
        validate._fail(f"{name}: expected an int, got a float")
    if validate.traced_value(x):
        validate.not_an_int(name, x)
    return x


def _stable(stable: Optional[bool], default: bool) -> bool:
    """The call's ``stable``, or the policy's flag (``default``) when None."""
    return default if stable is None else stable


def _width(logits: Tensor) -> Optional[int]:
    """The width as a host int, or None under compile: ``int()`` on a symbolic width would
    specialize the graph on it (a prefill chunk's width changes every step)."""
    return None if torch.compiler.is_compiling() else int(logits.shape[1])


def _backend_op(name: str, family: str, logits: Tensor, k: int, compress_ratio: int, stable: bool, out: bool):
    _check_backend(name, family, logits.device.type, k, _width(logits), stable, compress_ratio)
    return ops.backend_op(name, family, out=out)


def _metas(fam: Family, logits, index: tuple, out) -> tuple:
    """(name, :func:`_meta`) per tensor argument, logits first, then ``out`` if given."""
    metas = (("logits", _meta(logits)),) + tuple((n, _meta(t)) for n, t in zip(fam.index, index))
    return metas + ((("out", _meta(out)),) if out is not None else ())


class _Route(NamedTuple):
    """What an eager call with one set of host facts runs (cached in :data:`_ROUTES`)."""

    policy: policy_mod.Policy
    backend: Backend
    writer: object  # the backend's decode / prefill writer
    op: object  # the backend op (functional or _out form)
    stable: bool
    layout: Optional[str]  # decode lengths layout (None for prefill)
    extents: tuple  # byte extents of out and the inputs (the overlap test's per-call work is then 3 pointers)


_ROUTES: dict[tuple, _Route] = {}
_ROUTES_MAX = 4096  # distinct host-fact sets kept; the cache is cleared when full


def _direct(logits: Tensor, index: tuple, out: Optional[Tensor]) -> bool:
    """Whether an eager call may run the writer itself: plain tensors, no torch function or
    dispatch mode (fake tensors, tracing, vmap) and no profiler (which should see the op)."""
    if type(logits) is not Tensor or (out is not None and type(out) is not Tensor):
        return False
    for t in index:
        if type(t) is not Tensor:
            return False
    return not (torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled()
                or torch._C._autograd._profiler_enabled())


def _resolve(fam: Family, key: Optional[tuple], pol, logits: Tensor, index: tuple, k, ints: tuple, compress_ratio,
             stable, backend, out: Optional[Tensor], long: bool) -> _Route:
    """Every host check of an eager call, then the policy's and the backend's answers, as a
    route (cached under ``key`` unless None)."""
    validate.check_static(_metas(fam, logits, index, None), k, tuple(zip((n for n, _ in fam.ints), ints)),
                          compress_ratio, stable)
    layout = fam.check(logits, *index, k, *ints, compress_ratio)
    if out is not None:
        validate.check_out(out, logits, k)
    stable = _stable(stable, pol.stable)
    if backend is None:
        backend = _policy_backend(fam.name, logits.device.type, k, compress_ratio, int(logits.shape[1]), stable, long,
                                  int(logits.shape[0]))
    op = _backend_op(backend, fam.name, logits, k, compress_ratio, stable, out is not None)
    record = get(backend)
    extents = tuple(validate.extent(t) for t in (out, logits, *index)) if out is not None else ()
    route = _Route(pol, record, getattr(record, fam.name), op, stable, layout, extents)
    if key is not None:
        if len(_ROUTES) >= _ROUTES_MAX:
            _ROUTES.clear()
        _ROUTES[key] = route
    return route


def _eager(fam: Family, logits: Tensor, index: tuple, k, ints: tuple, max_seqlen_k, backend, out: Optional[Tensor],
           compress_ratio, stable, check: bool) -> Tensor:
    """One eager call of family ``fam``: the cached route for its host facts (resolved on a
    miss), the overlap test of ``out``, the value checks if asked, and the writer or op."""
    pol = policy_mod.current()
    long = False
    if fam.guarded:
        validate.check_max_seqlen_k(max_seqlen_k)
        long = max_seqlen_k is not None and max_seqlen_k >= pol.prefill_threshold
    try:
        key = fam.key(id(pol), logits, index, out, k, ints, compress_ratio, stable, backend, long)
        route = _ROUTES.get(key)
        if route is not None and (route.policy is not pol or BACKENDS.get(route.backend.name) is not route.backend):
            route = None
    except (AttributeError, TypeError):  # not tensors, or unhashable arguments: the checks say what
        key, route = None, None
    if route is None:
        route = _resolve(fam, key, pol, logits, index, k, ints, compress_ratio, stable, backend, out, long)
    if out is not None and validate.first_overlap(out, route.extents, (logits, *index)) >= 0:
        validate.check_no_overlap(out, route.extents, **dict(zip(fam.tensors, (logits, *index))))  # raises
    if check:
        fam.values(logits, index, ints, route.layout)
    if _direct(logits, index, out):
        if out is None:
            out = torch.empty((logits.shape[0], k), dtype=torch.int32, device=logits.device)
        route.writer(logits, *index, k, *ints, route.stable, out)
        return out
    if out is None:
        return route.op(logits, *index, k, *ints, compress_ratio, route.stable)
    route.op(logits, *index, k, *ints, compress_ratio, route.stable, out)
    return out


def _compiled(fam: Family, logits: Tensor, index: tuple, k, ints: tuple, max_seqlen_k, backend,
              out: Optional[Tensor], compress_ratio, stable, check: bool) -> Tensor:
    """One call of family ``fam`` under torch.compile (see the module docstring)."""
    k, compress_ratio = _host_int(k, "k"), _host_int(compress_ratio, "compress_ratio")
    ints = tuple(_host_int(v, n) for (n, _), v in zip(fam.ints, ints))
    if validate.traced_value(stable):
        validate.check_stable(stable)
    _static_checks(_metas(fam, logits, index, out), k, tuple(zip((n for n, _ in fam.ints), ints)), compress_ratio,
                   stable)
    fam.check(logits, *index, k, *ints, compress_ratio)
    if out is not None:
        validate.check_out(out, logits, k)
    if fam.guarded:
        validate.check_max_seqlen_k(max_seqlen_k)
    pol_stable, threshold = _policy_scalars()
    stable = _stable(stable, pol_stable)
    if check:  # in an op of the graph: the checks branch on device values (dsa_ops.ops.checked)
        index = ops.checked(fam.name, logits, index, ints)
    if backend is None and fam.guarded:
        # The host branch (a guard under dynamo): which side of the threshold are we on?
        # An explicit `if` so dynamo guards on the comparison and passes on a constant.
        long = False
        if max_seqlen_k is not None and max_seqlen_k >= threshold:
            long = True
        backend = _policy_backend(fam.name, logits.device.type, k, compress_ratio, None, stable, long)
    if backend is None:  # decode: the generic op, for the pass to retarget
        op = ops.generic_op(fam.name, out=out is not None)
    else:
        op = _backend_op(backend, fam.name, logits, k, compress_ratio, stable, out is not None)
    if out is None:
        return op(logits, *index, k, *ints, compress_ratio, stable)
    op(logits, *index, k, *ints, compress_ratio, stable, out)
    return out


def topk_decode(
    logits: Tensor,
    lengths: Tensor,
    k: int = 2048,
    next_n: int = 1,
    *,
    backend: Optional[str] = None,
    out: Optional[Tensor] = None,
    compress_ratio: int = 1,
    stable: Optional[bool] = None,
    check: bool = False,
) -> Tensor:
    """Per row, the columns of the k best logits among the row's first L_r (contract §1.1).

    Args:
        logits: (R, W) float32, ``stride(1) == 1``, row pitch >= W. Columns at or past a
            row's length may hold anything; they are never ranked.
        lengths: int32, contiguous, one of: (R,) or a 2-D tensor with R elements (per row,
            read flat); (B,) with R = B * next_n (per request: row r has length
            ``lengths[r // next_n] - next_n + 1 + r % next_n``). A (B, 1) tensor with
            next_n > 1 is ambiguous and rejected. Lengths are clamped to [0, W].
        k: slots per row, 1..4096.
        next_n: draft tokens per request (MTP); only the per-request layout uses it.
        backend: a name from :func:`dsa_ops.backends`. None: under ``torch.compile`` emit
            the generic op ``dsa_ops::topk_decode`` for ``passes.IndexerTopKPass`` to
            retarget (its own kernel is the reference); eagerly, call the backend the
            policy (:func:`dsa_ops.policy.current`) picks from host facts.
        out: optional (R, k) int32 contiguous buffer to write; it is returned.
        compress_ratio: the indexer's KV compression ratio (1 for DSA); read by the pass.
        stable: lowest index wins ties and the valid prefix is in ascending index order;
            None takes the policy's ``stable`` flag.
        check: also check device values (lengths within [0, W]); synchronises (so not for a
            captured CUDA graph). Under torch.compile the check is an op of the graph
            (``dsa_ops::check_decode_values``) and raises when the graph runs.

    Returns:
        (R, k) int32. Row r holds min(L_r, k) distinct columns in [0, L_r), then -1 in
        the remaining slots. Unlike ``torch.topk``, not sorted by value: with
        ``stable=False`` the order is unspecified and varies by backend (the CPU
        reference happens to give ascending columns); ``stable=True``: ascending columns.

    Raises:
        ValueError: naming the argument, for any bad dtype, device, rank, stride, size,
            layout, k or out; nothing is written to ``out`` then.

    Example:
        >>> idx = dsa_ops.topk_decode(logits, seq_lens, k=2048)  # doctest: +SKIP
    """
    path = _compiled if torch.compiler.is_compiling() else _eager
    return path(DECODE, logits, (lengths,), k, (next_n,), None, backend, out, compress_ratio, stable, check)


def topk_prefill(
    logits: Tensor,
    row_starts: Tensor,
    row_ends: Tensor,
    k: int = 2048,
    *,
    max_seqlen_k: Optional[int] = None,
    backend: Optional[str] = None,
    out: Optional[Tensor] = None,
    compress_ratio: int = 1,
    stable: Optional[bool] = None,
    check: bool = False,
) -> Tensor:
    """Per row, the k best logits of the window [row_starts[r], row_ends[r]) (contract §1.2).

    Args:
        logits: (R, N) float32, ``stride(1) == 1``, row pitch >= N; N is the chunk's
            gathered K length. Columns outside a row's window may hold anything.
        row_starts, row_ends: (R,) int32, contiguous. Clamped to [0, N]; an empty or
            inverted window gives an all -1 row.
        k: slots per row, 1..4096.
        max_seqlen_k: host int bound on the longest row (vLLM's ``chunk.max_seqlen_k``).
            With ``backend=None`` the policy compares it with its ``prefill_threshold``
            in plain Python: a host branch eagerly, a dynamo guard when compiled (two
            specializations: below / at-or-above; compile with the int dynamic, see
            ``docs/policy.md``). None derives nothing from device data (no sync) and
            takes the below-threshold backend.
        backend: a name from :func:`dsa_ops.backends`; None lets the policy choose.
        out: optional (R, k) int32 contiguous buffer to write; it is returned.
        compress_ratio: the indexer's KV compression ratio (1 for DSA).
        stable: lowest index wins ties and the valid prefix is in ascending order;
            None takes the policy's ``stable`` flag.
        check: also check device values (0 <= start <= end <= N); synchronises. Under
            torch.compile, the op ``dsa_ops::check_prefill_values`` in the graph.

    Returns:
        (R, k) int32 sequence-local indices ``j - row_starts[r]``, min(L_r, k) of them,
        then -1. Not sorted by value (unlike ``torch.topk``): in no defined order with
        ``stable=False``, ascending with ``stable=True``, as for :func:`topk_decode`.
    """
    path = _compiled if torch.compiler.is_compiling() else _eager
    return path(PREFILL, logits, (row_starts, row_ends), k, (), max_seqlen_k, backend, out, compress_ratio, stable,
                check)
