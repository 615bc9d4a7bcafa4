"""The whole pipeline under FULL CUDA-graph capture: a 21-layer indexer decode step,
compiled with IndexerTopKPass, captured once, replayed with new lengths and checked.

Used by the GPU test ``tests/test_e2e_cuda_graph.py`` and by ``dsa-ops bench --e2e``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import torch
from torch import Tensor

from dsa_ops import policy as P
from dsa_ops.benchmarking import time_graph
from dsa_ops.indexer import DecodeStep, indexer_logits
from dsa_ops.testing import POISON, assert_decode_equivalent

GLM52_INDEXER_LAYERS = 21


@dataclass
class Setup:
    step: DecodeStep
    hidden: Tensor  # (B, hidden)
    k_cache: Tensor  # (B, W, dim)
    lengths: Tensor  # (B,) int32, the static input the graph reads
    k: int

    def layer_logits(self) -> list[Tensor]:
        """Each layer's fp32 logits for the current hidden / k_cache (for checking)."""
        s = self.step
        with torch.no_grad():
            return [indexer_logits(qp(self.hidden).view(-1, s.heads, s.dim), self.k_cache, wp(self.hidden))
                    for qp, wp in zip(s.q_proj, s.w_proj)]


def build(batch: int, width: int, *, layers: int = GLM52_INDEXER_LAYERS, heads: int = 8, dim: int = 64,
          hidden: int = 256, k: int = 2048, backend: Optional[str] = None, device: str = "cuda",
          dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> Setup:
    """A decode step with bf16 index queries / keys and its static inputs."""
    torch.manual_seed(seed)
    step = DecodeStep(layers, hidden, heads, dim, k=k, backend=backend, dtype=dtype).to(device).eval()
    g = torch.Generator(device="cpu").manual_seed(seed)
    h = torch.randn(batch, hidden, generator=g).to(device, dtype)
    kc = torch.randn(batch, width, dim, generator=g).to(device, dtype)
    lengths = torch.full((batch,), width, dtype=torch.int32, device=device)
    return Setup(step, h, kc, lengths, k)


def random_lengths(batch: int, width: int, k: int, gen: torch.Generator) -> Tensor:
    """Fresh lengths on the CPU: uniform in [0, W], with 0 (padded row) and L < k mixed in."""
    lengths = torch.randint(0, width + 1, (batch,), generator=gen, dtype=torch.int32)
    pick = torch.randint(0, 4, (batch,), generator=gen)
    lengths[pick == 0] = 0
    small = torch.randint(1, max(2, min(k, width)), (batch,), generator=gen, dtype=torch.int32)
    lengths[pick == 1] = small[pick == 1]
    return lengths


@contextlib.contextmanager
def compiled(setup: Setup, policy: Optional[P.Policy], mode: Optional[str] = None,
             use_pass: bool = True) -> Iterator[tuple[Callable[[], Tensor], list]]:
    """Compile the step (inductor, fullgraph) with or without the pass; yields (call, rewrites)."""
    import passes  # loads Inductor (about a second): only when a step is compiled
    from torch._inductor import config as inductor_config

    torch._dynamo.reset()
    pass_cm = passes.install(policy) if use_pass else contextlib.nullcontext(None)
    with pass_cm as pass_, inductor_config.patch(fx_graph_cache=False), torch.no_grad():
        fn = torch.compile(setup.step, fullgraph=True, mode=mode)
        fn(setup.hidden, setup.k_cache, setup.lengths)  # compile now, inside the pass's scope
        yield (lambda: fn(setup.hidden, setup.k_cache, setup.lengths)), (pass_.rewrites if pass_ else [])


def capture(call: Callable[[], Tensor], warmup: int = 3) -> tuple[torch.cuda.CUDAGraph, Tensor]:
    """Capture ``call`` as one CUDA graph; returns the graph and its static output."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(warmup):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = call()
    return graph, out


@dataclass
class ReplayReport:
    replays: int
    mismatches: int
    first_error: str = ""


def replay_and_check(setup: Setup, graph: torch.cuda.CUDAGraph, out: Tensor, replays: int, seed: int = 0,
                     refresh_every: int = 100) -> ReplayReport:
    """Replay with fresh random lengths, poisoning the static output before each replay,
    and check every layer of every replay against the reference. Every ``refresh_every``
    replays the key cache gets new random data too."""
    gen = torch.Generator().manual_seed(seed)
    batch, width = setup.k_cache.shape[:2]
    logits = setup.layer_logits()
    bad, first = 0, ""
    for i in range(replays):
        if i and i % refresh_every == 0:
            setup.k_cache.copy_(torch.randn(setup.k_cache.shape, generator=gen).to(setup.k_cache))
            logits = setup.layer_logits()
        setup.lengths.copy_(random_lengths(batch, width, setup.k, gen))
        out.fill_(POISON)
        graph.replay()
        try:
            for layer, lg in enumerate(logits):
                assert_decode_equivalent(out[layer], lg, setup.lengths, setup.k)
        except AssertionError as exc:
            bad += 1
            first = first or f"replay {i}, layer {layer}: {exc}"
    torch.cuda.synchronize()
    return ReplayReport(replays, bad, first)


def count_kernels(call: Callable[[], Tensor]) -> int:
    """GPU kernels one call launches (profiled outside any graph; memcpy/memset excluded)."""
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(1 for n in names if "memcpy" not in n.lower() and "memset" not in n.lower())


def decode_policy(backend: str) -> P.Policy:
    """A policy that sends every decode node to ``backend`` (for per-backend e2e timings)."""
    return P.Policy(decode=(P.Rule(backend, f"e2e: force {backend}"),), prefill=P.DEFAULT.prefill)


__all__ = ["Setup", "build", "bench_e2e", "compiled", "capture", "replay_and_check", "count_kernels", "random_lengths",
           "decode_policy", "ReplayReport", "GLM52_INDEXER_LAYERS"]


E2E_CONTEXTS = (4096, 32768, 131072)
E2E_BATCHES = (1, 8, 16)


def bench_e2e(backends: list[str], contexts=E2E_CONTEXTS, batches=E2E_BATCHES, reps: int = 30,
              progress: Optional[Callable[[int, int, str], None]] = None) -> list[dict]:
    """Per-step time of the captured 21-layer step with each decode backend.

    One compile per backend (dynamic shapes, pass installed), then one capture per
    (context, batch). The width equals the context and every row's length is the context,
    so the top-k does the full work. Each result row holds the median replay time (L2
    flushed before each replay), the kernels one step launches, and the mismatch count of
    two checked replays with random lengths.
    """
    import passes  # loads Inductor (about a second): only when a step is compiled
    from torch._inductor import config as inductor_config

    rows, n, i = [], len(backends) * len(contexts) * len(batches), 0
    for name in backends:
        base = build(1, contexts[0])
        torch._dynamo.reset()
        with passes.install(decode_policy(name)) as pass_, inductor_config.patch(fx_graph_cache=False), \
                torch.no_grad():
            fn = torch.compile(base.step, fullgraph=True, dynamic=True)
            for ctx in contexts:
                for batch in batches:
                    i += 1
                    if progress:
                        progress(i, n, f"e2e {name} context={ctx} batch={batch}")
                    shaped = build(batch, ctx)
                    setup = Setup(base.step, shaped.hidden, shaped.k_cache, shaped.lengths, base.k)
                    call = lambda: fn(setup.hidden, setup.k_cache, setup.lengths)  # noqa: E731
                    kernels = count_kernels(call)
                    graph, out = capture(call)
                    check = replay_and_check(setup, graph, out, replays=2)
                    setup.lengths.fill_(ctx)
                    t = time_graph(call, reps=reps, graph=graph)
                    rows.append({"backend": name, "routed_to": sorted({r.backend for r in pass_.rewrites}),
                                 "context": ctx, "batch": batch, "layers": len(base.step.q_proj),
                                 "step_us": round(t.median, 1), "p10_us": round(t.quantile(0.1), 1),
                                 "p90_us": round(t.quantile(0.9), 1), "kernels": kernels,
                                 "mismatches": check.mismatches})
                    setup = shaped = graph = out = None  # free before the next shape
                    torch.cuda.empty_cache()
    return rows
