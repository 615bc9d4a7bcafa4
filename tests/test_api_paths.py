"""The public entry points' three paths: the cached eager route, compiled calls (errors at
trace time, traced k, symbolic widths against width bands) and a cheap ``import dsa_ops``."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from torch._inductor import config as inductor_config

import dsa_ops
import passes
from dsa_ops import api, validate
from dsa_ops import policy as P
from dsa_ops.backends import register
from dsa_ops.backends.base import YES, Backend
from dsa_ops.testing import assert_decode_equivalent, assert_prefill_equivalent
from tests import data


def test_marked_constant_matches_torch():
    """api and validate mark functions the way torch.compiler.assume_constant_result does
    (without importing dynamo); if torch changes how it marks them, this fails."""
    def probe():
        return 0

    marked = torch.compiler.assume_constant_result(probe)
    attrs = {a for a in vars(marked)}
    assert attrs == {"_dynamo_marked_constant"}
    for fn in (api._policy_backend, api._static_checks, api._policy_scalars, api._check_backend, validate._fail):
        assert getattr(fn, "_dynamo_marked_constant") is True


def test_import_does_not_load_dynamo_or_sympy():
    """Issue #24 item 13: the vLLM plugin imports dsa_ops in every process; it must not pull in
    torch._dynamo (~0.6 s) or sympy (~0.3 s)."""
    code = ("import sys, dsa_ops; bad = [m for m in ('torch._dynamo', 'sympy') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.fixture
def counting_backend():
    """A test-only backend that runs the reference and counts writer calls."""
    from dsa_ops.backends import reference

    calls = []

    def dec(*a):
        calls.append("decode")
        reference.decode(*a)

    def pre(*a):
        calls.append("prefill")
        reference.prefill(*a)

    name = "counting_ref"
    if name not in dsa_ops.backends(include_test_only=True):
        register(Backend(name, decode=dec, prefill=pre, available=lambda: YES, supports=lambda q: YES,
                         version=lambda: "0", test_only=True))
    rec = dsa_ops.backends(include_test_only=True)[name]
    rec._cache["calls"] = calls
    calls.clear()
    return name, calls


def test_eager_route_is_cached_and_calls_the_writer(counting_backend, monkeypatch):
    """The second call with the same host facts resolves nothing (no policy, no backend op
    lookup) and runs the writer directly; new shapes resolve a new route."""
    name, calls = counting_backend
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 300, generator=g)
    lt = data.i32([0, 100, 300])
    pol = P.Policy(decode=(P.Rule(name),), prefill=(P.Rule(name),))
    looked_up = []
    real = dsa_ops.ops.backend_op
    monkeypatch.setattr(dsa_ops.ops, "backend_op", lambda n, f, out=False: looked_up.append(n) or real(n, f, out))
    with P.use(pol):
        for _ in range(3):
            assert_decode_equivalent(dsa_ops.topk_decode(x, lt, k=16), x, lt, 16)
        s = data.i32([0, 5, 20])
        for _ in range(2):
            assert_prefill_equivalent(dsa_ops.topk_prefill(x, s, lt, k=16), x, s, lt, 16)
        dsa_ops.topk_decode(x[:2], lt[:2], k=16)
    assert calls == ["decode"] * 3 + ["prefill"] * 2 + ["decode"]
    assert looked_up == [name, name, name]  # one route per (family, shapes)


@pytest.mark.parametrize("family", ["decode", "prefill"])
@pytest.mark.parametrize("arg, good, bad", [("k", 8, 8.0), ("k", 1, True), ("stable", True, 1), ("stable", False, 0),
                                            ("next_n", 1, 1.0), ("next_n", 1, True), ("compress_ratio", 1, 1.0),
                                            ("compress_ratio", 1, True)])
def test_a_cached_route_never_admits_an_argument_it_would_reject(family, arg, good, bad):
    """A bad argument equal (==) to a good one (8.0 == 8, True == 1) raises the same
    ValueError whether or not a call with the good value cached its route first; out stays
    untouched."""
    if family == "prefill" and arg == "next_n":
        pytest.skip("prefill has no next_n")
    x, lt = torch.randn(2, 64), data.i32([10, 64])
    s = data.i32([0, 5])

    def call(**kw):
        if family == "decode":
            return dsa_ops.topk_decode(x, lt, backend="reference", **kw)
        return dsa_ops.topk_prefill(x, s, lt, backend="reference", **kw)

    base = {"k": 8}
    width = good if arg == "k" else 8
    api._ROUTES.clear()
    for warm in (False, True):
        for given in (False, True):
            if warm:  # the good value's route, with and without out, is cached
                call(**{**base, arg: good}, out=torch.empty((2, width), dtype=torch.int32) if given else None)
            out = torch.full((2, width), 7, dtype=torch.int32) if given else None
            with pytest.raises(ValueError, match=f"^{arg}:"):
                call(**{**base, arg: bad}, out=out)
            assert out is None or bool((out == 7).all())


def test_eager_route_goes_through_the_op_under_a_mode(counting_backend):
    """With a dispatch mode active (here FakeTensorMode via from_tensor) the op runs, so the
    mode sees it: the direct path is only for plain tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    name, calls = counting_backend
    x, lt = torch.randn(2, 50), data.i32([10, 50])
    with FakeTensorMode() as mode:
        fx_, fl = mode.from_tensor(x), mode.from_tensor(lt)
        out = dsa_ops.topk_decode(fx_, fl, k=8, backend=name)
    assert tuple(out.shape) == (2, 8) and calls == []  # the fake kernel ran, not the writer


@pytest.mark.parametrize("fullgraph", [True, False])
@pytest.mark.parametrize("bad, arg", [("dtype", "logits"), ("k", "k"), ("stable", "stable"), ("lengths", "lengths")])
def test_bad_input_under_compile_raises_the_value_error(fresh_dynamo, fullgraph, bad, arg):
    """Issue #24 item 2: under torch.compile(fullgraph=True) a bad argument raises the
    ValueError naming it (not dynamo's 'Observed exception'), as it does without fullgraph."""
    x, lt = torch.randn(4, 100), data.i32([5, 50, 100, 0])
    kw = {"k": 8, "stable": None}
    if bad == "dtype":
        x = x.double()
    elif bad == "k":
        kw["k"] = 0
    elif bad == "stable":
        kw["stable"] = "no"
    else:
        lt = lt[:3]
    f = torch.compile(lambda x, lt: dsa_ops.topk_decode(x, lt, **kw), fullgraph=fullgraph, backend="eager")
    with pytest.raises(ValueError, match=f"^{arg}:"):
        f(x, lt)


def test_compiled_prefill_with_a_traced_k(fresh_dynamo):
    """Issue #25 item 3: with dynamic=True an int argument k is traced symbolically; the policy
    still sees a constant (k is specialized, one graph per k)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 120, generator=g)
    s, e = data.i32([0, 3, 10, 50, 0]), data.i32([100, 40, 110, 50, 7])
    f = torch.compile(lambda x, s, e, k: dsa_ops.topk_prefill(x, s, e, k=k, max_seqlen_k=100), fullgraph=True,
                      dynamic=True)
    for k in (8, 8, 16):
        assert_prefill_equivalent(f(x, s, e, k), x, s, e, k)
    fd = torch.compile(lambda x, lt, k, n: dsa_ops.topk_decode(x, lt, k=k, next_n=n), fullgraph=True,
                       dynamic=True)
    lt = data.i32([100, 3, 0, 120, 60])
    assert_decode_equivalent(fd(x, lt, 8, 1), x, lt, 8)


def _compiled_decode_backend(mark) -> tuple[str, tuple]:
    pol = P.Policy(decode=(P.Rule("torch_topk", "band", max_width=1 << 20),
                           P.Rule("reference", "fallback")), prefill=(P.Rule("reference"),))
    x, lt = torch.randn(3, 256), data.i32([0, 100, 256])
    if mark:
        torch._dynamo.mark_dynamic(x, 1, min=64, max=200_000)
    with passes.install(pol) as pass_, inductor_config.patch(fx_graph_cache=False), P.use(pol):
        f = torch.compile(lambda x, lt: dsa_ops.topk_decode(x, lt, k=16), fullgraph=True, dynamic=True)
        assert_decode_equivalent(f(x, lt), x, lt, 16)
    assert pass_.count == 1
    return pass_.rewrites[0].backend, pass_.rewrites[0].reason


def test_width_band_against_a_symbolic_width(fresh_dynamo):
    """Issue #25 item 4: under dynamic=True the pass sees a symbolic width. A band applies when
    the width's whole range lies in it: unbounded -> the band rule is skipped (with a reason);
    mark_dynamic(min=64, max=200000) -> inside [0, 2^20) -> the band's backend."""
    backend, _ = _compiled_decode_backend(mark=False)
    assert backend == "reference"
    torch._dynamo.reset()
    backend, _ = _compiled_decode_backend(mark=True)
    assert backend == "torch_topk"


def test_band_holds_for_symbolic_ranges():
    f = P.facts_for("cpu", 2048)
    band = P.Rule("x", min_width=1000, max_width=5000)
    assert band.band_holds(P.dataclasses.replace(f, width=1000)) and not band.band_holds(
        P.dataclasses.replace(f, width=5000))
    assert band.band_holds(P.dataclasses.replace(f, width_bounds=(1000, 4999)))
    assert not band.band_holds(P.dataclasses.replace(f, width_bounds=(999, 4999)))
    assert not band.band_holds(P.dataclasses.replace(f, width_bounds=(1000, None)))
    assert P.Rule("x", min_width=1000).band_holds(P.dataclasses.replace(f, width_bounds=(1000, None)))
    choice = P.Policy(decode=(band, P.Rule("reference")), prefill=()).choose("decode", f)
    assert choice.backend == "reference" and "symbolic" in choice.skipped[0]


def test_compiled_bad_values_that_dynamo_traces_symbolically(fresh_dynamo):
    """After recompiles dynamo traces a changing float k, and a max_seqlen_k marked dynamic,
    symbolically: the ValueError still names the argument (not dynamo's 'assume_constant_result
    argument conversion failed' or 'BUILD_STRING type error')."""
    x, lt = torch.randn(4, 64), data.i32([5, 50, 64, 0])
    f = torch.compile(lambda x, lt, k: dsa_ops.topk_decode(x, lt, k=k), fullgraph=True, backend="eager")
    for k in (0, 5000, 2.0, 3.5):
        with pytest.raises(ValueError, match="^k: expected"):
            f(x, lt, k)
    assert tuple(f(x, lt, 8).shape) == (4, 8)
    s, e = data.i32([0, 0, 3, 9]), data.i32([64, 10, 3, 40])
    with torch.compiler.config.patch(dynamic_sources="L['m']"):
        g = torch.compile(lambda x, s, e, m: dsa_ops.topk_prefill(x, s, e, k=8, max_seqlen_k=m), fullgraph=True,
                          backend="eager")
        assert_prefill_equivalent(g(x, s, e, 64), x, s, e, 8)
        with pytest.raises(ValueError, match="^max_seqlen_k: expected a host int >= 0 or None"):
            g(x, s, e, -3)


def _host_arg_call(family: str, arg: str, bad, inside: bool):
    """A call of ``family`` with ``arg`` bad, as (fn, args): the bad value a closure constant
    (``inside``: computed in the function, e.g. ``row_ends.max()``) or a function argument."""
    x, lt = torch.randn(4, 64), data.i32([5, 50, 64, 0])
    s = data.i32([0, 0, 3, 9])
    kw = {"k": 8}

    def call(x, lt, v):
        if arg == "max_seqlen_k" and isinstance(v, str):  # "max": the likely mistake, lengths.max()
            v = lt.max()
        if family == "decode":
            return dsa_ops.topk_decode(x, lt, **{**kw, arg: v})
        return dsa_ops.topk_prefill(x, s, lt, **{**kw, arg: v})

    if inside:
        return (lambda x, lt: call(x, lt, bad)), (x, lt)
    return call, (x, lt, bad)


def _message(fn, args) -> str:
    with pytest.raises(ValueError) as info:
        fn(*args)
    return str(info.value)


HOST_ARGS = [("prefill", "max_seqlen_k", "max"), ("prefill", "max_seqlen_k", torch.tensor(64)),
             ("prefill", "max_seqlen_k", np.int64(64)), ("prefill", "max_seqlen_k", np.int32(0)),
             ("decode", "backend", "nosuch"), ("decode", "backend", 123), ("prefill", "backend", "nosuch"),
             ("prefill", "backend", 123), ("decode", "k", np.int64(8)), ("prefill", "k", np.int64(8)),
             ("decode", "k", torch.tensor(8)), ("decode", "next_n", np.int64(1)),
             ("decode", "compress_ratio", np.int64(1)), ("prefill", "compress_ratio", np.int32(1))]


@pytest.mark.parametrize("inside", [True, False], ids=["constant", "argument"])
@pytest.mark.parametrize("family, arg, bad", HOST_ARGS, ids=lambda v: repr(v) if not isinstance(v, str) else v)
def test_compiled_host_argument_errors_match_eager(fresh_dynamo, family, arg, bad, inside):
    """Issue #44 items 3, 4, 6: a tensor or numpy max_seqlen_k (``lengths.max()`` without
    int()), an unknown backend name and a numpy k / next_n / compress_ratio raise, under
    torch.compile(fullgraph=True), the ValueError that eager raises, with the same message
    (not dynamo's 'repr() on tensor' / 'Observed exception', nor 'got tensor(64)')."""
    if not inside and arg == "max_seqlen_k" and isinstance(bad, str):
        pytest.skip("lengths.max() is computed inside the function")
    fn, args = _host_arg_call(family, arg, bad, inside)
    want = _message(fn, args)
    assert want.startswith(f"{arg}:"), want
    got = _message(torch.compile(fn, fullgraph=True, backend="eager"), args)
    assert got.split("\n\nfrom user code:")[0] == want  # dynamo appends where in the user's code
