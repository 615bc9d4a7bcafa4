"""Shared fixtures: a per-test seeded generator, dynamo reset, the hypothesis profile, and the
GPU gate (``@pytest.mark.gpu``, see ``tests/gpu.py``)."""

from __future__ import annotations

import os
import zlib

import pytest
import torch
from hypothesis import HealthCheck, settings

from tests import gpu

# Bounded and deadline-free so CI stays fast and timing noise never fails a run; the
# database stays on (it is gitignored) so a failing example is replayed first next time.
# HYPOTHESIS_PROFILE=thorough runs 20x more examples for a local soak.
settings.register_profile(
    "dsa_ops", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("thorough", parent=settings.get_profile("dsa_ops"), max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dsa_ops"))


@pytest.fixture
def gen(request) -> torch.Generator:
    """A torch.Generator seeded from the test id: fresh data per test, same data every run."""
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def fresh_dynamo():
    """Compile tests start and end with an empty dynamo cache (no cross-test recompiles)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a ``gpu``-marked test, saying why, where no device (or one of its ``needs=``) is there."""
    marks = list(item.iter_markers("gpu"))
    if marks:
        reason = gpu.skip_reason(m.kwargs["needs"] for m in marks if "needs" in m.kwargs)
        if reason:
            pytest.skip(reason)
