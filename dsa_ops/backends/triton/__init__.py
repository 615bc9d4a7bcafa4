"""Backend ``triton``: our own top-k kernels in Triton (decode and prefill).

Decode and non-stable prefill: a radix select (``kernels_radix.py``): a few long rows are
split over co-resident programs that agree on the k-th key digit by digit through row
barriers; many rows (prefill chunks) get one program each. Stable prefill: the
sample-pivot kernel (``kernels.py``), one read of each row into winners / a mid buffer,
the last program of a row resolves.
Both are exact per contract §1.1; ``stable=True`` gives the reference's bytes. Cost follows
the live length L: every loop is bounded by the device length, never by the width W.

Workspaces: cached allocations per (device, stream, kernel), owned by ``workspace.py`` and
asked for by ``launch.py`` and ``radix_launch.py``; their counters are restored to zero by each launch, so CUDA-graph
replays need no memset.

``triton`` is imported lazily (in the probe and the writers). With ``TRITON_INTERPRET=1``
the backend also serves CPU tensors through Triton's interpreter (tests only: slow).
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from dsa_ops.backends.base import YES, Backend, Query, Support, module_version
from dsa_ops.backends.triton import launch  # torch only: the kernels (and triton) load at the first launch

MAX_K = 4096


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def _available() -> Support:
    try:
        import triton  # noqa: F401
    except Exception as exc:  # not installed, or a broken install
        return Support(False, f"triton does not import ({exc!r})")
    if _interpret():
        return YES
    if not torch.cuda.is_available():
        return Support(False, "no CUDA/ROCm device (set TRITON_INTERPRET=1 to run on CPU, slowly)")
    return YES


def _supports(query: Query) -> Support:
    if query.device_type != "cuda" and not (query.device_type == "cpu" and _interpret()):
        return Support(False, f"runs on cuda devices (cpu only with TRITON_INTERPRET=1), got {query.device_type}")
    if not 1 <= query.k <= MAX_K:
        return Support(False, f"k must be in [1, {MAX_K}], got {query.k}")
    return YES


def decode(logits: Tensor, lengths: Tensor, k: int, next_n: int, stable: bool, out: Tensor) -> None:
    """Decode writer (see :func:`dsa_ops.backends.triton.launch.decode`)."""
    launch.decode(logits, lengths, k, next_n, stable, out)


def prefill(logits: Tensor, row_starts: Tensor, row_ends: Tensor, k: int, stable: bool, out: Tensor) -> None:
    """Prefill writer (see :func:`dsa_ops.backends.triton.launch.prefill`)."""
    launch.prefill(logits, row_starts, row_ends, k, stable, out)


BACKEND = Backend(
    name="triton",
    decode=decode,
    prefill=prefill,
    available=_available,
    supports=_supports,
    version=lambda: module_version("triton"),
    description=("Triton radix select (decode, prefill) and sample-pivot select (stable prefill); "
                 "cost follows the live length"),
)
