"""The Triton kernels' cached workspaces, shared by ``launch.py`` (the sample-pivot kernel)
and ``radix_launch.py`` (the radix kernel), and the device facts both plan from.

One cached allocation per (device, stream, kernel kind), grown to the largest (slots, row
stride) asked for so far and handed out as its first ``slots`` rows (the kernels address
slots with the buffer's own row stride), so a serving process that sees every row count and
chunk width holds one buffer of the largest size, not one per shape. Outside a capture the
buffers are allocated on a helper thread, so they never land in a graph's private pool
(cudagraph trees route a thread's allocations there); a first use *inside* a capture that
the cached buffer cannot serve takes graph-pool temporaries instead.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass
from typing import Callable, TypeVar

import torch

T = TypeVar("T")


@functools.lru_cache(maxsize=None)
def num_sms(device_type: str, index: int) -> int:
    if device_type == "cuda":
        return torch.cuda.get_device_properties(index).multi_processor_count
    return int(os.environ.get("DSA_OPS_TRITON_FAKE_SMS", "8"))  # interpreter: small grids


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


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
    step = max(1, next_pow2(slots) // 16)
    return -(-slots // step) * step


def workspace_bytes() -> int:
    """Bytes held by the workspace cache (current buffers and retired captured ones)."""
    held = [e.value for e in _WORKSPACES.values()] + _RETIRED
    return sum(t.numel() * t.element_size() for value in held for t in value)


def _allocate_outside_pools(device: torch.device, make: Callable[[torch.device], T]) -> T:
    """Run ``make(device)`` (allocations, zeroing) in the ordinary caching pool, on a helper thread.

    Inductor's cudagraph trees route every allocation of the *thread* that warms up or
    records a graph to the graph's pool; a cached workspace living there outlives the
    graph's outputs and is rejected ("tensors in the cudagraph pool not tracked as
    outputs"). Another thread's allocations are not routed. Never called during a capture.
    """
    if device.type != "cuda":
        return make(device)
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
