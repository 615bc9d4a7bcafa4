"""``passes.vllm`` without vLLM: importing it is light, and the opt-in is parsed strictly.

The tests that need vLLM itself live in ``tests/vllm/`` (run by ``.ci/vllm-tests``).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from passes import vllm as passes_vllm


def test_importing_passes_vllm_does_not_import_vllm():
    code = "import sys, passes.vllm, dsa_ops; assert 'vllm' not in sys.modules, 'vllm imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("value, want", [(None, False), ("", False), ("0", False), (" 1 ", True), ("1", True)])
def test_opt_in_values(monkeypatch, value, want):
    if value is None:
        monkeypatch.delenv(passes_vllm.ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(passes_vllm.ENV_VAR, value)
    assert passes_vllm.opted_in() is want


@pytest.mark.parametrize("value", ["yes", "true", "2"])
def test_opt_in_rejects_other_values(monkeypatch, value):
    monkeypatch.setenv(passes_vllm.ENV_VAR, value)
    with pytest.raises(ValueError, match=passes_vllm.ENV_VAR):
        passes_vllm.opted_in()


def test_register_without_opt_in_needs_only_dsa_ops(monkeypatch):
    monkeypatch.delenv(passes_vllm.ENV_VAR, raising=False)
    passes_vllm.register()  # registers the ops; touches no vLLM


# --- passes.vllm_route without vLLM: the opt-in, the layer scope and the refusals --------

import logging  # noqa: E402
import types  # noqa: E402

from passes import vllm_route  # noqa: E402


def test_importing_the_route_does_not_import_vllm():
    code = "import sys, passes.vllm_route; assert 'vllm' not in sys.modules, 'vllm imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("value, want", [(None, False), ("", False), ("0", False), ("1", True)])
def test_route_opt_in_values(monkeypatch, value, want):
    if value is None:
        monkeypatch.delenv(vllm_route.ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(vllm_route.ENV_VAR, value)
    assert vllm_route.opted_in() is want


def test_route_opt_in_rejects_other_values(monkeypatch):
    monkeypatch.setenv(vllm_route.ENV_VAR, "on")
    with pytest.raises(ValueError, match=vllm_route.ENV_VAR):
        vllm_route.opted_in()


def _layer(**kw):
    base = dict(topk_tokens=2048, compress_ratio=1, candidate_blocks=None, topk_backend="auto")
    return types.SimpleNamespace(**(base | kw))


@pytest.mark.parametrize("kw, why", [
    ({}, ""),
    ({"topk_tokens": 512}, "k=512"),
    ({"compress_ratio": 4}, "compress_ratio=4"),
    ({"candidate_blocks": object()}, "candidate blocks"),
    ({"topk_backend": "deep_select"}, "topk backend 'deep_select'"),
])
def test_only_dsa_layers_are_routed(kw, why):
    assert vllm_route.eligible(_layer(**kw)) == why


def test_untested_vllm_version_refuses_before_touching_vllm(caplog):
    vllm_route._state.warned.clear()
    with caplog.at_level(logging.WARNING, logger="dsa_ops.vllm_route"):
        assert vllm_route.install("cuda", version="0.32.1") is False
        assert vllm_route.install("rocm", version="0.32.1") is False
    assert len([r for r in caplog.records if r.name == "dsa_ops.vllm_route"]) == 1
    assert "not a tested version" in caplog.text and vllm_route.installed() is None


def test_check_seams_rejects_an_unknown_platform():
    with pytest.raises(ValueError, match="platform"):
        vllm_route.check_seams("xpu", version="0.33.0")


def test_a_caller_that_stopped_calling_a_seam_is_reported():
    def caller(logits, topk_backend):
        return get_indexer_topk(topk_backend)  # noqa: F821  (a name in co_names, never run)

    problems: list[str] = []
    vllm_route._refers(problems, caller, ("get_indexer_topk", "top_k_per_row_prefill"), ("topk_backend", "k_cache_prefix"))
    assert len(problems) == 2
    assert "no longer calls top_k_per_row_prefill" in problems[0] and "no local 'k_cache_prefix'" in problems[1]
