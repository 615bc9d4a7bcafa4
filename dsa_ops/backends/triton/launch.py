"""Host side of the ``triton`` backend: launch plan, workspace and the two writers.

Graph safety: the plan (grid, slices, buffer capacity) depends only on host ints (R, W, k)
and the device's multiprocessor count; nothing here reads device data or synchronises.

Workspace: one cached allocation per (device, stream, kernel), grown to the largest
(slots, row stride) asked for so far and handed out as its first ``slots`` rows (the
kernels address slots with the buffer's own row stride), so a serving process that sees
every row count and chunk width holds one buffer of the largest size, not one per shape
(see ``cached_workspace``). ``cnt`` (int64 counters) must be zero before a launch; it is
zeroed when allocated and every launch restores it (the last program of each row writes
the zeros back), so replays of a captured graph need no memset. ``ws`` (int32 buffers)
needs no initial value. Outside a capture they are allocated on a helper thread, so they
never land in a graph's private pool (cudagraph trees route a thread's allocations there).
A first use *inside* a capture that the cached buffer cannot serve takes graph-pool
temporaries instead (cnt's memset is then part of that graph). Both paths serve manual
capture and ``torch.compile(mode="reduce-overhead")``.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Callable, TypeVar

import torch
from torch import Tensor

T = TypeVar("T")

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


@functools.lru_cache(maxsize=None)
def _num_sms(device_type: str, index: int) -> int:
    if device_type == "cuda":
        return torch.cuda.get_device_properties(index).multi_processor_count
    return int(os.environ.get("DSA_OPS_TRITON_FAKE_SMS", "8"))  # interpreter: small grids


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def plan(rows: int, width: int, k: int, device: torch.device, slices: int | None = None,
         cap: int | None = None, count: bool | None = None) -> Plan:
    """Pick split or row mode: about two programs per multiprocessor in either case.

    ``slices``, ``cap`` and ``count`` override the programs per row, the mid-buffer size and
    in-stream bucket counting (tests and tuning use them to reach every path).
    """
    sms = _num_sms(device.type, device.index or 0)
    target = 2 * sms
    if slices is None:
        slices = max(1, min(-(-width // BLOCK), target // max(rows, 1), MAX_SLICES))
    if cap is None:
        cap = max(k, min(width, max(CAP_MIN, min(CAP_MAX, _next_pow2(width) // 2))))
    if slices <= 1:
        return Plan(grid0=max(1, min(rows, target)), slices=1, split=False, count=False, cap=cap)
    return Plan(grid0=rows, slices=slices, split=True, count=slices >= 8 if count is None else count, cap=cap)


@dataclass
class _Entry:
    slots: int
    stride: int
    value: tuple  # tensors of shape (slots, ...)
    captured: bool = False  # handed out inside a capture: a graph may replay it, never free it


_WORKSPACES: dict[tuple, _Entry] = {}  # (device type, index, stream, kernel) -> the grown buffer
_RETIRED: list[tuple] = []  # outgrown buffers that a captured graph may still use (kept alive)


def cached_workspace(device: torch.device, kind: str, slots: int, stride: int,
                     make: Callable[[torch.device, int, int], tuple]) -> tuple:
    """``make(device, S, T)``'s tensors (each of first dimension S, rows of stride T) with
    S >= ``slots`` and T >= ``stride``, cut to their first ``slots`` rows; one buffer per
    (device, current stream, ``kind``).

    A request the cached buffer cannot hold replaces it (outside a capture) by one of
    max(:func:`_round_slots` (slots), cached slots) x max(stride, cached stride), so the
    cache holds at most 1/8 more than the largest slots times the largest stride asked
    for, whatever sequence of shapes comes, after a bounded number of replacements.
    The outgrown buffer is freed once the stream's queued work is done with it, unless it
    was handed out inside a capture: a graph's kernels hold its address, so it is kept.
    A request inside a capture that the cache cannot hold takes uncached ``make`` results:
    temporaries from this graph's pool, living as long as the graph.
    """
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    full = (device.type, device.index, 0 if stream is None else stream.cuda_stream, kind)
    hit = _WORKSPACES.get(full)
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if hit is not None and hit.slots >= slots and hit.stride >= stride:
        hit.captured = hit.captured or capturing
        return tuple(t[:slots] for t in hit.value)
    if capturing:
        return make(device, slots, stride)
    grown_slots = max(_round_slots(slots), hit.slots if hit else 0)
    grown_stride = max(stride, hit.stride if hit else 0)
    value = _allocate_outside_pools(device, lambda dev: make(dev, grown_slots, grown_stride))
    if hit is not None:
        if hit.captured:
            _RETIRED.append(hit.value)
        elif stream is not None:
            for t in hit.value:  # the allocator reuses the memory only after this stream's queued kernels
                t.record_stream(stream)
    _WORKSPACES[full] = _Entry(grown_slots, grown_stride, value)
    return tuple(t[:slots] for t in value)


def _round_slots(slots: int) -> int:
    """Slots rounded up to a multiple of a sixteenth of their power of two (at most 1/8 more;
    a sweep of every row count then replaces the buffer at most 8 times per doubling)."""
    step = max(1, _next_pow2(slots) // 16)
    return -(-slots // step) * step


def workspace_bytes() -> int:
    """Bytes held by the workspace cache (current buffers and retired captured ones)."""
    held = [e.value for e in _WORKSPACES.values()] + _RETIRED
    return sum(t.numel() * t.element_size() for value in held for t in value)


def workspace(device: torch.device, slots: int, ws_stride: int) -> tuple[Tensor, Tensor]:
    """(ws int32 (slots, >= ws_stride), cnt int64 (slots, CNT_STRIDE) zeros), cached per stream."""
    def make(dev: torch.device, n: int, stride: int) -> tuple[Tensor, Tensor]:
        return (torch.empty((n, stride), dtype=torch.int32, device=dev),
                torch.zeros((n, CNT_STRIDE), dtype=torch.int64, device=dev))

    return cached_workspace(device, "pivot", slots, ws_stride, make)


def _allocate_outside_pools(device: torch.device, make: Callable[[torch.device], T]) -> T:
    """Run ``make(device)`` (allocations, zeroing) in the ordinary caching pool, on a helper thread.

    Inductor's cudagraph trees route every allocation of the *thread* that warms up or
    records a graph to the graph's pool; a cached workspace living there outlives the
    graph's outputs and is rejected ("tensors in the cudagraph pool not tracked as
    outputs"). Another thread's allocations are not routed. Never called during a capture.
    """
    if device.type != "cuda":
        return make(device)
    import threading

    box: list = []

    def alloc() -> None:
        with torch.cuda.device(device):
            made = make(device)
            torch.cuda.current_stream(device).synchronize()  # zeros land before any launch
            box.append(made)

    t = threading.Thread(target=alloc, name="dsa_ops-workspace")
    t.start()
    t.join()
    if not box:
        raise RuntimeError("dsa_ops triton backend: workspace allocation failed on the helper thread")
    return box[0]


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
    from dsa_ops.backends.triton import radix_launch

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
        from dsa_ops.backends.triton import radix_launch

        radix_launch.launch(logits, row_starts, row_starts, row_ends, k, 1, True, False, out)
