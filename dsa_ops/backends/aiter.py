"""Backend ``aiter``: AITER's indexer top-k (``aiter.ops.topk``), ROCm gfx950 only.

AITER's entry points write into a caller buffer and differ from our contract in three
ways (contract §2.1, §3.2, §8 items 1-2); the adapters here close each gap:

* Decode reads ``seqLens`` flat at ``r // next_n`` and never clamps to the width, so a
  2-D (B, n) tensor with next_n = n is misread and a length past W reads past the row.
  We always pass one clamped length per row (int32, (R,)) with next_n = 1, as vLLM does.
* Prefill returns chunk-global columns j in [s, e); our contract is sequence-local
  ``j - s`` with -1 kept. We clamp the windows to [0, W] first (AITER does not check)
  and subtract the start with torch ops afterwards: no host sync, graph-safe.
* ``stable=`` exists only from AITER 0.1.20 (PR #4415). It is passed only when the
  installed signature has it; otherwise :func:`_supports` refuses ``stable=True``.

``aiter`` is imported lazily, inside the probe and the writers, never at module import.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any, Callable

import torch
from torch import Tensor

from dsa_ops.backends.base import YES, Backend, Query, Support
from dsa_ops.backends.rows import decode_ends, prefill_windows, row_pitch

MODULE = "aiter.ops.topk"
DECODE_FN = "top_k_per_row_decode"
PREFILL_FN = "top_k_per_row_prefill"
ARCH_PREFIX = "gfx950"  # the only arch with tuned AITER indexer top-k (vLLM _aiter_ops.py:2915-2921)


def _topk_module() -> Any:
    """``aiter.ops.topk``; looked up on every call (a dict hit once imported)."""
    return importlib.import_module(MODULE)


def _entry(name: str) -> Callable[..., None]:
    return getattr(_topk_module(), name)


@functools.lru_cache(maxsize=None)
def _params(fn: Callable[..., Any]) -> frozenset[str]:
    """Parameter names of an AITER entry point (cached per function object)."""
    return frozenset(inspect.signature(fn).parameters)


def _kwargs(fn: Callable[..., Any], k: int, stable: bool) -> dict[str, Any]:
    kw: dict[str, Any] = {"k": k}
    if "stable" in _params(fn):
        kw["stable"] = stable
    return kw


def decode(logits: Tensor, lengths: Tensor, k: int, next_n: int, stable: bool, out: Tensor) -> None:
    """Decode writer: one clamped length per row, next_n = 1 (contract §2.1, §8 item 2)."""
    rows = logits.shape[0]
    if rows == 0:
        return
    ends = decode_ends(logits, lengths, next_n, torch.int32)
    fn = _entry(DECODE_FN)
    fn(logits, 1, ends, out, rows, row_pitch(logits), int(logits.stride(1)), **_kwargs(fn, k, stable))


def prefill(logits: Tensor, row_starts: Tensor, row_ends: Tensor, k: int, stable: bool, out: Tensor) -> None:
    """Prefill writer: clamped windows in, chunk-global columns out, made sequence-local."""
    rows = logits.shape[0]
    if rows == 0:
        return
    # An inverted window becomes empty (all -1); AITER handles it, but we do not rely on that.
    s, e = prefill_windows(logits, row_starts, row_ends, torch.int32)
    fn = _entry(PREFILL_FN)
    fn(logits, s, e, out, None, rows, row_pitch(logits), int(logits.stride(1)), **_kwargs(fn, k, stable))
    # Chunk-global j -> j - s; -1 stays -1 (vLLM does the same in a Triton kernel).
    out.copy_(torch.where(out >= 0, out - s[:, None], -1))


def _available() -> Support:
    if not torch.version.hip:
        return Support(False, "not a ROCm build of torch (torch.version.hip is None)")
    if not torch.cuda.is_available():
        return Support(False, "no ROCm GPU is visible (torch.cuda.is_available() is False)")
    arch = str(getattr(torch.cuda.get_device_properties(0), "gcnArchName", ""))
    if not arch.startswith(ARCH_PREFIX):
        return Support(False, f"device 0 is {arch or 'unknown'}; AITER's indexer top-k is tuned for gfx950 only")
    try:
        mod = _topk_module()
    except Exception as exc:  # ImportError, or a JIT build failure inside aiter
        return Support(False, f"{MODULE} does not import: {exc!r}")
    for name in (DECODE_FN, PREFILL_FN):
        fn = getattr(mod, name, None)
        if fn is None:
            return Support(False, f"{MODULE}.{name} is missing (AITER too old?)")
        if "k" not in _params(fn):
            return Support(False, f"{MODULE}.{name} has no 'k' parameter (needs AITER >= 0.1.19)")
    return YES


def has_stable() -> bool:
    """Whether both installed entry points take ``stable=`` (AITER >= 0.1.20)."""
    mod = _topk_module()
    return all("stable" in _params(getattr(mod, n)) for n in (DECODE_FN, PREFILL_FN))


def _supports(query: Query) -> Support:
    if query.device_type != "cuda":
        return Support(False, f"AITER runs on ROCm GPUs, got device type {query.device_type!r}")
    if query.stable and not has_stable():
        return Support(False, "the installed AITER's top_k_per_row_* take no 'stable' (needs AITER >= 0.1.20)")
    return YES


def _version() -> str:
    """``aiter.__version__`` if set, else the installed distribution's version."""
    try:
        mod = importlib.import_module("aiter")
    except Exception:
        return "absent"
    ver = getattr(mod, "__version__", None)
    if ver:
        return str(ver)
    from importlib import metadata

    for dist in metadata.packages_distributions().get("aiter", []):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


BACKEND = Backend(
    name="aiter",
    decode=decode,
    prefill=prefill,
    available=_available,
    supports=_supports,
    version=_version,
    description="AITER one-block radix select (ROCm gfx950); lengths flattened, prefill made local",
)
