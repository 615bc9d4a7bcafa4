"""The decode pass: graph snapshots before/after, uuid, composition, the FX entry point."""

from __future__ import annotations

import pytest
import torch
from torch._inductor import config as inductor_config

import dsa_ops
import passes
from dsa_ops import ops
from dsa_ops import policy as P
from dsa_ops.testing import assert_decode_equivalent
from dsa_ops.validate import ArgumentError
from tests import data
from tests.standins import standin_backend

GENERIC = ops.generic_op("decode")
GENERIC_OUT = ops.generic_op("decode", out=True)


def _policy_to(name: str) -> P.Policy:
    return P.Policy(decode=(P.Rule(name, f"route to {name}"),), prefill=(P.Rule("reference"),))


class Snapshot(torch._inductor.custom_graph_pass.CustomGraphPass):
    """Records the post-grad graph's call targets (and any auto_functionalized op)."""

    def __init__(self) -> None:
        self.targets: list = []

    def __call__(self, graph: torch.fx.Graph) -> None:
        for n in graph.nodes:
            if n.op == "call_function":
                self.targets.append(n.target)
                if n.args and isinstance(n.args[0], torch._ops.OpOverload):
                    self.targets.append(n.args[0])

    def uuid(self) -> str:
        return "snapshot"


def _compile_with(fn, pol, *args, before: Snapshot | None = None, after: Snapshot | None = None):
    pass_ = passes.IndexerTopKPass(pol)
    chain = [p for p in (before, pass_, after) if p is not None]
    with inductor_config.patch(post_grad_custom_post_pass=passes.ComposedPass(chain), fx_graph_cache=False):
        torch._dynamo.reset()
        out = torch.compile(fn, fullgraph=True)(*args)
    return pass_, out


@pytest.mark.parametrize("layers", [1, 3])
def test_inductor_snapshot_functional(layers, gen):
    backend = "torch_topk"
    x, lengths = data.decode_inputs(gen)

    def step(x, lengths):
        return torch.stack([dsa_ops.topk_decode(x * (i + 1), lengths, k=64) for i in range(layers)])

    before, after = Snapshot(), Snapshot()
    pass_, out = _compile_with(step, _policy_to(backend), x, lengths, before=before, after=after)
    assert before.targets.count(GENERIC) == layers
    assert GENERIC not in after.targets
    assert after.targets.count(ops.backend_op(backend, "decode")) == layers
    assert pass_.count == layers and all(r.backend == backend for r in pass_.rewrites)
    for i in range(layers):
        assert_decode_equivalent(out[i], x * (i + 1), lengths, 64)


def test_inductor_snapshot_out_form_auto_functionalized(gen):
    x, lengths = data.decode_inputs(gen)

    def step(x, lengths, buf):
        dsa_ops.topk_decode(x, lengths, k=64, out=buf)
        return buf + 0

    buf = torch.full((4, 64), 123, dtype=torch.int32)
    before, after = Snapshot(), Snapshot()
    pass_, out = _compile_with(step, _policy_to("torch_topk"), x, lengths, buf, before=before, after=after)
    assert GENERIC_OUT in before.targets
    assert GENERIC_OUT not in after.targets
    assert ops.backend_op("torch_topk", "decode", out=True) in after.targets
    assert pass_.rewrites[0].form == "out"
    assert_decode_equivalent(out, x, lengths, 64)
    assert_decode_equivalent(buf, x, lengths, 64)  # the caller's buffer was written


def test_rewrite_topk_fx_entry_point(gen):
    x, lengths = data.decode_inputs(gen)
    gm = torch.fx.symbolic_trace(lambda x, l: GENERIC(x, l, 32))
    assert data.call_targets(gm.graph).count(GENERIC) == 1
    assert passes.rewrite_topk(gm, _policy_to("torch_topk")) == 1
    assert data.call_targets(gm.graph) == [ops.backend_op("torch_topk", "decode")]
    assert_decode_equivalent(gm(x, lengths), x, lengths, 32)


def test_aot_eager_backend_with_rewrite(gen):
    """A custom backend (not Inductor) can call the FX entry point itself."""
    from torch._dynamo.backends.common import aot_autograd

    seen = []

    def fw(gm, example_inputs):
        seen.append(passes.rewrite_topk(gm, _policy_to("torch_topk")))
        return gm

    x, lengths = data.decode_inputs(gen)
    out = torch.compile(lambda x, l: dsa_ops.topk_decode(x, l, k=32), backend=aot_autograd(fw_compiler=fw),
                        fullgraph=True)(x, lengths)
    assert seen == [1]
    assert_decode_equivalent(out, x, lengths, 32)


def test_standin_aiter_routing_under_rocm_like_policy(gen):
    """Test-only stand-in for AITER (aiter cannot run here): the first rule names it."""
    with standin_backend("standin_aiter") as name:
        pol = P.Policy(decode=(P.Rule(name, "gfx950 gate stand-in", k=64, compress_ratio=1),
                               P.Rule("reference", "other k")), prefill=(P.Rule("reference"),))
        x, lengths = data.decode_inputs(gen)
        gm = torch.fx.symbolic_trace(lambda x, l: (GENERIC(x, l, 64), GENERIC(x, l, 32)))
        pass_ = passes.IndexerTopKPass(pol)
        pass_(gm.graph)
        assert [r.backend for r in pass_.rewrites] == [name, "reference"]
        assert "gfx950 gate stand-in" in pass_.rewrites[0].reason


def test_unavailable_backend_is_skipped_with_reason():
    with standin_backend("standin_gone", available=False) as name:
        pol = P.Policy(decode=(P.Rule(name, "preferred"), P.Rule("reference", "fallback")),
                       prefill=(P.Rule("reference"),))
        choice = pol.choose("decode", P.facts_for("cpu", 2048, 1, 1000))
        assert choice.backend == "reference"
        assert any(name in s and "not available" in s for s in choice.skipped)


def test_uuid_tracks_policy():
    a = passes.IndexerTopKPass(_policy_to("torch_topk"))
    b = passes.IndexerTopKPass(_policy_to("torch_topk"))
    c = passes.IndexerTopKPass(_policy_to("reference"))
    assert a.uuid() == b.uuid()
    assert a.uuid() != c.uuid()
    d = passes.IndexerTopKPass(P.Policy(decode=a.policy.decode, prefill=a.policy.prefill, prefill_threshold=7))
    assert d.uuid() != a.uuid()
    # Name and provenance do not route, so they do not change the key.
    e = passes.IndexerTopKPass(P.Policy(decode=a.policy.decode, prefill=a.policy.prefill, name="other"))
    assert e.uuid() == a.uuid()


def test_existing_post_grad_pass_still_runs(gen):
    ran = []

    class Theirs(torch._inductor.custom_graph_pass.CustomGraphPass):
        def __call__(self, graph):
            ran.append(len(graph.nodes))

        def uuid(self):
            return "theirs"

    x, lengths = data.decode_inputs(gen)
    with inductor_config.patch(post_grad_custom_post_pass=Theirs(), fx_graph_cache=False):
        with passes.install(_policy_to("torch_topk")) as ours:
            torch._dynamo.reset()
            torch.compile(lambda x, l: dsa_ops.topk_decode(x, l, k=32), fullgraph=True)(x, lengths)
        assert isinstance(inductor_config.post_grad_custom_post_pass, Theirs)  # restored on exit
    assert ran and ours.count == 1


def test_compose_uuid_and_plain_callables():
    ours = passes.IndexerTopKPass(_policy_to("torch_topk"))
    assert passes.compose(None, ours) is ours
    composed = passes.compose([Snapshot()], ours)
    assert composed.uuid() is not None and len(composed.passes) == 2
    # A plain callable cannot vouch for its own cache key: caching is disabled.
    assert passes.compose(lambda g: None, ours).uuid() is None


def test_inductor_options_compose_with_existing():
    opts = passes.inductor_options(_policy_to("torch_topk"), existing=Snapshot())
    p = opts["post_grad_custom_post_pass"]
    assert isinstance(p, passes.ComposedPass) and isinstance(p.passes[-1], passes.IndexerTopKPass)


def test_no_global_write_at_import():
    import importlib

    before = inductor_config.post_grad_custom_post_pass
    importlib.reload(passes)
    assert inductor_config.post_grad_custom_post_pass is before


def test_recompile_after_scoped_install_warns(gen):
    """Item 3 of issue #24: a graph compiled inside ``with passes.install():`` keeps its
    rewrite, but a recompile after the block (a new shape) compiles without the pass. That
    graph still computes the right answer (the generic op's kernel is the reference), and
    it says so, naming the persistent form, on the CPU too."""
    ops._warn_generic_after_scope.cache_clear()

    def step(x, l):
        return dsa_ops.topk_decode(x, l, k=32)

    x, lengths = data.decode_inputs(gen)
    with inductor_config.patch(fx_graph_cache=False):
        torch._dynamo.reset()
        with passes.install(_policy_to("torch_topk")) as ours:
            compiled = torch.compile(step, fullgraph=True)
            assert_decode_equivalent(compiled(x, lengths), x, lengths, 32)
        assert ours.count == 1
        x2, lengths2 = data.decode_inputs(gen, rows=7, width=500)
        with pytest.warns(UserWarning, match=r"passes\.install\(\).*inductor_options"):
            out = compiled(x2, lengths2)  # recompiled outside the block
    assert ours.count == 1  # the pass did not see the recompile
    assert_decode_equivalent(out, x2, lengths2, 32)


def test_persistent_form_survives_recompiles(gen):
    """``options=passes.inductor_options(...)`` travels with the compiled function: a
    recompile on a new shape runs the pass again and nothing warns."""
    import warnings

    ops._warn_generic_after_scope.cache_clear()
    pass_ = passes.IndexerTopKPass(_policy_to("torch_topk"))

    def step(x, l):
        return dsa_ops.topk_decode(x, l, k=32)

    with inductor_config.patch(fx_graph_cache=False):
        torch._dynamo.reset()
        compiled = torch.compile(step, fullgraph=True, options=passes.inductor_options(pass_=pass_))
        for rows, width in ((4, 300), (7, 500)):
            x, lengths = data.decode_inputs(gen, rows, width)
            with warnings.catch_warnings():
                warnings.simplefilter("error", UserWarning)
                assert_decode_equivalent(compiled(x, lengths), x, lengths, 32)
    assert pass_.count == 2 and all(r.backend == "torch_topk" for r in pass_.rewrites)


# --- the policy argument: checked where it is passed, the same in every entry point -----

def _entry_points():
    """Each public way to hand the pass a policy, as ``policy -> pass``."""
    import contextlib

    def scoped(policy):
        with contextlib.ExitStack() as stack:
            return stack.enter_context(passes.install(policy))

    return [
        pytest.param(passes.IndexerTopKPass, id="IndexerTopKPass"),
        pytest.param(lambda p: passes.inductor_options(p)["post_grad_custom_post_pass"], id="inductor_options"),
        pytest.param(scoped, id="install"),
    ]


@pytest.mark.parametrize("make", _entry_points())
def test_policy_path_is_read_at_once(make, tmp_path):
    """A path (str or os.PathLike) is read where it is passed, as ``policy.use`` does."""
    path = tmp_path / "p.json"
    P.save(_policy_to("torch_topk"), path)
    for arg in (path, str(path)):
        assert make(arg).policy == P.load(path)


@pytest.mark.parametrize("make", _entry_points())
def test_missing_policy_file_is_refused_at_once(make, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "missing.json"
    with pytest.raises(ValueError, match=r"^policy: policy file '.*missing\.json' does not exist"):
        make(str(missing))
    with pytest.raises(ValueError, match=r"^policy: policy file 'missing\.json' does not exist \(relative to"):
        make("missing.json")
    with pytest.raises(ValueError, match=r"^policy: policy file .* is a directory"):
        make(tmp_path)


@pytest.mark.parametrize("make", _entry_points())
@pytest.mark.parametrize("bad", [12345, b"p.json", {"decode": []}, P.DEFAULT.decode])
def test_policy_of_another_type_is_refused_at_once(make, bad):
    with pytest.raises(ArgumentError, match=r"^policy: expected a dsa_ops\.policy\.Policy, a path to a policy JSON file "
                                          r"\(str or os\.PathLike\) or None, got "):
        make(bad)


def test_rewrite_topk_takes_a_policy_path(tmp_path, gen):
    path = tmp_path / "p.json"
    P.save(_policy_to("torch_topk"), path)
    x, lengths = data.decode_inputs(gen)
    gm = torch.fx.symbolic_trace(lambda x, l: GENERIC(x, l, 32))
    assert passes.rewrite_topk(gm, path) == 1
    assert_decode_equivalent(gm(x, lengths), x, lengths, 32)
    with pytest.raises(ValueError, match=r"^policy: expected"):
        passes.rewrite_topk(gm, 12345)
