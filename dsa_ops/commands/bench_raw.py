"""Raw-kernel columns for ``dsa-ops bench``: vLLM's ops called directly, the way vLLM calls
them, so the bench shows what each dsa-ops adapter adds on top.

A raw call gets inputs already in the kernel's form (one int32 length per row, within
[0, W], a fixed workspace) and does only what vLLM's own call does: ``persistent_topk``
and ``top_k_per_row_decode`` alone; ``cooperative_topk`` alone (``<name>:raw``) and after
the -1 fill of the output (``vllm_cooperative:raw+fill``), which is the work the
``vllm_cooperative`` adapter must do too (the kernel may leave slots unwritten).
"""

from __future__ import annotations

from typing import Callable

import torch

from dsa_ops.backends import vllm_intree, vllm_radix

RAW = {
    "vllm:raw": "vllm",
    "vllm_persistent:raw": "vllm_persistent",
    "vllm_cooperative:raw": "vllm_cooperative",
    "vllm_cooperative:raw+fill": "vllm_cooperative",
}


def raw_names(backends: list[str]) -> list[str]:
    """The raw columns for the vLLM backends in ``backends`` (each after its backend)."""
    return [raw for raw, base in RAW.items() if base in backends]


def raw_call(raw: str, x: torch.Tensor, lens: torch.Tensor, k: int, out: torch.Tensor) -> Callable[[], None]:
    """A no-argument callable doing the raw call ``raw`` on these buffers."""
    ops = getattr(torch.ops, vllm_radix.NAMESPACE)
    rows, width = x.shape
    ends = lens.to(torch.int32).clamp(0, width).contiguous()  # in the kernel's form already
    ws = vllm_radix.workspace(x.device)
    if raw == "vllm:raw":
        pitch = int(x.stride(0))
        return lambda: getattr(ops, vllm_intree.DECODE_OP)(x, 1, ends, out, rows, pitch, 1, k)
    if raw == "vllm_persistent:raw":
        return lambda: ops.persistent_topk(x, ends, out, ws, k, width)
    if raw == "vllm_cooperative:raw":
        return lambda: ops.cooperative_topk(x, ends, out, ws, k, width)
    if raw == "vllm_cooperative:raw+fill":
        def call() -> None:
            out.fill_(-1)
            ops.cooperative_topk(x, ends, out, ws, k, width)
        return call
    raise ValueError(f"raw: expected one of {sorted(RAW)}, got {raw!r}")


def supported(raw: str, rows: int) -> bool:
    """cooperative_topk runs at most 64 rows (the adapter hands more to persistent)."""
    return not (raw.startswith("vllm_cooperative") and rows > vllm_radix.COOPERATIVE_MAX_ROWS)
