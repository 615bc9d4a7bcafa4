"""Fixtures for the tests that import the real vLLM, and the CI rule that they must run.

With ``DSA_OPS_REQUIRE_VLLM=1`` (set by ``.ci/vllm-tests``) a skip anywhere under this
directory, at collection or at run time, is reported as a failure: those tests exist to
run against vLLM 0.33.0, and a silent skip would hide that they did not.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator

import pytest
import torch

REQUIRE_ENV = "DSA_OPS_REQUIRE_VLLM"
_HERE = Path(__file__).parent


def _required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") == "1"


def _skip_reason(rep: pytest.BaseReport) -> str:
    lr = rep.longrepr
    return lr[2] if isinstance(lr, tuple) and len(lr) == 3 else str(lr)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    outcome = yield
    rep = outcome.get_result()
    if _required() and rep.skipped and _HERE in Path(str(collector.path)).parents:
        rep.outcome = "failed"
        rep.longrepr = f"{REQUIRE_ENV}=1 but {collector.nodeid} was skipped: {_skip_reason(rep)}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    rep = outcome.get_result()
    if _required() and rep.skipped and not hasattr(rep, "wasxfail"):
        rep.outcome = "failed"
        rep.longrepr = f"{REQUIRE_ENV}=1 but {item.nodeid} was skipped: {_skip_reason(rep)}"


@pytest.fixture(scope="session")
def vllm_c_placeholders() -> Iterator[None]:
    """Inert ``torch.ops._C.<op>`` schemas for the ops vLLM's FixFunctionalizationPass names.

    vLLM's CUDA extension (``vllm._C_stable_libtorch``) cannot load on a machine without a
    CUDA driver, yet ``FixFunctionalizationPass.__call__`` (the manager's last pass) looks
    up ``torch.ops._C.rotary_embedding`` unconditionally and compares
    ``auto_functionalized`` targets with other ``torch.ops._C`` ops, which raises without
    the extension. We define a placeholder schema for each op it names that is missing, so
    the real pass runs. Nothing calls them: our graphs contain none of these ops.
    """
    from vllm.compilation.passes.utility import fix_functionalization

    src = Path(fix_functionalization.__file__).read_text()
    names = sorted(set(re.findall(r"torch\.ops\._C\.(\w+)\.default", src)))
    missing = [n for n in names if not hasattr(torch.ops._C, n)]
    lib = torch.library.Library("_C", "FRAGMENT") if missing else None
    for n in missing:
        lib.define(f"{n}(Tensor dsa_ops_placeholder) -> ()")
    yield
    # Kept registered for the session: torch.ops._C caches the looked-up packets.


@pytest.fixture
def vllm_cache(tmp_path, monkeypatch) -> Path:
    """vLLM's and Inductor's caches under tmp_path: every compile in the test is fresh."""
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))
    return tmp_path / "compile-cache"
