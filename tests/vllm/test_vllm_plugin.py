"""The ``vllm.general_plugins`` entry point, loaded by the real vLLM 0.33.0 plugin loader."""

from __future__ import annotations

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here (.ci/vllm-tests runs these in its own venv)")

import vllm.plugins  # noqa: E402
from vllm.compilation.backends import VllmBackend  # noqa: E402
from vllm.compilation.passes.inductor_pass import CallableInductorPass  # noqa: E402
from vllm.config import (  # noqa: E402
    CompilationConfig, CompilationMode, DeviceConfig, VllmConfig, set_current_vllm_config,
)

import dsa_ops  # noqa: E402
from dsa_ops import policy as P  # noqa: E402
from dsa_ops.testing import assert_decode_equivalent  # noqa: E402
from passes import vllm as passes_vllm  # noqa: E402
from passes._vllm_inductor import VllmComposedPass  # noqa: E402

KEY = passes_vllm.PASS_KEY


@pytest.fixture
def plugin_env(monkeypatch):
    """Only our plugin, a fresh loader, and VllmConfig.__post_init__ restored afterwards."""
    monkeypatch.setenv("VLLM_PLUGINS", "dsa_ops")
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    monkeypatch.setattr(VllmConfig, "__post_init__", VllmConfig.__post_init__)
    return monkeypatch


def _config(**cc_kwargs) -> VllmConfig:
    return VllmConfig(compilation_config=CompilationConfig(**cc_kwargs), device_config=DeviceConfig(device="cpu"))


def test_vllm_discovers_the_entry_point(plugin_env):
    plugins = vllm.plugins.load_plugins_by_group(vllm.plugins.DEFAULT_PLUGINS_GROUP)
    assert plugins == {"dsa_ops": passes_vllm.register}


def test_plugin_without_opt_in_only_registers_ops(plugin_env):
    plugin_env.delenv(passes_vllm.ENV_VAR, raising=False)
    before = VllmConfig.__post_init__
    vllm.plugins.load_general_plugins()
    assert VllmConfig.__post_init__ is before
    assert KEY not in _config().compilation_config.inductor_compile_config
    assert hasattr(torch.ops.dsa_ops, "topk_decode")


def test_plugin_opt_in_installs_into_every_new_config(plugin_env):
    plugin_env.setenv(passes_vllm.ENV_VAR, "1")
    vllm.plugins.load_general_plugins()
    passes_vllm.register()  # vLLM loads plugins in every process; twice must not stack
    vc = _config()
    comp = vc.compilation_config.inductor_compile_config[KEY]
    assert isinstance(comp, VllmComposedPass) and comp.topk_pass is not None and comp.topk_pass.policy is None
    user = CallableInductorPass(lambda g: None, uuid="user")
    cc = CompilationConfig(inductor_compile_config={KEY: user})
    VllmConfig(compilation_config=cc, device_config=DeviceConfig(device="cpu"))
    VllmConfig(compilation_config=cc, device_config=DeviceConfig(device="cpu"))  # same cc, again
    comp = cc.inductor_compile_config[KEY]
    assert comp.members[0] is user and len(comp.members) == 2  # theirs first, ours once


def test_plugin_opt_in_reaches_the_current_config(plugin_env):
    plugin_env.setenv(passes_vllm.ENV_VAR, "1")
    vc = _config()  # built before the plugin ran
    assert KEY not in vc.compilation_config.inductor_compile_config
    with set_current_vllm_config(vc):
        passes_vllm.register()
    assert isinstance(vc.compilation_config.inductor_compile_config[KEY], VllmComposedPass)


def test_plugin_rejects_a_bad_opt_in_value(plugin_env):
    plugin_env.setenv(passes_vllm.ENV_VAR, "yes")
    with pytest.raises(ValueError, match=passes_vllm.ENV_VAR):
        passes_vllm.register()


def test_plugin_path_end_to_end_follows_the_current_policy(plugin_env, vllm_c_placeholders, vllm_cache):
    """Opt-in plugin + vLLM's backend: the pass reads dsa_ops.policy.current() when it runs."""
    plugin_env.setenv(passes_vllm.ENV_VAR, "1")
    vllm.plugins.load_general_plugins()
    vc = _config(mode=CompilationMode.VLLM_COMPILE, cache_dir=str(vllm_cache))
    policy = P.Policy(decode=(P.Rule("torch_topk", "test", platform="cpu"), P.Rule("reference")),
                      prefill=P.DEFAULT.prefill, name="plugin-test")
    logits = torch.randn(3, 200)
    lengths = torch.tensor([0, 50, 200], dtype=torch.int32)
    torch._dynamo.reset()
    with P.use(policy), set_current_vllm_config(vc):
        got = torch.compile(lambda x, n: dsa_ops.topk_decode(x, n, 32), backend=VllmBackend(vc),
                            fullgraph=True)(logits, lengths)
    torch._dynamo.reset()
    rewrites = vc.compilation_config.inductor_compile_config[KEY].topk_pass.rewrites
    assert [r.backend for r in rewrites] == ["torch_topk"]
    assert_decode_equivalent(got, logits, lengths, 32)
