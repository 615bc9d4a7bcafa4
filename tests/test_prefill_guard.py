"""Prefill: the host branch on max_seqlen_k, eager and as a dynamo guard (two graphs)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import dsa_ops
from dsa_ops import api, ops
from dsa_ops import policy as P
from dsa_ops.testing import assert_decode_equivalent, assert_prefill_equivalent
from tests import data
from tests.standins import standin_backend

THRESHOLD = 1000


@pytest.fixture
def routed():
    """A policy whose long side goes to a test-only stand-in for AITER."""
    with standin_backend("standin_aiter_prefill") as long_name:
        pol = P.Policy(decode=(P.Rule("reference"),),
                       prefill=(P.Rule(long_name, "long chunks (AITER stand-in)", long=True),
                                P.Rule("torch_topk", "short chunks")),
                       prefill_threshold=THRESHOLD)
        with P.use(pol):
            yield long_name


class OpRecorder:
    """Collects the prefill ops that appear in each compiled graph."""

    def __init__(self):
        self.graphs: list[set] = []

    def __call__(self, gm, example_inputs):
        self.graphs.append({n.target for n in gm.graph.nodes if n.op == "call_function"})
        return gm.forward


def _expected(name: str):
    return ops.backend_op(name, "prefill")


def test_eager_host_branch(routed, monkeypatch, gen):
    x, s, e = data.prefill_inputs(gen)
    calls = []
    real = ops.backend_op
    monkeypatch.setattr(ops, "backend_op", lambda name, fam, out=False: calls.append(name) or real(name, fam, out))
    cases = ((1, "torch_topk"), (THRESHOLD - 1, "torch_topk"), (THRESHOLD, routed), (10**6, routed),
             (None, "torch_topk"))
    api._ROUTES.clear()
    for m, want in cases:
        calls.clear()
        api._ROUTES.clear()  # each call resolves its route afresh
        out = dsa_ops.topk_prefill(x, s, e, k=64, max_seqlen_k=m)
        assert calls == [want], (m, calls)
        assert_prefill_equivalent(out, x, s, e, 64)
    # Repeat calls take the cached route of their side of the threshold: one route per side.
    for m, want in cases:
        calls.clear()
        out = dsa_ops.topk_prefill(x, s, e, k=64, max_seqlen_k=m)
        assert_prefill_equivalent(out, x, s, e, 64)
    assert sorted(r.backend.name for r in api._ROUTES.values()) == sorted(["torch_topk", routed])


@pytest.mark.parametrize("how", ["dynamic_sources", "dynamic=True"])
def test_compiled_two_specializations(routed, how, gen):
    x, s, e = data.prefill_inputs(gen)
    rec = OpRecorder()
    cnt = CompileCounterWithBackend(rec)

    def prefill(x, s, e, max_seqlen_k):
        return dsa_ops.topk_prefill(x, s, e, k=64, max_seqlen_k=max_seqlen_k)

    torch._dynamo.reset()
    values = [5, 17, THRESHOLD - 1, THRESHOLD, 4096, 2, 70000, 999, 1001, 33]
    if how == "dynamic_sources":
        with torch.compiler.config.patch(dynamic_sources="L['max_seqlen_k']"):
            fn = torch.compile(prefill, fullgraph=True, backend=cnt)
            outs = [(m, fn(x, s, e, m)) for m in values]
    else:
        fn = torch.compile(prefill, fullgraph=True, backend=cnt, dynamic=True)
        outs = [(m, fn(x, s, e, m)) for m in values]
    assert cnt.frame_count == 2
    assert _expected("torch_topk") in rec.graphs[0] and _expected(routed) not in rec.graphs[0]
    assert _expected(routed) in rec.graphs[1] and _expected("torch_topk") not in rec.graphs[1]
    for _, out in outs:
        assert_prefill_equivalent(out, x, s, e, 64)


def test_max_seqlen_k_must_be_host_int(gen):
    x, s, e = data.prefill_inputs(gen)
    with pytest.raises(ValueError, match="max_seqlen_k"):
        dsa_ops.topk_prefill(x, s, e, k=64, max_seqlen_k=torch.tensor(5))


def test_compiled_prefill_width_changes_do_not_recompile(routed, gen):
    """The chunk width N changes every prefill step: still one graph per side."""
    cnt = CompileCounterWithBackend("eager")

    def prefill(x, s, e, max_seqlen_k):
        return dsa_ops.topk_prefill(x, s, e, k=64, max_seqlen_k=max_seqlen_k)

    torch._dynamo.reset()
    fn = torch.compile(prefill, fullgraph=True, backend=cnt, dynamic=True)
    for i, width in enumerate((400, 523, 777, 1200, 401, 950)):
        x, s, e = data.prefill_inputs(gen, width=width)
        m = (THRESHOLD - 1, THRESHOLD + 5)[i % 2]
        assert_prefill_equivalent(fn(x, s, e, m), x, s, e, 64)
    assert cnt.frame_count == 2


def test_policy_file_from_the_env_var_compiles_with_fullgraph(tmp_path, monkeypatch, gen):
    """$DSA_OPS_POLICY names a file whose mtime policy.current() reads (os.stat, which dynamo
    cannot trace): the compiled paths read the policy outside the trace, so fullgraph
    compiles of both entry points work with it set, and the file's threshold is the guard."""
    with standin_backend("standin_aiter_prefill") as long_name:
        pol = P.Policy(decode=(P.Rule("reference"),),
                       prefill=(P.Rule(long_name, "long chunks", long=True), P.Rule("torch_topk", "short chunks")),
                       prefill_threshold=THRESHOLD)
        path = tmp_path / "policy.json"
        P.save(pol, path)
        monkeypatch.setenv(P.ENV_VAR, str(path))
        x, s, e = data.prefill_inputs(gen)
        rec = OpRecorder()
        cnt = CompileCounterWithBackend(rec)
        torch._dynamo.reset()
        prefill = torch.compile(lambda x, s, e, m: dsa_ops.topk_prefill(x, s, e, k=64, max_seqlen_k=m),
                                fullgraph=True, backend=cnt, dynamic=True)
        for m in (5, THRESHOLD, 17, 70000):
            assert_prefill_equivalent(prefill(x, s, e, m), x, s, e, 64)
        assert cnt.frame_count == 2
        assert _expected("torch_topk") in rec.graphs[0] and _expected(long_name) in rec.graphs[1]
        decode = torch.compile(lambda x, lens: dsa_ops.topk_decode(x, lens, k=8), fullgraph=True, backend="eager")
        lens = torch.tensor([0, 3, 8, 100, 400, 399], dtype=torch.int32)
        assert_decode_equivalent(decode(x, lens), x, lens, 8)
