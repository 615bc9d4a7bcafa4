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
* Newer AITER routes decode to a tiered kernel that checks its inputs (dtypes, devices,
  ``stride0 == logits.stride(0)``, enough ``seqLens`` entries) and clamps lengths itself.
  The adapter's call satisfies both kernels; for a single row it passes a view whose
  ``stride(0)`` is the width, so the stride it names is the tensor's own.

Availability (:func:`_available`, cached by the record): a ROCm build, a gfx950 device,
the ``amd-aiter`` distribution at :data:`MIN_VERSION` or newer, both entry points taking
``k``, and a tiny real decode and prefill call checked against the reference. AITER
builds or loads its JIT modules on the first call, so a broken setup fails here, outside
any graph capture, and not at the first top-k inside one. Asked during a capture, the probe
answers "not available" without caching that answer.

``aiter`` is imported lazily, inside the probe and the writers, never at module import.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from importlib import metadata
from typing import Any, Callable

import torch
from torch import Tensor

from dsa_ops.backends.base import YES, Backend, Query, Support
from dsa_ops.backends.rows import decode_ends, prefill_windows, row_pitch
from dsa_ops.testing import assert_decode_equivalent, assert_prefill_equivalent

MODULE = "aiter.ops.topk"
DECODE_FN = "top_k_per_row_decode"
PREFILL_FN = "top_k_per_row_prefill"
ARCH_PREFIX = "gfx950"  # the only arch with tuned AITER indexer top-k (vLLM _aiter_ops.py:2915-2921)
DISTRIBUTION = "amd-aiter"  # what pip knows AITER as; the ``aiter`` module sets no __version__
# The first release whose top_k_per_row_decode / _prefill take ``k`` (decode has been
# one-block only since 0.1.17); ``stable=`` needs 0.1.20 and is feature-detected.
MIN_VERSION = (0, 1, 19)
PROBE_DEVICE = "cuda"  # where the warm-up call runs (tests point it elsewhere)


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
    if rows == 1 and logits.stride(0) != logits.shape[1]:
        # One row: its stride(0) is arbitrary. Name the width as the pitch, on a view
        # whose stride(0) says the same (newer AITER checks stride0 == logits.stride(0)).
        logits = logits.as_strided(logits.shape, (logits.shape[1], logits.stride(1)))
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


def _version_tuple(version: str) -> tuple[int, ...] | None:
    """(major, minor, patch) of a version string such as "0.1.20.dev46+g4048607"; None if unreadable.

    A pre-release of a version counts as that version (0.1.19.dev5 passes a 0.1.19 pin).
    """
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    return tuple(int(g) for g in m.groups()) if m else None


def _min_version_str() -> str:
    return ".".join(map(str, MIN_VERSION))


def _capturing() -> bool:
    try:
        return bool(torch.cuda.is_current_stream_capturing())
    except Exception:  # no CUDA / ROCm runtime: nothing can be capturing
        return False


def _warm_up() -> Support:
    """One tiny decode and one tiny prefill call, checked against the reference.

    AITER JIT-builds / loads its top-k module on the first call; doing it here keeps that
    out of graph capture and turns a broken build into a reason instead of a crash.
    """
    dev = torch.device(PROBE_DEVICE)
    gen = torch.Generator().manual_seed(0)
    rows, width, k = 2, 4096, 2048
    x = torch.randn(rows, width, generator=gen).to(dev)
    lengths = torch.tensor([width, 3000], dtype=torch.int32, device=dev)
    starts = torch.tensor([0, 1000], dtype=torch.int32, device=dev)
    out = torch.full((rows, k), -7, dtype=torch.int32, device=dev)
    try:
        decode(x, lengths, k, 1, False, out)
        assert_decode_equivalent(out.cpu(), x.cpu(), lengths.cpu(), k)
        out.fill_(-7)
        prefill(x, starts, lengths, k, False, out)
        assert_prefill_equivalent(out.cpu(), x.cpu(), starts.cpu(), lengths.cpu(), k)
    except AssertionError as exc:
        return Support(False, f"warm-up call returned a wrong result: {str(exc).splitlines()[0]}")
    except Exception as exc:  # JIT build / load failure, HIP error, missing symbol
        return Support(False, f"warm-up call of {MODULE} failed: {exc!r}")
    return YES


def _available() -> Support:
    if not torch.version.hip:
        return Support(False, "not a ROCm build of torch (torch.version.hip is None)")
    if not torch.cuda.is_available():
        return Support(False, "no ROCm GPU is visible (torch.cuda.is_available() is False)")
    arch = str(getattr(torch.cuda.get_device_properties(0), "gcnArchName", ""))
    if not arch.startswith(ARCH_PREFIX):
        return Support(False, f"device 0 is {arch or 'unknown'}; AITER's indexer top-k is tuned for gfx950 only")
    if _capturing():
        return Support(False, "first asked during CUDA graph capture, where the warm-up call cannot run; "
                              "call dsa_ops.backends.get('aiter').availability() before capturing",
                       final=False)
    version = _version()
    if version == "absent":
        return Support(False, f"the {DISTRIBUTION} distribution is not installed (needs {DISTRIBUTION} "
                              f">= {_min_version_str()})")
    have = _version_tuple(version)
    if have is None or have < MIN_VERSION:
        return Support(False, f"{DISTRIBUTION} {version} is installed; needs >= {_min_version_str()}")
    try:
        mod = _topk_module()
    except Exception as exc:  # ImportError, or a JIT build failure inside aiter
        return Support(False, f"{MODULE} does not import: {exc!r}")
    for name in (DECODE_FN, PREFILL_FN):
        fn = getattr(mod, name, None)
        if fn is None:
            return Support(False, f"{MODULE}.{name} is missing ({DISTRIBUTION} {version})")
        if "k" not in _params(fn):
            return Support(False, f"{MODULE}.{name} has no 'k' parameter, though {DISTRIBUTION} {version} "
                                  f">= {_min_version_str()} should have it")
    return _warm_up()


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
    """The installed ``amd-aiter`` distribution's version, or "absent".

    The ``aiter`` module itself sets no ``__version__``; pip's record of the distribution
    is what says which AITER this is.
    """
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "absent"


BACKEND = Backend(
    name="aiter",
    decode=decode,
    prefill=prefill,
    available=_available,
    supports=_supports,
    version=_version,
    description="AITER one-block radix select (ROCm gfx950); lengths flattened, prefill made local",
)
