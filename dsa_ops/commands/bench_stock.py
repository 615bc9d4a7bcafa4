"""``dsa-ops bench --stock``: the routed dsa-ops decode call against what stock vLLM 0.33.0 runs
for the same call (a user who turns the route on must never get a slower top-k).

Stock vLLM's CUDA indexer resolves its ``auto`` top-k backend per call
(``vllm/model_executor/layers/indexer_topk.py``, ``SparseIndexerTopk._resolve_auto``), as
reimplemented by :func:`stock_choice` from its documented behaviour: ``cooperative_topk`` when
it applies (CUDA, k in {512, 1024, 2048}, at most 64 rows, a row pitch that is a multiple of 4
elements, SM90 or newer but not the SM12x family), else ``persistent_topk`` (CUDA and such a
k), else the per-row kernel ``top_k_per_row_decode`` (dsa-ops' ``vllm`` backend). Both radix
kernels get the step's real longest length as their ``max_seq_len`` bound (a host int vLLM
keeps per step) and a 1 MiB workspace. Prefill is always the per-row kernel (the ``vllm``
backend of the plain bench). Before the top-k, vLLM's indexer fills the step's rows of its
index buffer with -1 (``topk_indices_buffer[:num_tokens] = -1``), routed or not; both sides
here include that fill, so their difference is the top-k's alone.

Routed = what the CUDA vLLM route (``passes/vllm_route.py``, ``route_decode``) runs for the call
under the policy: ``dsa_ops.topk_decode(logits, lengths, k, out=buffer)``, or, where the policy
picks ``vllm_cooperative`` / ``vllm_persistent``, stock vLLM's own call of that kernel; caches warm. Both are captured in a CUDA
graph and replayed with the L2 flushed, as the bench does; both outputs are checked against
the reference first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable, Optional

import torch

import dsa_ops
from dsa_ops import policy as P
from dsa_ops.benchmarking import capture, time_graph
from dsa_ops.commands import bench, checks  # bench imports this module only in its check_args / run
from dsa_ops.stock import KERNELS, available, stock_call, stock_choice

TOLERANCE_US = 1.0  # the target: routed <= stock + 1 us


def routed_call(x: torch.Tensor, lens: torch.Tensor, k: int, out: torch.Tensor, pol,
                max_seq_len: int) -> Callable[[], None]:
    """The routed call: the same -1 fill, then what the CUDA vLLM route runs under ``pol``
    (``passes.vllm_route.route_decode``: ``dsa_ops.topk_decode``, or stock vLLM's own kernel
    call where the policy picks one of vLLM's radix kernels)."""
    from passes import vllm_route

    def call() -> None:
        out.fill_(-1)
        with dsa_ops.policy.use(pol):
            vllm_route.route_decode(x, lens, 1, out, k, max_seq_len)

    return call


def routed_runs(x: torch.Tensor, k: int, pol, device: str) -> str:
    """What the routed call runs: the policy's backend, or vLLM's kernel called as stock does."""
    from passes import vllm_route

    kernel = vllm_route.vllm_kernel(x, k, pol)
    if kernel is not None:
        return f"{kernel} (vLLM's call)"
    return pol.choose("decode", P.facts_for(device, k, 1, int(x.shape[1]), pol.stable, rows=int(x.shape[0]))).backend


def _graph_runner(call: Callable[[], None], reps: int) -> tuple[Callable[[], None], Callable[[], dict]]:
    """(one replay, the timing) of ``call`` captured in a CUDA graph, as the bench times decode."""
    graph = capture(call)
    return graph.replay, lambda: time_graph(call, reps=reps, graph=graph).summary()


def case(rows: int, width: int, length: Any, k: int, reps: int, nver: int, policies: dict, device: str = "cuda",
         runner: Callable = _graph_runner, capability: Optional[tuple[int, int]] = None) -> list[dict]:
    """One decode shape: the stock record, then one routed record per policy. Each output is
    checked after one replay of its graph (``runner``: tests pass an eager one)."""
    g = torch.Generator(device=device).manual_seed(rows * 7 + width)
    x = torch.randn(rows, width, device=device, generator=g)
    if length == "mixed":
        lens = torch.randint(2048, 131073, (rows,), device=device, generator=g, dtype=torch.int32).clamp(max=width)
    else:
        lens = torch.full((rows,), min(int(length), width), dtype=torch.int32, device=device)
    max_seq_len = int(lens.max())  # a host int in vLLM's metadata; one sync here, outside the timing
    out = torch.empty(rows, k, dtype=torch.int32, device=device)
    cap = capability or torch.cuda.get_device_capability()
    choice = stock_choice("decode", "cuda", cap, k, rows, int(x.stride(0)))
    base = {"family": "decode", "rows": rows, "width": width, "length": length}
    calls = [("stock", KERNELS[choice], stock_call(choice, x, lens, k, out, max_seq_len))]
    for label, pol in policies.items():
        calls.append((f"routed:{label}", routed_runs(x, k, pol, device), routed_call(x, lens, k, out, pol, max_seq_len)))
    records = []
    for side, what, call in calls:
        once, timed = runner(call, reps)
        out.fill_(-7)
        once()
        status = bench._verify("decode", out, x, lens, None, k, nver)
        records.append({**base, "side": side, "runs": what, **timed(), "verified": status})
        once = timed = None  # the graph goes before the next one is captured
    return records


def table(records: list[dict], labels: list[str]) -> tuple[str, list[str]]:
    """Markdown: per shape, stock and each routed policy with routed / stock and routed - stock;
    and one summary line per policy (where the target routed <= stock + 1 us holds)."""
    head = ["rows", "W", "L", "stock kernel", "stock us"]
    for lab in labels:
        head += [f"{lab}: backend", "us", "/ stock", "- stock us"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by: dict[tuple, dict] = {}
    for r in records:
        by.setdefault((r["rows"], r["width"], r["length"]), {})[r["side"]] = r
    held = {lab: [0, 0, None] for lab in labels}  # [held, shapes, worst (diff, shape)]
    for (rows, width, length), sides in by.items():
        st = sides.get("stock")
        if st is None or "median_us" not in st:
            continue
        cells = [str(rows), str(width), str(length), st["runs"] + ("" if st["verified"] == "ok" else " (WRONG)"),
                 f"{st['median_us']:.1f}"]
        for lab in labels:
            r = sides.get(f"routed:{lab}")
            if r is None or "median_us" not in r:
                cells += ["-", "-", "-", "-"]
                continue
            diff = r["median_us"] - st["median_us"]
            ok = diff <= TOLERANCE_US and r["verified"] == "ok"
            h = held[lab]
            h[0], h[1] = h[0] + ok, h[1] + 1
            if h[2] is None or diff > h[2][0]:
                h[2] = (diff, f"{rows} rows x W {width} x L {length}")
            cells += [r["runs"] + ("" if r["verified"] == "ok" else " (WRONG)"), f"{r['median_us']:.1f}",
                      f"{r['median_us'] / st['median_us']:.2f}", f"{diff:+.1f}" + ("" if ok else " **miss**")]
        lines.append("| " + " | ".join(cells) + " |")
    summary = [f"- {lab}: routed <= stock + {TOLERANCE_US:g} us at {h[0]} of {h[1]} shapes"
               + (f"; worst {h[2][0]:+.1f} us at {h[2][1]}" if h[2] else "") for lab, h in held.items()]
    return "\n".join(lines), summary


def policies(value: str) -> dict:
    """``--policy`` for --stock: label -> Policy. Items: a JSON file (labelled by its name),
    'default' (this host's default, :func:`dsa_ops.policy.default`) or 'builtin' (the built-in
    rules, :data:`dsa_ops.policy.DEFAULT`); empty: the current policy."""
    items = [x.strip() for x in value.split(",") if x.strip()]
    if not items:
        return {"current": checks.policy(None)}
    words = {"default": P.default, "builtin": lambda: P.DEFAULT}
    out = {}
    for x in items:
        label = x if x in words else os.path.splitext(os.path.basename(x))[0]
        if label in out:
            raise checks.UsageError(f"--policy: two policies are labelled {label!r}; rename one file")
        out[label] = words[x]() if x in words else checks.policy(x)
    return out


def run(args: argparse.Namespace) -> int:
    """--stock: per decode shape, stock vLLM's own choice and the routed call, side by side."""
    why = available()
    if why:
        print(f"dsa-ops bench --stock: needs vLLM's compiled top-k ops (docs/vllm-kernels.md); {why}", file=sys.stderr)
        return 2
    pols = policies(args.policy)
    shapes = [(r, w, length) for w in bench._ints(args.widths) for r in bench._ints(args.rows)
              for length in checks.int_list("lengths", args.lengths, 0, extra=("mixed",))]
    records: list[dict] = []
    t0 = time.monotonic()
    for i, (rows, w, length) in enumerate(shapes, 1):
        try:
            recs = case(rows, w, length, args.k, args.reps, args.verify_rows, pols)
        except Exception as exc:  # one failing shape must not lose the rest of the run
            recs = [{"family": "decode", "rows": rows, "width": w, "length": length, "side": "stock",
                     "skipped": f"error: {exc!r}"[:300]}]
        records += recs
        torch.cuda.empty_cache()
        bench._log(f"[{i}/{len(shapes)}] {time.monotonic() - t0:6.1f}s rows={rows} W={w} L={length}: " + ", ".join(
            f"{r['side']} ({r.get('runs', '?')}) " + (f"{r['median_us']:.1f} us {r['verified']}" if "median_us" in r
                                                     else r.get("skipped", "")) for r in recs))
    meta = bench._meta()
    text, summary = table(records, list(pols))
    print(text + "\n\n" + "\n".join(summary))
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump({"meta": meta, "k": args.k, "mode": "stock", "policies": {lab: {"name": p.name,
                   "hash": p.content_hash()} for lab, p in pols.items()}, "records": records}, f, indent=1)
    with open(os.path.join(args.out, "bench.md"), "w") as f:
        f.write(f"# dsa-ops bench --stock: routed against stock vLLM 0.33.0\n\ndevice: {meta['device']}; torch "
                f"{meta['torch']}; triton {meta['triton']}; {meta['date']}\n\nk = {args.k}. {meta['timing']}. "
                f"Stock = what vLLM 0.33.0's `auto` runs for the call (cooperative_topk up to 64 rows on SM90+, "
                f"then persistent_topk, else top_k_per_row_decode; max_seq_len = the step's longest length), routed = "
                f"what the vLLM route runs under the policy (`dsa_ops.topk_decode`, or vLLM's own kernel call where "
                f"the policy picks vllm_persistent / vllm_cooperative; each policy's backend column names it); "
                f"both after vLLM's -1 fill of the buffer rows "
                f"(dsa_ops/commands/bench_stock.py). Target: routed <= stock + {TOLERANCE_US:g} us. "
                f"Policies: " + ", ".join(f"{lab} = {p.name} (`{p.content_hash()[:16]}`)" for lab, p in
                                          pols.items()) + f".\n\n{text}\n\n" + "\n".join(summary) + "\n")
    bad = [r for r in records if r.get("verified", "ok") != "ok"]
    return 1 if bad else 0
