"""Timing helpers shared by ``dsa-ops bench`` and later end-to-end benches / ``calibrate``.

* :func:`time_graph` - capture one call in a CUDA graph, then time each replay with CUDA
  events, writing ``flush_bytes`` (default 256 MiB, several times the H200's 60 MB L2)
  before every replay so each one starts with a cold L2. This is how decode is measured.
* :func:`time_eager` - plain calls timed with CUDA events (prefill), optional flush.

Both return a :class:`Timing` of per-call microseconds; the median is the headline.
Everything here needs a CUDA device; callers check ``torch.cuda.is_available()`` first.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

FLUSH_BYTES = 256 << 20


@dataclass
class Timing:
    """Per-call times in microseconds, in measurement order."""

    us: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.us) if self.us else float("nan")

    def quantile(self, q: float) -> float:
        """The q-quantile (0..1) by nearest rank; nan when empty."""
        if not self.us:
            return float("nan")
        s = sorted(self.us)
        return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]

    def summary(self) -> dict:
        return {"median_us": self.median, "p10_us": self.quantile(0.1), "p90_us": self.quantile(0.9), "n": len(self.us)}


_FLUSH: dict[tuple, torch.Tensor] = {}


def flush_buffer(device: torch.device, nbytes: int = FLUSH_BYTES) -> torch.Tensor:
    """A cached int32 buffer whose ``fill_`` writes ``nbytes`` (evicts the L2)."""
    key = (device.type, device.index, nbytes)
    if key not in _FLUSH:
        _FLUSH[key] = torch.empty(nbytes // 4, dtype=torch.int32, device=device)
    return _FLUSH[key]


def capture(fn: Callable[[], object], warmup: int = 2) -> torch.cuda.CUDAGraph:
    """Warm ``fn`` up on a side stream (compiles kernels, fills per-stream caches such as a
    backend's workspace), then capture one call on that same stream, so the graph holds the
    call itself and no first-use allocation or memset."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        fn()
    torch.cuda.synchronize()
    return graph


def _timed(step: Callable[[], None], reps: int, warmup: int, flush: Optional[torch.Tensor]) -> Timing:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(warmup + reps):
        if flush is not None:
            flush.fill_(i)
        j = i - warmup
        if j >= 0:
            starts[j].record()
        step()
        if j >= 0:
            ends[j].record()
    torch.cuda.synchronize()
    return Timing([s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)])


def time_graph(fn: Callable[[], object], reps: int = 30, warmup: int = 3, flush: bool = True,
               graph: Optional[torch.cuda.CUDAGraph] = None) -> Timing:
    """Median-ready replay times of one captured call of ``fn`` (L2 flushed before each replay).

    Pass ``graph`` to time an existing capture (its inputs may be edited between calls).
    """
    g = graph if graph is not None else capture(fn)
    buf = flush_buffer(torch.device("cuda", torch.cuda.current_device())) if flush else None
    return _timed(g.replay, reps, warmup, buf)


def time_eager(fn: Callable[[], object], reps: int = 10, warmup: int = 2, flush: bool = False) -> Timing:
    """Times of plain calls of ``fn`` (kernel launch and host overhead included)."""
    buf = flush_buffer(torch.device("cuda", torch.cuda.current_device())) if flush else None
    return _timed(lambda: fn(), reps, warmup, buf)
