"""Backend ``cuda``: our native top-k kernels (``topk.cu``, ``solo.cu``, ``split.cu``), NVRTC-built at first use.

Exact per contract §1 in both modes (``stable=True``: the ordered emission, ascending columns
with the lowest-column ties; ``stable=False``: the solo and split kernels write their winners
in any order, which saves the leader's bitmap marks and ordered scan). Needs an NVIDIA GPU of compute capability 9.0 or newer (thread-block clusters),
the CUDA driver and NVRTC (torch's CUDA wheels ship it). Importing this module loads no
library; the probe does, once.
"""

from __future__ import annotations

import torch

from dsa_ops.backends.base import YES, Backend, Query, Support
from dsa_ops.backends.cuda import cache, driver, nvrtc  # no library loads until the probe calls load()


def _available() -> Support:
    if torch.version.cuda is None:
        return Support(False, "torch is not a CUDA build (the cuda backend runs on NVIDIA GPUs; ROCm: not built yet)")
    if not torch.cuda.is_available():
        return Support(False, "no CUDA device")
    cc = torch.cuda.get_device_capability()
    if cc < (9, 0):
        return Support(False, f"needs compute capability 9.0+ (thread-block clusters), the device has {cc[0]}.{cc[1]}")
    try:
        nvrtc.load()
        driver.load()
    except (nvrtc.NvrtcError, driver.DriverError) as exc:
        return Support(False, str(exc))
    return YES


def _supports(query: Query) -> Support:
    if query.device_type != "cuda":
        return Support(False, f"runs on cuda devices, got {query.device_type}")
    if query.k < 1:
        return Support(False, f"k must be >= 1, got {query.k}")
    return YES


def _version() -> str:
    from dsa_ops.backends.cuda import topk  # the kernels' module: loaded at first use, not by import dsa_ops

    try:
        compiler = "nvrtc %d.%d" % nvrtc.version()
    except Exception:
        compiler = "nvrtc absent"
    return f"topk.cu {topk.program().digest[:16]}, {compiler}"


def decode(logits, lengths, k, next_n, stable, out) -> None:
    """Decode writer (see :func:`dsa_ops.backends.cuda.topk.decode`)."""
    from dsa_ops.backends.cuda import topk

    topk.decode(logits, lengths, k, next_n, stable, out)


def prefill(logits, row_starts, row_ends, k, stable, out) -> None:
    """Prefill writer (see :func:`dsa_ops.backends.cuda.topk.prefill`)."""
    from dsa_ops.backends.cuda import topk

    topk.prefill(logits, row_starts, row_ends, k, stable, out)


BACKEND = Backend(
    name="cuda",
    decode=decode,
    prefill=prefill,
    available=_available,
    supports=_supports,
    version=_version,
    description="native CUDA radix select (sm_90+): clusters + distributed shared memory up to 64 rows, one CTA "
                "a row above (and for short rows); cost follows the live length",
)
