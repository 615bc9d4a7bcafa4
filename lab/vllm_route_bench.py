"""Host cost per call of the eager route (``passes.vllm_route``) against vLLM's stock call.

Run in the vLLM venv: ``python -m lab.vllm_route_bench [--iters N]``, on CPU; it
measures host work, not kernels: every top-k kernel is a no-op here (vLLM's
``torch.ops._C.top_k_per_row_*`` are defined as no-ops when vLLM's CUDA build is absent,
and dsa-ops calls a test-only no-op backend), so what is left is Python, dispatch and
checks. Each row is the median over 7 repeats of ``iters`` calls, in microseconds per call.

``--cuda`` (on a GPU machine, no vLLM needed): the routed call itself (``route_decode`` /
``route_prefill``, what the seams run) against ``dsa_ops.topk_*`` and the backend's launch,
host time on a short row and device time on DSA shapes. vLLM's stock kernels are not part of
it: they need vLLM's CUDA build.
"""

from __future__ import annotations

import argparse
import statistics
import timeit

import torch

from dsa_ops import policy as P
from dsa_ops.backends import BACKENDS, register
from dsa_ops.backends.base import YES, Backend

NOOP = "route_bench_noop"
K = 2048


def _setup() -> None:
    if not hasattr(torch.ops._C, "top_k_per_row_decode"):
        lib = torch.library.Library("_C", "FRAGMENT")
        for name, args in (("top_k_per_row_decode", "Tensor logits, int next_n, Tensor seq_lens"),
                           ("top_k_per_row_prefill", "Tensor logits, Tensor row_starts, Tensor row_ends")):
            lib.define(f"{name}({args}, Tensor(a!) out, int num_rows, int stride0, int stride1, int k) -> ()")
            lib.impl(name, lambda *a: None, "CompositeExplicitAutograd")
        _setup.lib = lib  # type: ignore[attr-defined]
    if NOOP not in BACKENDS:
        register(Backend(NOOP, lambda *a: None, lambda *a: None, lambda: YES, lambda q: YES, lambda: "noop",
                         description="no-op (host-cost measurement)", test_only=True))


def _time(fn, iters: int) -> float:
    fn()
    runs = timeit.repeat(fn, number=iters, repeat=7)
    return statistics.median(runs) / iters * 1e6


def measure(iters: int = 20000) -> list[tuple[str, float]]:
    from vllm import _custom_ops
    from vllm.model_executor.layers import sparse_attn_indexer as sai

    from dsa_ops import api, ops
    from passes import vllm_route

    _setup()
    policy = P.Policy(decode=(P.Rule(NOOP),), prefill=(P.Rule(NOOP),), name="bench-noop")
    logits = torch.randn(4, 4096)
    seq_lens = torch.tensor([[2999, 3000], [899, 900]], dtype=torch.int32)
    out = torch.empty(4, K, dtype=torch.int32)
    p_logits = torch.randn(5, 2600)
    starts = torch.zeros(5, dtype=torch.int32)
    ends = torch.tensor([2598, 2599, 2600, 999, 1000], dtype=torch.int32)
    p_out = torch.empty(5, K, dtype=torch.int32)
    flat = seq_lens.reshape(-1)
    rows: list[tuple[str, float]] = []
    vllm_route.uninstall()
    stock_decode = sai.get_indexer_topk("auto")
    rows.append(("decode, stock: get_indexer_topk('auto')(...) -> per_row op",
                 _time(lambda: sai.get_indexer_topk("auto")(logits, seq_lens, 2, out, K, 3000), iters)))
    rows.append(("prefill, stock: _custom_ops.top_k_per_row_prefill(...)",
                 _time(lambda: _custom_ops.top_k_per_row_prefill(p_logits, starts, ends, p_out, 5, 2600, 1, K), iters)))
    assert vllm_route.install("cuda")
    try:
        with P.use(policy):
            routed = sai.get_indexer_topk(vllm_route.MARK)
            rows.append(("decode, routed: get_indexer_topk(MARK)(...) -> dsa_ops.topk_decode",
                         _time(lambda: sai.get_indexer_topk(vllm_route.MARK)(logits, seq_lens, 2, out, K, 3000),
                               iters)))
            rows.append(("prefill, routed: route_prefill(...) -> dsa_ops.topk_prefill (without the caller-frame check)",
                         _time(lambda: vllm_route.route_prefill(p_logits, starts, ends, p_out, K, 2600), iters)))
            op = ops.backend_op(NOOP, "decode", out=True)
            rows.append(("decode, the dsa-ops backend op through the dispatcher (for comparison)",
                         _time(lambda: op(logits, flat, K, 1, 1, False, out), iters)))
            rows.append(("decode, dsa_ops.topk_decode(..., out=) called directly",
                         _time(lambda: api.topk_decode(logits, flat, K, out=out), iters)))
            rows.append(("dsa_ops.policy.current() alone", _time(P.current, iters)))
    finally:
        vllm_route.uninstall()
    assert routed is not stock_decode
    return rows


def _frame_cost(iters: int) -> float:
    """The prefill seam's caller-frame check: ``sys._getframe(1).f_locals`` from a
    function with as many locals as vLLM's ``sparse_attn_indexer``."""
    import sys

    from vllm.model_executor.layers import sparse_attn_indexer as sai
    from passes.vllm_route import _inner

    n = _inner(sai.sparse_attn_indexer).__code__.co_nlocals
    src = "def caller():\n" + "".join(f"    v{i} = {i}\n" for i in range(n)) + "    return probe()\n"

    def probe():
        return sys._getframe(1).f_locals.get("v0")

    ns = {"probe": probe}
    exec(src, ns)  # noqa: S102  (a generated function with n locals, nothing else)
    empty = {"probe": lambda: None}
    exec(src, empty)  # noqa: S102
    return _time(ns["caller"], iters) - _time(empty["caller"], iters)


def measure_cuda(iters: int) -> list[tuple[str, float]]:
    """On a CUDA device, without vLLM: the routed call (``route_decode`` / ``route_prefill``,
    what the seams call) against ``dsa_ops.topk_decode`` / ``topk_prefill`` and the policy
    backend's writer called directly. Host: back-to-back calls on a short row (the loop is
    bound by the host). Device: CUDA-event time per call on DSA shapes."""
    import time

    import dsa_ops
    from passes import vllm_route

    dev, rows_out = "cuda", []

    def host(fn) -> float:
        runs = []
        for _ in range(7):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            runs.append((time.perf_counter() - t0) / iters * 1e6)
            torch.cuda.synchronize()
        return statistics.median(runs)

    def device(fn, n: int = 50) -> float:
        fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        runs = []
        for _ in range(7):
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            runs.append(start.elapsed_time(end) / n * 1e3)
        return statistics.median(runs)

    x = torch.randn(1, 4096, device=dev)
    lens = torch.full((1,), 2000, dtype=torch.int32, device=dev)
    out = torch.empty(1, K, dtype=torch.int32, device=dev)
    backend = P.current().choose("decode", P.facts_for(dev, K, 1, 4096)).backend
    rec = dsa_ops.backends()[backend]
    rows_out.append((f"host, decode 1 x 4096 (L 2000): routed route_decode -> {backend}",
                     host(lambda: vllm_route.route_decode(x, lens, 1, out, K))))
    rows_out.append(("host, same: dsa_ops.topk_decode(..., out=)", host(lambda: dsa_ops.topk_decode(x, lens, K, out=out))))
    rows_out.append(("host, same: the backend writer alone (the launch)", host(lambda: rec.decode(x, lens, K, 1, False, out))))
    starts = torch.zeros(1, dtype=torch.int32, device=dev)
    rows_out.append(("host, prefill 1 x 4096: routed route_prefill",
                     host(lambda: vllm_route.route_prefill(x, starts, lens, out, K, 4096))))
    rows_out.append(("host, same: dsa_ops.topk_prefill(..., max_seqlen_k=, out=)",
                     host(lambda: dsa_ops.topk_prefill(x, starts, lens, K, max_seqlen_k=4096, out=out))))
    g = torch.Generator(device=dev).manual_seed(0)
    for rows, width in ((4, 32768), (64, 131072), (128, 65536)):
        x = torch.randn(rows, width, device=dev, generator=g)
        seq = torch.full((rows // 2, 2), width, dtype=torch.int32, device=dev)  # MTP: (B, next_n)
        seq[:, 0] -= 1
        out = torch.empty(rows, K, dtype=torch.int32, device=dev)
        rows_out.append((f"device, decode {rows} x {width}, MTP next_n 2: routed",
                         device(lambda: vllm_route.route_decode(x, seq, 2, out, K))))
        flat = seq.reshape(-1)
        rows_out.append(("device, same: dsa_ops.topk_decode", device(lambda: dsa_ops.topk_decode(x, flat, K, out=out))))
    return rows_out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=20000, help="calls per repeat (default 20000)")
    parser.add_argument("--cuda", action="store_true", help="time the routed call on a CUDA device (no vLLM needed)")
    args = parser.parse_args(argv)
    if args.cuda:
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; median of 7 rounds; host: "
              f"{args.iters} calls a round; device: CUDA events, 50 calls a round\n")
        print("| call | us/call |\n|---|---|")
        for name, us in measure_cuda(args.iters):
            print(f"| {name} | {us:.1f} |")
        return
    import vllm

    print(f"vLLM {vllm.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"median of 7 x {args.iters} calls; no-op kernels (host cost only)\n")
    print("| call | us/call |\n|---|---|")
    for name, us in measure(args.iters):
        print(f"| {name} | {us:.1f} |")
    print(f"| prefill / ROCm seam: caller-frame f_locals check | {_frame_cost(args.iters):.1f} |")


if __name__ == "__main__":
    main()
