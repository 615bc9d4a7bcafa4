"""Run a small DSA-indexer decode step eagerly and under torch.compile(fullgraph=True),
check every layer's top-k against the reference, and print what happened."""

from __future__ import annotations

import argparse
import time

import torch

import dsa_ops
from dsa_ops.commands import checks
from dsa_ops.indexer import DecodeStep, indexer_logits, random_inputs
from dsa_ops.testing import assert_decode_equivalent

HELP = "run a small indexer decode step eagerly and compiled, checked against the reference"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--batch", type=int, default=4, help="decode requests (default: 4)")
    p.add_argument("--width", type=int, default=8192, help="cached tokens per request, W (default: 8192)")
    p.add_argument("--layers", type=int, default=2, help="indexer layers in the step (default: 2)")
    p.add_argument("--k", type=int, default=2048, help="top-k (default: 2048)")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default: inductor)")
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs and the random lengths (default: 0)")


def _lengths(batch: int, width: int, k: int, seed: int, device: str) -> torch.Tensor:
    """Edge cases first (0, < k, = k, = W; the first three at most W), then random lengths."""
    fixed = [0, min(k // 2, width), min(k, width), width]
    g = torch.Generator().manual_seed(seed)
    rand = torch.randint(0, width + 1, (max(0, batch - len(fixed)),), generator=g).tolist()
    return torch.tensor((fixed + rand)[:batch], dtype=torch.int32, device=device)


HIDDEN, HEADS, DIM = 64, 4, 32


def build_step(device: str, batch: int, width: int, layers: int, k: int, seed: int, rows_option: str = "batch"):
    """The demo's decode step and its example inputs (hidden, k_cache, lengths). Inputs too big
    for ``device`` are a :class:`checks.UsageError` naming ``--<rows_option>`` and ``--width``."""
    torch.manual_seed(seed)
    step = DecodeStep(layers, HIDDEN, HEADS, DIM, k=k).to(device).eval()
    try:
        h, kc = random_inputs(batch, width, HIDDEN, DIM, device=device, seed=seed)
    except RuntimeError as exc:  # torch.OutOfMemoryError, or the CPU allocator's "can't allocate memory"
        if not isinstance(exc, torch.OutOfMemoryError) and "allocate" not in str(exc):
            raise
        gib = batch * width * DIM * 4 / 2**30
        raise checks.UsageError(f"--{rows_option} {batch} x --width {width}: the step's key cache ({batch} x {width} "
                                f"x {DIM} fp32, {gib:.1f} GiB) does not fit on {device}; use a smaller "
                                f"--{rows_option} or --width") from None
    return step, (h, kc, _lengths(batch, width, k, seed, device))


def run(args: argparse.Namespace) -> int:
    import passes
    from torch._inductor import config as inductor_config

    checks.device(args.device)
    for option, low in (("batch", 1), ("width", 1), ("layers", 1)):
        checks.at_least(option, getattr(args, option), low)
    checks.top_k(args.k)
    checks.compile_backend(args.compile_backend)
    pol = checks.policy(None)
    step, (h, kc, lengths) = build_step(args.device, args.batch, args.width, args.layers, args.k, args.seed)
    print(f"dsa-ops {dsa_ops.__version__} demo on {args.device}: {args.layers} indexer layers, "
          f"batch {args.batch}, W={args.width}, k={args.k}")
    print(f"  lengths: {lengths.tolist()}")

    def check(name: str, got: torch.Tensor, lengths: torch.Tensor) -> None:
        with torch.no_grad():
            for layer, (qp, wp) in enumerate(zip(step.q_proj, step.w_proj)):
                logits = indexer_logits(qp(h).view(args.batch, HEADS, DIM), kc, wp(h))
                assert_decode_equivalent(got[layer], logits, lengths, args.k)
        valid = (got[0] >= 0).sum(dim=1).tolist()
        print(f"  {name}: matches the reference on all {args.layers} layers; valid slots per row {valid}")

    with torch.no_grad():
        t0 = time.perf_counter()
        eager = step(h, kc, lengths)
        print(f"eager     {1e3 * (time.perf_counter() - t0):8.1f} ms")
        check("eager", eager, lengths)
        # The pass travels in the compile options, so a recompile keeps it; fx_graph_cache
        # off so the pass visibly runs (a cache hit would skip it).
        pass_ = passes.IndexerTopKPass(pol)
        opts = passes.inductor_options(pass_=pass_) if args.compile_backend == "inductor" else None
        with inductor_config.patch(fx_graph_cache=False):
            compiled = torch.compile(step, fullgraph=True, backend=args.compile_backend, options=opts)
            t0 = time.perf_counter()
            try:
                got = compiled(h, kc, lengths)
            except ImportError as exc:  # a registered backend whose package is missing
                raise checks.UsageError(f"--compile-backend {args.compile_backend}: its package does not "
                                        f"import here ({exc})") from None
            print(f"compiled  {1e3 * (time.perf_counter() - t0):8.1f} ms (first call: {args.compile_backend} compile)")
        if args.compile_backend == "inductor":
            print(f"  IndexerTopKPass rewrote {pass_.count} generic dsa_ops::topk_decode node(s):")
            for rw in pass_.rewrites:
                print(f"    {rw.node} -> dsa_ops::topk_decode_{rw.backend}  ({rw.reason})")
        else:
            print(f"  (the pass runs in Inductor's post-grad pipeline; backend {args.compile_backend!r} kept the "
                  f"generic op, whose kernel is the reference)")
        check("compiled", got, lengths)
        lengths = lengths.flip(0).contiguous()
        check("compiled, new lengths", compiled(h, kc, lengths), lengths)
    print("demo OK")
    return 0
