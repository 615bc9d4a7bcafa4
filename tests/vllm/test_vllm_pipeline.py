"""``passes.vllm`` against the real vLLM 0.33.0 (run by ``.ci/vllm-tests``; vLLM pins its
own torch, so it lives in a separate venv). Everything runs on CPU: a real ``VllmConfig``,
vLLM's own ``VllmBackend`` / ``PostGradPassManager``, and Inductor's CPU codegen.
"""

from __future__ import annotations

import copy
import pickle
import sys
import types

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here (.ci/vllm-tests runs these in its own venv)")

from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402
from vllm.compilation.backends import VllmBackend  # noqa: E402
from vllm.compilation.passes.inductor_pass import CallableInductorPass, InductorPass, pass_context  # noqa: E402
from vllm.compilation.passes.pass_manager import PostGradPassManager  # noqa: E402
from vllm.config import (  # noqa: E402
    CompilationConfig, CompilationMode, DeviceConfig, VllmConfig, set_current_vllm_config,
)
from vllm.config.utils import Range  # noqa: E402

import dsa_ops  # noqa: E402
from dsa_ops import ops  # noqa: E402
from dsa_ops import policy as P  # noqa: E402
from dsa_ops.backends import reference  # noqa: E402
from dsa_ops.testing import assert_decode_equivalent  # noqa: E402
from passes._vllm_inductor import VllmComposedPass  # noqa: E402
from passes.vllm import PASS_KEY, add_to_compilation_config  # noqa: E402
from tests import data  # noqa: E402

GENERIC = ops.generic_op("decode")
# Two policies that route CPU decode differently; both backends run here.
TO_TORCH_TOPK = P.Policy(decode=(P.Rule("torch_topk", "test: cpu -> torch_topk", platform="cpu"),
                                 P.Rule("reference")), prefill=P.DEFAULT.prefill, name="to-torch-topk")
TO_REFERENCE = P.Policy(decode=(P.Rule("reference", "test: cpu -> reference", platform="cpu"),),
                        prefill=P.DEFAULT.prefill, name="to-reference")


def _vllm_config(cc: CompilationConfig) -> VllmConfig:
    return VllmConfig(compilation_config=cc, device_config=DeviceConfig(device="cpu"))


def test_helper_output_is_accepted_by_compilation_and_vllm_config():
    cc = add_to_compilation_config(CompilationConfig(mode=CompilationMode.VLLM_COMPILE), TO_TORCH_TOPK)
    vc = _vllm_config(cc)
    ours = vc.compilation_config.inductor_compile_config[PASS_KEY]
    assert isinstance(ours, InductorPass) and isinstance(ours, VllmComposedPass)
    assert ours.topk_pass is not None and ours.topk_pass.policy is TO_TORCH_TOPK
    plain = _vllm_config(CompilationConfig(mode=CompilationMode.VLLM_COMPILE))
    assert vc.compute_hash() != plain.compute_hash()  # vLLM's compile-cache key sees the pass
    # Spawned engine-core / worker processes receive the config pickled.
    back = pickle.loads(pickle.dumps(vc.compilation_config))
    assert back.inductor_compile_config[PASS_KEY].uuid() == ours.uuid()


def test_helper_dict_form_and_no_mutation():
    given = {"mode": 3, "inductor_compile_config": {"max_autotune": False}}
    before = copy.deepcopy(given)
    d = add_to_compilation_config(given)
    assert given == before and isinstance(d, dict)
    cc = CompilationConfig(**d)
    assert cc.inductor_compile_config["max_autotune"] is False
    assert isinstance(cc.inductor_compile_config[PASS_KEY], VllmComposedPass)
    src = CompilationConfig()
    out = add_to_compilation_config(src)
    assert out is not src and PASS_KEY not in src.inductor_compile_config


def test_helper_composes_with_an_existing_pass_and_replaces_its_own():
    seen = []
    user = CallableInductorPass(lambda g: seen.append("user"), uuid="user-pass-v1")
    cc = CompilationConfig(inductor_compile_config={PASS_KEY: user})
    once = add_to_compilation_config(cc, TO_TORCH_TOPK)
    twice = add_to_compilation_config(once, TO_REFERENCE)
    comp = twice.inductor_compile_config[PASS_KEY]
    assert len(comp.members) == 2 and comp.members[0].uuid() == "user-pass-v1"
    assert comp.topk_pass.policy is TO_REFERENCE
    comp(torch.fx.Graph())
    assert seen == ["user"]
    other = add_to_compilation_config(
        CompilationConfig(inductor_compile_config={PASS_KEY: CallableInductorPass(lambda g: None, uuid="user-pass-v2")}),
        TO_REFERENCE)
    assert other.inductor_compile_config[PASS_KEY].uuid() != comp.uuid()  # covers the user's pass too


def test_helper_composes_with_inductor_passes_entry(monkeypatch):
    """A pass named through ``inductor_passes`` is resolved by vLLM before we see it.

    vLLM takes only a string there and resolves ``"<module>.<name>"`` with
    ``__import__(module).__dict__[name]`` (``config/compilation.py:947-962``), which for a
    dotted module returns the top-level package: so the name must live in a top-level module.
    """
    def user_pass(graph: torch.fx.Graph) -> None:
        pass

    mod = types.ModuleType("dsa_ops_test_user_passes")
    mod.user_pass = user_pass
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    cc = CompilationConfig(inductor_passes={PASS_KEY: "dsa_ops_test_user_passes.user_pass"})
    out = add_to_compilation_config(cc)
    comp = out.inductor_compile_config[PASS_KEY]
    assert isinstance(comp.members[0], CallableInductorPass) and comp.members[0].callable is user_pass
    assert PASS_KEY not in out.inductor_passes  # a re-validation cannot undo the composition
    with pytest.raises(ValueError, match="inductor_passes"):
        add_to_compilation_config({"inductor_passes": {PASS_KEY: "x.y"}})


def test_helper_rejects_other_types():
    with pytest.raises(ValueError, match="config"):
        add_to_compilation_config(object())
    with pytest.raises(ValueError, match="inductor_compile_config"):
        add_to_compilation_config({"inductor_compile_config": [1]})


def _manager(vc: VllmConfig) -> PostGradPassManager:
    """The manager exactly as vLLM's backend builds it from ``vc``."""
    backend = VllmBackend(vc)
    backend.configure_post_pass()
    pm = backend.inductor_config[PASS_KEY]
    assert isinstance(pm, PostGradPassManager)
    return pm


def test_post_grad_manager_runs_our_pass_on_a_captured_graph(vllm_c_placeholders, gen):
    cc = add_to_compilation_config(CompilationConfig(mode=CompilationMode.VLLM_COMPILE), TO_TORCH_TOPK)
    vc = _vllm_config(cc)
    pm = _manager(vc)
    ours = cc.inductor_compile_config[PASS_KEY]
    assert any(p is ours for p in pm.passes)

    def step(logits, lengths):  # the generic op, as a compiled model's graph holds it
        return GENERIC(logits, lengths, 64) + 0

    logits, lengths = data.decode_inputs(gen, 5, 300, "ties", lengths=[0, 7, 64, 300, 350])
    gm = make_fx(step, tracing_mode="fake")(logits, lengths)
    assert data.call_targets(gm.graph).count(GENERIC) == 1
    with pass_context(Range(1, 8)), set_current_vllm_config(vc):
        pm(gm.graph)
    gm.recompile()
    after = data.call_targets(gm.graph)
    assert GENERIC not in after and after.count(ops.backend_op("torch_topk", "decode")) == 1
    assert [r.backend for r in ours.topk_pass.rewrites] == ["torch_topk"]
    assert_decode_equivalent(gm(logits, lengths).to(torch.int32), logits, lengths, 64)


def test_manager_uuid_follows_our_policy(vllm_c_placeholders):
    def uuid_for(policy: P.Policy) -> tuple[str, str]:
        vc = _vllm_config(add_to_compilation_config(CompilationConfig(mode=CompilationMode.VLLM_COMPILE), policy))
        with pass_context(Range(1, 8)):
            return _manager(vc).uuid(), vc.compute_hash()

    a, a_hash = uuid_for(TO_TORCH_TOPK)
    b, b_hash = uuid_for(TO_REFERENCE)
    assert a != b and a_hash != b_hash
    assert uuid_for(TO_TORCH_TOPK) == (a, a_hash)  # an unchanged policy keeps both


@pytest.mark.parametrize("form", ["functional", "out"])
def test_vllm_backend_compiles_with_the_backend_op(vllm_c_placeholders, vllm_cache, form, gen):
    """End to end: torch.compile with vLLM's own backend (dynamo -> split -> Inductor ->
    vLLM's PostGradPassManager -> our pass), under two policies and one cache root.

    The third compile repeats the first policy: same uuid, so vLLM's / Inductor's caches
    serve it and no rewrite runs, and its output must be the first one's (torch_topk orders
    by value; the reference by index). The second has another uuid, so nothing compiled
    under the first may be reused: its pass must run and pick the reference.
    """
    logits, lengths = data.decode_inputs(gen, 5, 300, "ties", lengths=[0, 7, 64, 300, 350])
    want = torch.empty(logits.shape[0], 64, dtype=torch.int32)
    reference.decode(logits, lengths, 64, 1, False, want)
    runs = ((TO_TORCH_TOPK, ["torch_topk"]), (TO_REFERENCE, ["reference"]), (TO_TORCH_TOPK, []))
    outs = []
    for policy, expected in runs:
        torch._dynamo.reset()
        cc = add_to_compilation_config(
            CompilationConfig(mode=CompilationMode.VLLM_COMPILE, cache_dir=str(vllm_cache)), policy)
        vc = _vllm_config(cc)

        def step(x, lens):
            if form == "functional":
                return dsa_ops.topk_decode(x, lens, 64)
            buf = torch.full((x.shape[0], 64), 7, dtype=torch.int32)
            dsa_ops.topk_decode(x, lens, 64, out=buf)
            return buf

        with set_current_vllm_config(vc):
            got = torch.compile(step, backend=VllmBackend(vc), fullgraph=True)(logits, lengths)
        rewrites = cc.inductor_compile_config[PASS_KEY].topk_pass.rewrites
        assert [r.backend for r in rewrites] == expected, f"policy {policy.name}"
        assert all(r.form == form for r in rewrites)
        assert_decode_equivalent(got, logits, lengths, 64)
        outs.append(got)
    assert torch.equal(outs[1], want)  # the reference's own (index-ordered) output
    assert not torch.equal(outs[0], outs[1]) and torch.equal(outs[2], outs[0])
    torch._dynamo.reset()
