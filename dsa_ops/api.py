"""Public entry points: :func:`topk_decode` and :func:`topk_prefill`.

Three ways through each entry point:

* **Eager** (the common serving case): the host checks, the policy's choice and the backend's
  support check are made once per (shapes, strides, dtypes, devices, k, next_n, stable,
  backend, policy, and the types of the int / bool arguments, so that ``k=8.0`` or
  ``stable=1`` never reuse the route of ``k=8`` or ``stable=True``) and cached as a :class:`_Route`; a repeat call costs a dict lookup, an
  overlap test of ``out`` and the writer. On plain tensors with no torch function / dispatch
  mode and no profiler active, the route calls the backend's writer directly (what the
  backend op's kernel runs), skipping the dispatcher; otherwise it calls the backend op.
* **Compiled** (``torch.compile``): the checks that need no shapes run at trace time with
  constant arguments (a bad argument raises the ValueError at trace time); the fake kernels
  check shapes and strides. Decode emits the generic op for ``passes.IndexerTopKPass``;
  prefill picks its backend with a host branch on ``max_seqlen_k`` (a dynamo guard).
"""

from __future__ import annotations

import operator
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from dsa_ops import ops, validate
from dsa_ops import policy as policy_mod
from dsa_ops.backends import BACKENDS, get
from dsa_ops.backends.base import Backend, Query


def _policy_backend(family: str, device_type: str, k: int, compress_ratio: int, width: Optional[int], stable: bool,
                    long: bool) -> str:
    """The policy's backend name for a call; a host-only decision that dynamo folds to a
    constant (the inputs it depends on are already guarded: shapes, and ``long``)."""
    facts = policy_mod.facts_for(device_type, k, compress_ratio, width, stable)
    return policy_mod.current().choose(family, facts, long if family == "prefill" else None).backend


def _static_checks(family: str, metas: tuple, k, next_n, compress_ratio, stable) -> None:
    validate.check_static(family, metas, k, next_n, compress_ratio, stable)


def _policy_scalars() -> tuple[bool, int]:
    """The current policy's ``stable`` flag and ``prefill_threshold``, for the compiled paths:
    ``policy.current()`` may stat ``$DSA_OPS_POLICY``'s file, which dynamo cannot trace, so
    it runs here, outside the trace, and the two values fold to constants."""
    pol = policy_mod.current()
    return pol.stable, pol.prefill_threshold


# What ``torch.compiler.assume_constant_result`` does, without importing dynamo at import time
# (``import dsa_ops`` stays cheap; tests/test_api_paths.py checks the two stay the same): dynamo
# calls these with constant arguments at trace time and folds the result.
_policy_backend._dynamo_marked_constant = True
_static_checks._dynamo_marked_constant = True
_policy_scalars._dynamo_marked_constant = True


def _meta(t) -> tuple | str:
    """(dtype, device, rank) of a tensor, or its type's name: constants under dynamo."""
    return (t.dtype, t.device, t.dim()) if isinstance(t, Tensor) else type(t).__name__


def _host_int(x, name: str):
    """A plain int argument (k, next_n, compress_ratio) as a constant: under dynamo with
    ``dynamic=True`` an int argument is traced symbolically, and ``operator.index``
    specializes it (a guard), so the policy and the checks see a constant. A float is
    refused here, by name only: after recompiles dynamo traces it as a symbolic float, which
    cannot be put into the message (nor passed to the constant-folded checks)."""
    if isinstance(x, int) and not isinstance(x, bool):
        return operator.index(x)
    if isinstance(x, float):
        validate._fail(f"{name}: expected an int, got a float")
    if validate.traced_value(x):  # a tensor or numpy value: no constant to hand to the folded checks
        validate.not_an_int(name, x)
    return x


def _stable(stable: Optional[bool], default: bool) -> bool:
    """The call's ``stable``, or the policy's flag (``default``) when None."""
    return default if stable is None else stable


def _width(logits: Tensor) -> Optional[int]:
    """The width as a host int, or None under compile: ``int()`` on a symbolic width would
    specialize the graph on it (a prefill chunk's width changes every step)."""
    return None if torch.compiler.is_compiling() else int(logits.shape[1])


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


_check_backend._dynamo_marked_constant = True


def _backend_op(name: str, family: str, logits: Tensor, k: int, compress_ratio: int, stable: bool, out: bool):
    _check_backend(name, family, logits.device.type, k, _width(logits), stable, compress_ratio)
    return ops.backend_op(name, family, out=out)


class _Route(NamedTuple):
    """What an eager call with one set of host facts runs (cached in :data:`_ROUTES`)."""

    policy: policy_mod.Policy
    backend: Backend
    writer: object  # the backend's decode / prefill writer
    op: object  # the backend op (functional or _out form)
    stable: bool
    layout: str  # decode lengths layout ("" for prefill)
    extents: tuple  # byte extents of out and the inputs (the overlap test's per-call work is then 3 pointers)


_ROUTES: dict[tuple, _Route] = {}
_ROUTES_MAX = 4096  # distinct host-fact sets kept; the cache is cleared when full


def _tmeta(t) -> tuple:
    return (t.dtype, t.device, t.shape, t.stride())


def _direct(tensors: tuple) -> bool:
    """Whether an eager call may run the writer itself: plain tensors, no torch function or
    dispatch mode (fake tensors, tracing, vmap) and no profiler (which should see the op)."""
    for t in tensors:
        if type(t) is not Tensor and t is not None:
            return False
    return not (torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled()
                or torch._C._autograd._profiler_enabled())


def _route(family: str, key: tuple, pol, logits: Tensor, k: int, next_n: int, compress_ratio: int,
           stable: Optional[bool], backend: Optional[str], out_given: bool, long: bool, layout: str,
           tensors: tuple) -> _Route:
    stable = _stable(stable, pol.stable)
    if backend is None:
        backend = _policy_backend(family, logits.device.type, k, compress_ratio, int(logits.shape[1]), stable, long)
    op = _backend_op(backend, family, logits, k, compress_ratio, stable, out_given)
    record = get(backend)
    extents = tuple(validate.extent(t) for t in tensors) if tensors[0] is not None else ()
    route = _Route(pol, record, getattr(record, family), op, stable, layout, extents)
    if len(_ROUTES) >= _ROUTES_MAX:
        _ROUTES.clear()
    _ROUTES[key] = route
    return route


def _dispatch(route: _Route, logits: Tensor, index: tuple, k: int, extra: tuple, compress_ratio: int,
              out: Optional[Tensor]) -> Tensor:
    """Run a route: its writer directly (:func:`_direct`), else its op. ``index``: the lengths,
    or the row starts and ends; ``extra``: (next_n,) for decode, () for prefill (the writers'
    and ops' argument orders)."""
    if _direct((logits, *index, out)):
        if out is None:
            out = torch.empty((logits.shape[0], k), dtype=torch.int32, device=logits.device)
        route.writer(logits, *index, k, *extra, route.stable, out)
        return out
    args = (logits, *index, k, *extra, compress_ratio, route.stable)
    if out is None:
        return route.op(*args)
    route.op(*args, out)
    return out


def _cached(key: tuple, pol) -> Optional[_Route]:
    route = _ROUTES.get(key)
    if route is not None and route.policy is pol and BACKENDS.get(route.backend.name) is route.backend:
        return route
    return None


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
        (R, k) int32. Row r holds min(L_r, k) distinct columns in [0, L_r), in no
        particular order unless ``stable``, then -1 in the remaining slots.

    Raises:
        ValueError: naming the argument, for any bad dtype, device, rank, stride, size,
            layout, k or out; nothing is written to ``out`` then.

    Example:
        >>> idx = dsa_ops.topk_decode(logits, seq_lens, k=2048)  # doctest: +SKIP
    """
    if torch.compiler.is_compiling():
        return _compiled_decode(logits, lengths, k, next_n, backend, out, compress_ratio, stable, check)
    pol = policy_mod.current()
    try:
        key = ("decode", logits.dtype, logits.device, logits.shape, logits.stride(), lengths.dtype, lengths.device,
               lengths.shape, lengths.stride(), None if out is None else _tmeta(out), k, next_n, compress_ratio,
               stable, backend, id(pol), k.__class__, next_n.__class__, compress_ratio.__class__, stable.__class__)
        route = _cached(key, pol)
    except (AttributeError, TypeError):  # not tensors, or unhashable arguments: the checks below say what
        key, route = None, None
    if route is None:
        validate.check_static("decode", (("logits", _meta(logits)), ("lengths", _meta(lengths))), k, next_n,
                              compress_ratio, stable)
        layout = validate.check_decode(logits, lengths, k, next_n, compress_ratio)
        if out is not None:
            validate.check_out(out, logits, k)
        route = _route("decode", key, pol, logits, k, next_n, compress_ratio, stable, backend, out is not None,
                       False, layout, (out, logits, lengths))
    if out is not None and validate.first_overlap(out, route.extents, (logits, lengths)) >= 0:
        validate.check_no_overlap(out, route.extents, logits=logits, lengths=lengths)  # raises, naming the input
    if check:
        validate.check_decode_values(logits, lengths, next_n, route.layout)
    return _dispatch(route, logits, (lengths,), k, (next_n,), compress_ratio, out)


def _compiled_decode(logits, lengths, k, next_n, backend, out, compress_ratio, stable, check) -> Tensor:
    k, next_n, compress_ratio = _host_int(k, "k"), _host_int(next_n, "next_n"), _host_int(compress_ratio,
                                                                                        "compress_ratio")
    if validate.traced_value(stable):
        validate.check_stable(stable)
    metas = (("logits", _meta(logits)), ("lengths", _meta(lengths))) + ((("out", _meta(out)),) if out is not None
                                                                        else ())
    _static_checks("decode", metas, k, next_n, compress_ratio, stable)
    validate.check_decode(logits, lengths, k, next_n, compress_ratio)
    if out is not None:
        validate.check_out(out, logits, k)
    stable = _stable(stable, _policy_scalars()[0])
    if check:  # in an op: the check branches on device values (dsa_ops.ops.check_decode_values)
        lengths = ops.check_decode_values(logits, lengths, next_n)
    if backend is None:
        op = ops.generic_op("decode", out=out is not None)
    else:
        op = _backend_op(backend, "decode", logits, k, compress_ratio, stable, out is not None)
    if out is None:
        return op(logits, lengths, k, next_n, compress_ratio, stable)
    op(logits, lengths, k, next_n, compress_ratio, stable, out)
    return out


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
        then -1.
    """
    if torch.compiler.is_compiling():
        return _compiled_prefill(logits, row_starts, row_ends, k, max_seqlen_k, backend, out, compress_ratio, stable,
                                 check)
    validate.check_max_seqlen_k(max_seqlen_k)
    pol = policy_mod.current()
    long = max_seqlen_k is not None and max_seqlen_k >= pol.prefill_threshold
    try:
        key = ("prefill", logits.dtype, logits.device, logits.shape, logits.stride(), row_starts.dtype,
               row_starts.device, row_starts.shape, row_starts.stride(), row_ends.dtype, row_ends.device,
               row_ends.shape, row_ends.stride(), None if out is None else _tmeta(out), k, compress_ratio, stable,
               backend, long, id(pol), k.__class__, compress_ratio.__class__, stable.__class__)
        route = _cached(key, pol)
    except (AttributeError, TypeError):
        key, route = None, None
    if route is None:
        validate.check_static("prefill", (("logits", _meta(logits)), ("row_starts", _meta(row_starts)),
                                          ("row_ends", _meta(row_ends))), k, 1, compress_ratio, stable)
        validate.check_prefill(logits, row_starts, row_ends, k, compress_ratio)
        if out is not None:
            validate.check_out(out, logits, k)
        route = _route("prefill", key, pol, logits, k, 1, compress_ratio, stable, backend, out is not None, long, "",
                       (out, logits, row_starts, row_ends))
    if out is not None and validate.first_overlap(out, route.extents, (logits, row_starts, row_ends)) >= 0:
        validate.check_no_overlap(out, route.extents, logits=logits, row_starts=row_starts, row_ends=row_ends)
    if check:
        validate.check_prefill_values(logits, row_starts, row_ends)
    return _dispatch(route, logits, (row_starts, row_ends), k, (), compress_ratio, out)


def _compiled_prefill(logits, row_starts, row_ends, k, max_seqlen_k, backend, out, compress_ratio, stable,
                      check) -> Tensor:
    k, compress_ratio = _host_int(k, "k"), _host_int(compress_ratio, "compress_ratio")
    if validate.traced_value(stable):
        validate.check_stable(stable)
    metas = (("logits", _meta(logits)), ("row_starts", _meta(row_starts)), ("row_ends", _meta(row_ends)))
    _static_checks("prefill", metas + ((("out", _meta(out)),) if out is not None else ()), k, 1, compress_ratio,
                   stable)
    validate.check_prefill(logits, row_starts, row_ends, k, compress_ratio)
    if out is not None:
        validate.check_out(out, logits, k)
    validate.check_max_seqlen_k(max_seqlen_k)
    pol_stable, threshold = _policy_scalars()
    stable = _stable(stable, pol_stable)
    if check:  # in an op, as for decode
        row_starts, row_ends = ops.check_prefill_values(logits, row_starts, row_ends)
    if backend is None:
        # The host branch (a guard under dynamo): which side of the threshold are we on?
        # An explicit `if` so dynamo guards on the comparison and passes on a constant.
        long = False
        if max_seqlen_k is not None and max_seqlen_k >= threshold:
            long = True
        backend = _policy_backend("prefill", logits.device.type, k, compress_ratio, None, stable, long)
    op = _backend_op(backend, "prefill", logits, k, compress_ratio, stable, out is not None)
    if out is None:
        return op(logits, row_starts, row_ends, k, compress_ratio, stable)
    op(logits, row_starts, row_ends, k, compress_ratio, stable, out)
    return out
