"""What stock vLLM 0.33.0 runs for a decode top-k call: its ``auto`` choice among its three
kernels and the call it makes (reimplemented from its documented behaviour in
``vllm/model_executor/layers/indexer_topk.py``; see dsa_ops/commands/bench_stock.py). The
calibration's stock column, ``dsa-ops bench --stock`` and their tests use it.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

import dsa_ops
from dsa_ops.backends import vllm_intree, vllm_radix

AUTO_COOPERATIVE_MAX_ROWS = vllm_radix.COOPERATIVE_MAX_ROWS  # vLLM's cooperative_topk row limit for "auto"
RADIX_K = vllm_radix.KS  # the k the radix kernels take
KERNELS = {"cooperative": "cooperative_topk", "persistent": "persistent_topk", "per_row": "top_k_per_row_decode"}


def stock_choice(family: str, platform: str, capability: Optional[tuple[int, int]], k: int, rows: int,
                 row_pitch: int) -> str:
    """What stock vLLM 0.33.0's ``auto`` top-k runs: "cooperative", "persistent" or "per_row".

    Args:
        family: "decode" or "prefill" (prefill is always the per-row kernel).
        platform: "cuda", "rocm", ... (only CUDA takes the radix kernels).
        capability: the device's (major, minor), e.g. (9, 0) on Hopper; None if unknown.
        k: top-k; rows: the call's row count; row_pitch: ``logits.stride(0)`` in elements.
    """
    if family != "decode":
        return "per_row"
    cuda = platform == "cuda"
    cap = capability or (0, 0)
    cooperative_capable = cuda and cap >= (9, 0) and cap[0] != 12
    if cuda and k in RADIX_K and rows <= AUTO_COOPERATIVE_MAX_ROWS and row_pitch % 4 == 0 and cooperative_capable:
        return "cooperative"
    if cuda and k in RADIX_K:
        return "persistent"
    return "per_row"


def available() -> str:
    """"" when vLLM's compiled top-k ops are here (all three stock kernels), else why not."""
    for name in ("vllm", "vllm_persistent", "vllm_cooperative"):
        avail = dsa_ops.backends()[name].availability()
        if not avail:
            return f"{name}: {avail.reason}"
    return ""


def stock_call(choice: str, x: torch.Tensor, lens: torch.Tensor, k: int, out: torch.Tensor,
               max_seq_len: int, fill: bool = True) -> Callable[[], None]:
    """vLLM's stock call for ``choice``: the -1 fill of the buffer rows (``fill``), then the kernel."""
    ops = getattr(torch.ops, vllm_radix.NAMESPACE)
    rows = x.shape[0]
    ws = vllm_radix.workspace(x.device)
    pitch = int(x.stride(0))
    if choice == "cooperative":
        kernel = lambda: ops.cooperative_topk(x, lens, out, ws, k, max_seq_len)  # noqa: E731
    elif choice == "persistent":
        kernel = lambda: ops.persistent_topk(x, lens, out, ws, k, max_seq_len)  # noqa: E731
    elif choice == "per_row":
        kernel = lambda: getattr(ops, vllm_intree.DECODE_OP)(x, 1, lens, out, rows, pitch, 1, k)  # noqa: E731
    else:
        raise ValueError(f"choice: expected one of {sorted(KERNELS)}, got {choice!r}")

    def call() -> None:
        out.fill_(-1)
        kernel()

    return call if fill else kernel
