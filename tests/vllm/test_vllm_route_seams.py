"""The installed vLLM still has every seam the route patches, the refusal paths, the
plugin's opt-in, and the fact docs/vllm.md rests on: DSA architectures end at mode NONE."""

from __future__ import annotations

import logging
import os

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here (.ci/vllm-tests runs these in its own venv)")

from vllm import _custom_ops  # noqa: E402
from vllm.config import CompilationConfig, CompilationMode, DeviceConfig, VllmConfig  # noqa: E402
from vllm.config import vllm as config_vllm  # noqa: E402
from vllm.model_executor.layers import sparse_attn_indexer as sai  # noqa: E402

from passes import vllm as passes_vllm  # noqa: E402
from passes import vllm_route  # noqa: E402


@pytest.fixture(autouse=True)
def _clean():
    vllm_route.uninstall()
    vllm_route._state.warned.clear()
    yield
    vllm_route.uninstall()


@pytest.mark.parametrize("platform", vllm_route.PLATFORMS)
def test_every_seam_exists_in_the_installed_vllm(platform):
    assert vllm.__version__ in vllm_route.TESTED_VLLM
    assert vllm_route.check_seams(platform) == []


def test_untested_version_refuses_with_one_warning(caplog):
    before = (sai.get_indexer_topk, _custom_ops.top_k_per_row_prefill, sai.SparseAttnIndexer.__init__)
    with caplog.at_level(logging.WARNING, logger="dsa_ops.vllm_route"):
        assert vllm_route.install("cuda", version="0.34.0") is False
        assert vllm_route.install("cuda", version="0.34.0") is False
    msgs = [r.getMessage() for r in caplog.records if r.name == "dsa_ops.vllm_route"]
    assert len(msgs) == 1 and "0.34.0 is not a tested version" in msgs[0] and "stock path kept" in msgs[0]
    assert (sai.get_indexer_topk, _custom_ops.top_k_per_row_prefill, sai.SparseAttnIndexer.__init__) == before
    assert vllm_route.installed() is None


def test_a_missing_seam_refuses(monkeypatch, caplog):
    monkeypatch.delattr(sai, "get_indexer_topk")
    with caplog.at_level(logging.WARNING, logger="dsa_ops.vllm_route"):
        assert vllm_route.install("cuda") is False
    assert "sparse_attn_indexer.get_indexer_topk is gone" in caplog.text
    assert not hasattr(sai, "get_indexer_topk") and vllm_route.installed() is None


def test_a_seam_no_longer_called_refuses(monkeypatch):
    """A future vLLM that keeps the name but stops calling it from the indexer function."""
    def sparse_attn_indexer(logits, topk_backend):  # calls neither seam
        return logits

    monkeypatch.setattr(sai, "sparse_attn_indexer", sparse_attn_indexer)
    problems = vllm_route.check_seams("cuda")
    assert any("no longer calls get_indexer_topk" in p for p in problems)
    assert any("no longer calls top_k_per_row_prefill" in p for p in problems)
    assert vllm_route.install("cuda") is False


def test_plugin_route_opt_in(monkeypatch, caplog):
    monkeypatch.delenv(passes_vllm.ENV_VAR, raising=False)
    monkeypatch.setenv(vllm_route.ENV_VAR, "1")
    # This box's vLLM platform is neither CUDA nor ROCm: one warning, nothing patched.
    with caplog.at_level(logging.WARNING, logger="dsa_ops.vllm_route"):
        passes_vllm.register()
    assert vllm_route.installed() is None and "dsa-ops routes only CUDA and ROCm" in caplog.text
    monkeypatch.setattr(vllm_route, "current_platform_name", lambda: "cuda")
    passes_vllm.register()
    passes_vllm.register()  # every vLLM process calls it; twice must not stack
    assert vllm_route.installed() == "cuda"
    assert sai.get_indexer_topk("dsa_ops").__class__ is vllm_route.DecodeRouter
    monkeypatch.setenv(vllm_route.ENV_VAR, "yes")
    with pytest.raises(ValueError, match=vllm_route.ENV_VAR):
        passes_vllm.register()


def test_plugin_without_route_opt_in_patches_nothing(monkeypatch):
    monkeypatch.delenv(vllm_route.ENV_VAR, raising=False)
    monkeypatch.delenv(passes_vllm.ENV_VAR, raising=False)
    passes_vllm.register()
    assert vllm_route.installed() is None


@pytest.mark.parametrize("arch", ["DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"])
def test_dsa_architectures_end_at_mode_none(monkeypatch, arch):
    """vLLM forces breakable CUDA graphs, hence compilation mode NONE, on these models:
    no Inductor pass runs for them, which is why the route exists (docs/vllm.md)."""
    assert arch in config_vllm.DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES
    saved = os.environ.pop("VLLM_USE_BREAKABLE_CUDAGRAPH", None)
    try:
        vc = VllmConfig(compilation_config=CompilationConfig(mode=CompilationMode.VLLM_COMPILE),
                        device_config=DeviceConfig(device="cpu"))
        assert vc.compilation_config.mode == CompilationMode.VLLM_COMPILE
        object.__setattr__(vc, "model_config", type("ModelConfig", (), {"architectures": [arch]})())
        assert vc._maybe_enable_breakable_cudagraph() is True  # the step VllmConfig.__post_init__ runs
        assert vc.compilation_config.mode == CompilationMode.NONE
    finally:
        os.environ.pop("VLLM_USE_BREAKABLE_CUDAGRAPH", None)
        if saved is not None:
            os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] = saved
