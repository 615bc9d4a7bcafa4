"""Test doubles of the foreign top-k kernels (AITER, vLLM in-tree, vLLM persistent /
cooperative), written from their documented contracts (docs/contract.md §2.1, §2.2,
§2.3, §3.2, §5).

The doubles are not kernels: they loop over rows in Python. What they model is the
interface each kernel really has, including the parts our adapters must work around:

* AITER decode reads ``seqLens`` flat at ``r // next_n``, clamps nothing, and addresses
  rows by ``stride0``; AITER prefill returns chunk-global columns. AITER's newer default
  decode (``decode_kernel="tiered"``) checks its inputs instead (dtypes, devices, next_n,
  enough ``seqLens`` entries, ``stride0 == logits.stride(0)``, the output's shape) and
  clamps each row's length to [0, W] itself.
* The in-tree decode reads a 2-D ``seq_lens`` per row and a 1-D one per request, clamps at
  0 only; in-tree prefill returns row-local indices and clamps nothing.
* ``persistent_topk`` / ``cooperative_topk`` take exactly one length per row; persistent
  clamps it to [0, min(W, max_seq_len)] on <= 32 rows and on > 64 rows with a long
  ``max_seq_len``, and not at all on its FilteredTopK path (33..64 rows); cooperative
  clamps at 0 only and ignores ``max_seq_len``; k in {512, 1024, 2048}; a caller workspace of a minimum size;
  cooperative takes at most 64 rows with a row pitch that is a multiple of 4.
* Ties are taken in an arbitrary order and the valid prefix is shuffled, except in AITER's
  ``stable`` mode (lowest index wins, ascending order). The shuffle is seeded from the
  call's host arguments, so equal calls give equal outputs (``opcheck`` compares runs).

Where a real kernel would misbehave silently (read past a row, write before a row, launch
a zero-size grid) the double raises :class:`KernelPreconditionError`, so an adapter that
lets such an input through fails the test instead of passing by luck.
"""

from __future__ import annotations

import importlib.metadata
import math
import sys
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import Tensor

from dsa_ops.backends.reference import order_key

if TYPE_CHECKING:
    import pytest


class KernelPreconditionError(AssertionError):
    """The input would be undefined behaviour for the real kernel."""


@dataclass
class CallLog:
    """What the adapters passed to a double (one dict per call)."""

    calls: list[dict[str, Any]] = field(default_factory=list)


def _check_common(logits: Tensor, indices: Tensor, num_rows: int, k: int) -> None:
    if logits.dtype != torch.float32:
        raise KernelPreconditionError(f"logits must be float32, got {logits.dtype}")
    if indices.dtype != torch.int32 or not indices.is_contiguous() or tuple(indices.shape) != (num_rows, k):
        raise KernelPreconditionError(f"indices must be contiguous int32 ({num_rows}, {k}), got {indices.shape}")


def _row(logits: Tensor, stride0: int, r: int, end: int) -> Tensor:
    """Row r's first ``end`` values, addressed by ``stride0`` as the kernels do."""
    return logits.as_strided((end,), (1,), logits.storage_offset() + r * stride0)


def _call_gen(*host_args: int) -> torch.Generator:
    """A generator seeded from a call's host ints: arbitrary order, same for equal calls."""
    return torch.Generator().manual_seed(hash(host_args) & 0x7FFF_FFFF)


def _emit(values: Tensor, start: int, end: int, k: int, stable: bool, gen: torch.Generator) -> Tensor:
    """k slots for window [start, end) of a row: column numbers in window space + start."""
    n = end - start
    slots = torch.full((k,), -1, dtype=torch.int64)
    if n <= 0:
        return slots
    if n <= k:  # trivial path of every kernel: 0..n-1 in order, then -1
        slots[:n] = torch.arange(n) + start
        return slots
    key = order_key(values[start:end].reshape(1, -1))[0]
    # Tie-break: column (stable) or a random rank (atomic order stand-in).
    tie = torch.arange(n) if stable else torch.randperm(n, generator=gen)
    chosen = torch.topk((key << 31) | tie, k, largest=False).indices
    chosen = chosen.sort().values if stable else chosen[torch.randperm(k, generator=gen)]
    return chosen + start


@dataclass
class AiterDouble:
    """Stand-in for ``aiter.ops.topk``: ``top_k_per_row_decode`` / ``top_k_per_row_prefill``.

    ``decode_kernel``: "one_block" (AITER 0.1.19-0.1.25: no checks, no clamp) or "tiered"
    (the newer default decode: checks its inputs, clamps lengths to [0, W] itself).
    ``fail``: an exception the entry points raise (a JIT build that fails, say).
    """

    with_stable: bool = True
    version: str = "0.1.25+double"
    decode_kernel: str = "one_block"
    fail: Optional[BaseException] = None
    log: CallLog = field(default_factory=CallLog)

    def decode(self, logits: Tensor, next_n: int, seqLens: Tensor, indices: Tensor, numRows: int, stride0: int,
               stride1: int, k: int = 2048, stable: bool = False) -> None:
        self.log.calls.append(dict(fn="decode", next_n=next_n, seqLens=seqLens.clone(), numRows=numRows,
                                   stride0=stride0, stride1=stride1, k=k, stable=stable))
        if self.fail is not None:
            raise self.fail
        if self.decode_kernel == "tiered":
            return self._tiered_decode(logits, next_n, seqLens, indices, numRows, stride0, stride1, k, stable)
        if numRows <= 0:
            return
        _check_common(logits, indices, numRows, k)
        flat = seqLens.reshape(-1)  # the kernel reads an int pointer: layout is lost
        width, gen = logits.shape[1], _call_gen(numRows, stride0, k)
        for r in range(numRows):
            end = int(flat[r // next_n]) - next_n + r % next_n + 1  # no clamp either way
            if end > width:
                raise KernelPreconditionError(f"row {r}: rowEnd {end} > width {width}: AITER reads past the row")
            vals = _row(logits, stride0, r, max(end, 0))
            indices[r] = _emit(vals, 0, end, k, stable, gen).to(torch.int32)

    def _tiered_decode(self, logits: Tensor, next_n: int, seqLens: Tensor, indices: Tensor, numRows: int,
                       stride0: int, stride1: int, k: int, stable: bool) -> None:
        """The newer decode entry: wrong dtypes are a TypeError, other bad calls a ValueError
        (real AITER raises these too, on the host, before any launch); lengths past the
        width are clamped, not read past."""
        for name, t, want in (("logits", logits, torch.float32), ("seqLens", seqLens, torch.int32),
                              ("indices", indices, torch.int32)):
            if t.dtype is not want:
                raise TypeError(f"{name} must be {want}, got {t.dtype}")
        if len({logits.device, seqLens.device, indices.device}) != 1:
            raise ValueError("logits, seqLens, and indices must be on the same device")
        if logits.ndim != 2 or indices.ndim != 2:
            raise ValueError(f"logits and indices must be 2-D, got {tuple(logits.shape)}, {tuple(indices.shape)}")
        if next_n <= 0:
            raise ValueError(f"next_n must be positive, got {next_n}")
        if numRows < 0 or numRows > logits.shape[0] or numRows > indices.shape[0]:
            raise ValueError(f"numRows={numRows} outside the logits / indices rows")
        if numRows == 0:
            return
        if indices.shape[1] < k or indices.stride(1) != 1:
            raise ValueError(f"indices must be (>= numRows, >= k={k}) with contiguous rows")
        if stride1 != 1 or logits.stride(1) != 1:
            raise ValueError(f"stride1 must be 1, got {stride1} (logits.stride()={logits.stride()})")
        if stride0 != logits.stride(0):
            raise ValueError(f"stride0/stride1 must match logits.stride(); received ({stride0}, {stride1}) "
                             f"for logits.stride()={logits.stride()}")
        if not seqLens.is_contiguous() or seqLens.numel() < math.ceil(numRows / next_n):
            raise ValueError(f"numRows={numRows} with next_n={next_n} needs {math.ceil(numRows / next_n)} "
                             f"contiguous seqLens entries, got {seqLens.numel()}")
        flat = seqLens.reshape(-1)
        width, gen = logits.shape[1], _call_gen(numRows, stride0, k)
        for r in range(numRows):
            end = min(max(int(flat[r // next_n]) - next_n + r % next_n + 1, 0), width)  # clamped here
            vals = _row(logits, stride0, r, end)
            indices[r, :k] = _emit(vals, 0, end, k, stable, gen).to(torch.int32)

    def prefill(self, logits: Tensor, rowStarts: Tensor, rowEnds: Tensor, indices: Tensor, values: Optional[Tensor],
                numRows: int, stride0: int, stride1: int, k: int = 2048, stable: bool = False) -> None:
        self.log.calls.append(dict(fn="prefill", rowStarts=rowStarts.clone(), rowEnds=rowEnds.clone(),
                                   values=values, numRows=numRows, stride0=stride0, stride1=stride1, k=k,
                                   stable=stable))
        if self.fail is not None:
            raise self.fail
        if numRows <= 0:
            return
        _check_common(logits, indices, numRows, k)
        width, gen = logits.shape[1], _call_gen(numRows, stride0, k)
        for r in range(numRows):
            s, e = int(rowStarts[r]), int(rowEnds[r])
            if s < 0 or e > width:
                raise KernelPreconditionError(f"row {r}: window [{s}, {e}) outside [0, {width}]")
            vals = _row(logits, stride0, r, max(e, 0))
            indices[r] = _emit(vals, s, e, k, stable, gen).to(torch.int32)  # chunk-global

    def module(self) -> types.ModuleType:
        """A module object with AITER's two entry points (and their signatures)."""
        mod = types.ModuleType("aiter.ops.topk")
        if self.with_stable:
            mod.top_k_per_row_decode = self.decode
            mod.top_k_per_row_prefill = self.prefill
        else:  # AITER 0.1.19: no `stable` parameter
            def decode(logits: Tensor, next_n: int, seqLens: Tensor, indices: Tensor, numRows: int, stride0: int,
                       stride1: int, k: int = 2048) -> None:
                return self.decode(logits, next_n, seqLens, indices, numRows, stride0, stride1, k)

            def prefill(logits: Tensor, rowStarts: Tensor, rowEnds: Tensor, indices: Tensor,
                        values: Optional[Tensor], numRows: int, stride0: int, stride1: int, k: int = 2048) -> None:
                return self.prefill(logits, rowStarts, rowEnds, indices, values, numRows, stride0, stride1, k)

            mod.top_k_per_row_decode, mod.top_k_per_row_prefill = decode, prefill
        return mod

    def install(self, monkeypatch: "pytest.MonkeyPatch") -> None:
        """Put ``aiter``, ``aiter.ops`` and ``aiter.ops.topk`` doubles into ``sys.modules``, and
        make pip's record say ``amd-aiter`` is installed at :attr:`version`. Like the real
        package, the ``aiter`` module sets no ``__version__``."""
        top, ops = types.ModuleType("aiter"), types.ModuleType("aiter.ops")
        topk = self.module()
        top.ops, ops.topk = ops, topk
        for name, mod in (("aiter", top), ("aiter.ops", ops), ("aiter.ops.topk", topk)):
            monkeypatch.setitem(sys.modules, name, mod)
        real_version = importlib.metadata.version

        def version(name: str) -> str:
            return self.version if name == "amd-aiter" else real_version(name)

        monkeypatch.setattr(importlib.metadata, "version", version)


# vLLM 0.33.0's registered schemas (from the compiled extension's registration strings).
VLLM_SCHEMAS = {
    "top_k_per_row_decode": "(Tensor logits, int next_n, Tensor seq_lens, Tensor! indices, int numRows, "
    "int stride0, int stride1, int topK) -> ()",
    "top_k_per_row_prefill": "(Tensor logits, Tensor rowStarts, Tensor rowEnds, Tensor! indices, "
    "int numRows, int stride0, int stride1, int topK) -> ()",
}
VLLM_DOUBLE_NAMESPACE = "dsa_ops_test_vllm_double"
VLLM_LOG = CallLog()
_vllm_lib: Optional[torch.library.Library] = None


def _vllm_decode(logits: Tensor, next_n: int, seq_lens: Tensor, indices: Tensor, numRows: int, stride0: int,
                 stride1: int, topK: int) -> None:
    VLLM_LOG.calls.append(dict(fn="decode", next_n=next_n, seq_lens=seq_lens.clone(), numRows=numRows,
                               stride0=stride0, stride1=stride1, k=topK))
    if numRows <= 0:
        raise KernelPreconditionError("numRows == 0: the in-tree kernel launches a zero-size grid")
    _check_common(logits, indices, numRows, topK)
    flat, width, gen = seq_lens.reshape(-1), logits.shape[1], _call_gen(numRows, stride0, topK)
    for r in range(numRows):
        if seq_lens.dim() == 2:  # any 2-D seq_lens is read per row
            end = max(0, int(flat[r]))
        else:
            end = max(0, int(flat[r // next_n]) - next_n + r % next_n + 1)
        if end > width:
            raise KernelPreconditionError(f"row {r}: length {end} > width {width}: the kernel reads past the row")
        indices[r] = _emit(_row(logits, stride0, r, end), 0, end, topK, False, gen).to(torch.int32)


def _vllm_prefill(logits: Tensor, rowStarts: Tensor, rowEnds: Tensor, indices: Tensor, numRows: int, stride0: int,
                  stride1: int, topK: int) -> None:
    VLLM_LOG.calls.append(dict(fn="prefill", rowStarts=rowStarts.clone(), rowEnds=rowEnds.clone(),
                               numRows=numRows, stride0=stride0, stride1=stride1, k=topK))
    if numRows <= 0:
        raise KernelPreconditionError("numRows == 0: the in-tree kernel launches a zero-size grid")
    _check_common(logits, indices, numRows, topK)
    width, gen = logits.shape[1], _call_gen(numRows, stride0, topK)
    for r in range(numRows):
        s, e = int(rowStarts[r]), int(rowEnds[r])
        if e < s:
            raise KernelPreconditionError(f"row {r}: end {e} < start {s}: the kernel writes before the row")
        if s < 0 or e > width:
            raise KernelPreconditionError(f"row {r}: window [{s}, {e}) outside [0, {width}]")
        local = _emit(_row(logits, stride0, r, e), s, e, topK, False, gen)
        indices[r] = torch.where(local >= 0, local - s, -1).to(torch.int32)  # row-local


def register_vllm_double() -> str:
    """Define (once per process) ops with vLLM's schemas in a test namespace; return it."""
    global _vllm_lib
    if _vllm_lib is None:
        lib = torch.library.Library(VLLM_DOUBLE_NAMESPACE, "DEF")
        for name, schema in VLLM_SCHEMAS.items():
            lib.define(name + schema)
        lib.impl("top_k_per_row_decode", _vllm_decode, "CompositeExplicitAutograd")
        lib.impl("top_k_per_row_prefill", _vllm_prefill, "CompositeExplicitAutograd")
        _vllm_lib = lib
    return VLLM_DOUBLE_NAMESPACE


# vLLM 0.33.0's CUDA radix top-k kernels (contract §2.3; schemas: vllm-integration-notes §5).
VLLM_RADIX_SCHEMAS = {
    name: "(Tensor logits, Tensor lengths, Tensor! output, Tensor workspace, int k, int max_seq_len) -> ()"
    for name in ("persistent_topk", "cooperative_topk")
}
VLLM_RADIX_DOUBLE_NAMESPACE = "dsa_ops_test_vllm_radix_double"
RADIX_KS = (512, 1024, 2048)
RADIX_ROW_STATE_BYTES = 3088  # sizeof(RadixRowState): 3 x 256 histogram words + 4 scalars
TIE_BYTES = 8  # sizeof(Tie): column + ordered key
COOPERATIVE_MAX_ROWS = 64


@dataclass
class RadixDoubleState:
    """Call log of the persistent / cooperative doubles, and one knob.

    ``unwritten``: how many trailing slots the cooperative double leaves untouched on rows
    with L > k. vLLM 0.33.0 documents that ``cooperative_topk`` may leave slots unwritten
    when its fp16 boundary bin overflows (``candidate_topk.py``); 0 = never.
    """

    log: CallLog = field(default_factory=CallLog)
    unwritten: int = 0


VLLM_RADIX = RadixDoubleState()
_vllm_radix_lib: Optional[torch.library.Library] = None


def _radix_checks(name: str, logits: Tensor, lengths: Tensor, output: Tensor, workspace: Tensor, k: int,
                  workspace_need: int) -> None:
    """The host checks both kernels make, plus the ones they skip but rely on."""
    rows = logits.shape[0] if logits.dim() == 2 else -1
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise KernelPreconditionError(f"{name}: logits must be 2-D float32, got {logits.dtype} {tuple(logits.shape)}")
    if lengths.dtype != torch.int32 or lengths.dim() not in (1, 2) or not lengths.is_contiguous():
        raise KernelPreconditionError(f"{name}: lengths must be contiguous 1-D/2-D int32, got {lengths.dtype} "
                                      f"{tuple(lengths.shape)}")
    if lengths.numel() != rows:
        raise KernelPreconditionError(f"{name}: lengths size mismatch ({lengths.numel()} for {rows} rows; no next_n)")
    if k not in RADIX_KS:
        raise KernelPreconditionError(f"{name} supports k=512, k=1024, or k=2048, got k={k}")
    # The kernels check only the sizes but address row r at output + r * k.
    if output.dtype != torch.int32 or tuple(output.shape) != (rows, k) or not output.is_contiguous():
        raise KernelPreconditionError(f"{name}: output must be contiguous int32 ({rows}, {k}), got "
                                      f"{output.dtype} {tuple(output.shape)}")
    if workspace.dtype != torch.uint8 or workspace.dim() != 1:
        raise KernelPreconditionError(f"{name}: workspace must be 1-D uint8, got {workspace.dtype}")
    if workspace.numel() < workspace_need:
        raise KernelPreconditionError(f"{name}: workspace too small, need {workspace_need} bytes, "
                                      f"have {workspace.numel()}")


def _radix_rows(name: str, logits: Tensor, lengths: Tensor, output: Tensor, k: int, clamp_to: Optional[int],
                unwritten: int, clamp_negative: bool = True) -> None:
    flat, (rows, width) = lengths.reshape(-1), logits.shape
    stride0, gen = int(logits.stride(0)), _call_gen(rows, int(logits.stride(0)), k)
    for r in range(rows):
        end = int(flat[r])
        if end < 0:
            if not clamp_negative:  # read as uint32: about 4e9
                raise KernelPreconditionError(f"row {r}: negative length {end}: {name} reads it as uint32")
            end = 0
        if clamp_to is not None:
            end = min(end, clamp_to)
        if end > width:
            raise KernelPreconditionError(f"row {r}: length {end} > width {width}: {name} reads past the row")
        row = _emit(_row(logits, stride0, r, end), 0, end, k, False, gen).to(torch.int32)
        keep = k - unwritten if end > k else k
        output[r, :keep] = row[:keep]


# sampled_topk's kMinSampledLength (vLLM 0.33.0 csrc/sampled_topk.cuh).
SAMPLED_MIN_LENGTH = {512: 98304, 1024: 65536, 2048: 65536}


def _persistent_topk(logits: Tensor, lengths: Tensor, output: Tensor, workspace: Tensor, k: int,
                     max_seq_len: int) -> None:
    VLLM_RADIX.log.calls.append(dict(fn="persistent", lengths=lengths.clone(), workspace=workspace, k=k,
                                     max_seq_len=max_seq_len, rows=logits.shape[0]))
    rows = logits.shape[0]
    # Up to 32 rows: one RadixRowState per row group (<= rows groups), memset by the
    # kernel. More rows take FilteredTopK (>= 128 KB smem per block), no workspace.
    need = rows * RADIX_ROW_STATE_BYTES if rows <= 32 else 0
    _radix_checks("persistent_topk", logits, lengths, output, workspace, k, need)
    # vLLM 0.33.0 csrc/topk.cu picks the path from rows and max_seq_len: <= 32 rows run
    # persistent_topk_kernel and > 64 rows with max_seq_len >= kMinSampledLength run
    # sampled_topk_kernel, both clamping a length to [0, min(W, max_seq_len)];
    # FilteredTopK (the rest) clamps nothing (a negative length gives an all -1 row).
    sampled = rows > 64 and max_seq_len >= SAMPLED_MIN_LENGTH[k]
    if rows <= 32 or sampled:
        _radix_rows("persistent_topk", logits, lengths, output, k, min(max_seq_len, int(logits.stride(0))), 0)
    else:
        _radix_rows("persistent_topk (FilteredTopK path)", logits, lengths, output, k, None, 0)


def _cooperative_topk(logits: Tensor, lengths: Tensor, output: Tensor, workspace: Tensor, k: int,
                      max_seq_len: int) -> None:
    VLLM_RADIX.log.calls.append(dict(fn="cooperative", lengths=lengths.clone(), workspace=workspace, k=k,
                                     max_seq_len=max_seq_len, rows=logits.shape[0]))
    rows = logits.shape[0]
    if rows > COOPERATIVE_MAX_ROWS:
        raise KernelPreconditionError(f"cooperative_topk supports <={COOPERATIVE_MAX_ROWS} rows, got {rows}")
    if logits.dim() == 2 and logits.stride(0) % 4:
        raise KernelPreconditionError(f"cooperative_topk: stride must be multiple of 4, got {logits.stride(0)}")
    if logits.data_ptr() % 16:  # not checked by the kernel: a misaligned TMA copy faults
        raise KernelPreconditionError("cooperative_topk: logits base address is not 16-byte aligned")
    _radix_checks("cooperative_topk", logits, lengths, output, workspace, k, rows * max(k, 1024) * TIE_BYTES)
    # max_seq_len is unused by this kernel ("kept for signature parity").
    _radix_rows("cooperative_topk", logits, lengths, output, k, None, VLLM_RADIX.unwritten)


def register_vllm_radix_double() -> str:
    """Define (once per process) ops with the radix kernels' schemas in a test namespace."""
    global _vllm_radix_lib
    if _vllm_radix_lib is None:
        lib = torch.library.Library(VLLM_RADIX_DOUBLE_NAMESPACE, "DEF")
        for name, schema in VLLM_RADIX_SCHEMAS.items():
            lib.define(name + schema)
        lib.impl("persistent_topk", _persistent_topk, "CompositeExplicitAutograd")
        lib.impl("cooperative_topk", _cooperative_topk, "CompositeExplicitAutograd")
        _vllm_radix_lib = lib
    return VLLM_RADIX_DOUBLE_NAMESPACE
