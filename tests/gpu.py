"""The one GPU gate: ``@pytest.mark.gpu`` (or ``pytestmark``, or a param's marks) on a test
that needs a CUDA / ROCm device; ``@pytest.mark.gpu(needs=fn)`` adds a requirement, ``fn()``
returning why it is not met ("" when it is). ``tests/conftest.py`` skips such a test, with
the reason, where :func:`skip_reason` says so; ``-m gpu`` / ``-m "not gpu"`` select them."""

from __future__ import annotations

import os
from typing import Callable, Iterable

import torch


def device_reason() -> str:
    """Why no GPU test can run in this process ("" when one can)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "a TRITON_INTERPRET=1 process runs the CPU cases only"
    if not torch.cuda.is_available():
        return "needs a CUDA or ROCm device"
    return ""


def skip_reason(needs: Iterable[Callable[[], str]] = ()) -> str:
    """Why a GPU test with these extra requirements cannot run here ("" when it can)."""
    reason = device_reason()
    for need in needs:
        if reason:
            break
        reason = need()
    return reason
