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
