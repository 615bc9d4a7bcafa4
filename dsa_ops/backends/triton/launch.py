"""Host side of the ``triton`` backend: launch plan, workspace and the two writers.

Graph safety: the plan (grid, slices, buffer capacity) depends only on host ints (R, W, k)
and the device's multiprocessor count; nothing here reads device data or synchronises.

Workspace: one cached allocation per (device, stream, kernel), grown to the largest
(slots, row stride) asked for so far and handed out as its first ``slots`` rows (the
kernels address slots with the buffer's own row stride), so a serving process that sees
every row count and chunk width holds one buffer of the largest size, not one per shape
(see :func:`~dsa_ops.backends.triton.workspace.cached_workspace`). ``cnt`` (int64 counters) must be zero before a launch; it is
zeroed when allocated and every launch restores it (the last program of each row writes
the zeros back), so replays of a captured graph need no memset. ``ws`` (int32 buffers)
needs no initial value. Outside a capture they are allocated on a helper thread, so they
never land in a graph's private pool (cudagraph trees route a thread's allocations there).
A first use *inside* a capture that the cached buffer cannot serve takes graph-pool
temporaries instead (cnt's memset is then part of that graph). Both paths serve manual
capture and ``torch.compile(mode="reduce-overhead")``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dsa_ops.backends.triton import radix_launch
from dsa_ops.backends.triton.workspace import cached_workspace, next_pow2, num_sms

NS = 128  # row sample size (an NS x NS compare per program)
MF = 128  # final exact-rank size and level sample size
CH = 32  # rank column chunk: (NS, CH) compares at a time
BLOCK = 4096  # streaming block (columns per iteration of a slice; 32 KB in flight with the prefetch)
BC = 512  # block of the 2-D passes: splitter counts and the fallback radix ((BC, 16) compares)
BS = 1024  # block of the 1-D passes over buffers and rows (split, copy, ordered emission)
NUM_WARPS = 8
MAXNREG = 128  # two programs per multiprocessor (ptxas wants ~175 otherwise; spills ~24 bytes)
MAX_SLICES = 64  # per row: more programs only add same-address atomics
CAP_MIN, CAP_MAX = 4096, 65536  # mid-buffer entries per slot (W/2, bounded; W/8 overflowed on 19 % of prefill rows)
CNT_STRIDE = 32  # int64 counters per slot: win, mid, tie, arrivals, 16 splitter counts; [31] fallbacks


@dataclass(frozen=True)
class Plan:
    """Launch shape for (R, W, k) on one device. Host ints only."""

    grid0: int  # R in split mode; persistent row programs otherwise
    slices: int  # programs per row (1 = row mode)
    split: bool
    count: bool  # streaming programs count splitter buckets (pays off with many slices)
    cap: int  # mid-buffer entries per slot

    @property
    def ws_stride(self) -> int:
        return 4 * self.cap


def plan(rows: int, width: int, k: int, device: torch.device, slices: int | None = None,
         cap: int | None = None, count: bool | None = None) -> Plan:
    """Pick split or row mode: about two programs per multiprocessor in either case.

    ``slices``, ``cap`` and ``count`` override the programs per row, the mid-buffer size and
    in-stream bucket counting (tests and tuning use them to reach every path).
    """
    sms = num_sms(device.type, device.index or 0)
    target = 2 * sms
    if slices is None:
        slices = max(1, min(-(-width // BLOCK), target // max(rows, 1), MAX_SLICES))
    if cap is None:
        cap = max(k, min(width, max(CAP_MIN, min(CAP_MAX, next_pow2(width) // 2))))
    if slices <= 1:
        return Plan(grid0=max(1, min(rows, target)), slices=1, split=False, count=False, cap=cap)
    return Plan(grid0=rows, slices=slices, split=True, count=slices >= 8 if count is None else count, cap=cap)


def workspace(device: torch.device, slots: int, ws_stride: int) -> tuple[Tensor, Tensor]:
    """(ws int32 (slots, >= ws_stride), cnt int64 (slots, CNT_STRIDE) zeros), cached per stream."""
    def make(dev: torch.device, n: int, stride: int) -> tuple[Tensor, Tensor]:
        return (torch.empty((n, stride), dtype=torch.int32, device=dev),
                torch.zeros((n, CNT_STRIDE), dtype=torch.int64, device=dev))

    return cached_workspace(device, "pivot", slots, ws_stride, make)


def launch(logits: Tensor, lens: Tensor, starts: Tensor, ends: Tensor, k: int, next_n: int,
           is_prefill: bool, stable: bool, out: Tensor, slices: int | None = None,
           cap: int | None = None, count: bool | None = None, dbg: int = 0) -> None:
    """Fill ``out`` (R, k) int32; see :mod:`dsa_ops.backends.triton.kernels`."""
    from dsa_ops.backends.triton.kernels import topk_kernel

    rows, width = logits.shape
    if rows == 0:
        return
    p = plan(rows, width, k, logits.device, slices, cap, count)
    ws, cnt = workspace(logits.device, p.grid0, p.ws_stride + k + 16)  # + tie columns, splitters
    topk_kernel[(p.grid0, p.slices)](
        logits, logits.stride(0), lens, starts, ends, out, ws, cnt,
        rows, width, k, next_n, p.slices, int(is_prefill), int(p.split), int(p.count), int(stable),
        p.cap, ws.stride(0), dbg,
        NS=NS, MF=MF, CH=CH, BLOCK=BLOCK, BC=BC, BS=BS, num_warps=NUM_WARPS,
        **({} if logits.device.type == "cpu" else {"maxnreg": MAXNREG}),
    )


def decode(logits: Tensor, lengths: Tensor, k: int, next_n: int, stable: bool, out: Tensor) -> None:
    """Decode writer: per-row lengths when numel == R, else per-request with ``next_n``.
    Runs the cooperative radix kernel (``radix_launch``)."""
    per_row = lengths.numel() == logits.shape[0]
    flat = lengths.reshape(-1)
    radix_launch.launch(logits, flat, flat, flat, k, 1 if per_row else next_n, False, stable, out)


def prefill(logits: Tensor, row_starts: Tensor, row_ends: Tensor, k: int, stable: bool, out: Tensor) -> None:
    """Prefill writer: window [clamp(s), clamp(e)), sequence-local indices. Non-stable: the
    radix kernel in row mode (one program per row; 21.4 vs 24.4 ms at C = 128K on the H200);
    stable: the sample-pivot kernel (the radix kernel's stable prefill is not measured)."""
    if stable:
        launch(logits, row_starts, row_starts, row_ends, k, 1, True, True, out)
    else:
        radix_launch.launch(logits, row_starts, row_starts, row_ends, k, 1, True, False, out)
