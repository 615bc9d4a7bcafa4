"""Time every available top-k backend on the DSA grid (CUDA only); print a table and write
bench.json, bench.md and (where matplotlib imports: the `plot` extra) bench.png to --out.

Decode: rows 1/8/16/64 x width 133120 / 1048576 x live length 4K / 32K / 128K and a mixed
set (lengths drawn uniformly from [2K, 128K], fixed seed). Each timing is one call captured
in a CUDA graph and replayed with the L2 flushed (256 MiB written) before every replay;
the figure is the median of --reps replays. Prefill: one 16384-row causal chunk (row r ends
at C - 16384 + r + 1) at C = 16K / 32K / 64K / 128K, eager medians. Before a backend is
timed on a shape, its output is checked against the reference (dsa_ops.testing) on a subset
of rows. The reference itself is timed only up to --ref-max-elems logits (it is slow).

Next to each available vLLM backend the decode table gets its raw kernel (`<name>:raw`,
and `vllm_cooperative:raw+fill`: vLLM's op called directly, dsa_ops/commands/bench_raw.py)
and bench.md an adapter-cost table (routed minus raw); --no-raw leaves them out. Where the
peers were timed, bench.md also gets the targets from this run's own timings: each dsa-ops
backend against 0.8x raw cooperative_topk (decode) and against the vllm backend (prefill),
with a count of the shapes where the target holds.

Instead of the grid: --stock times, per decode shape (rows 1..512 by default), what stock
vLLM 0.33.0 runs for the call against the routed call under each --policy; --e2e times the
compiled 21-layer indexer decode step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable

import torch

import dsa_ops
from dsa_ops import api, testing
from dsa_ops.backends.base import Query, module_version
from dsa_ops.benchmarking import capture, time_eager, time_graph
from dsa_ops.commands import bench_e2e, bench_raw, checks

HELP = "time every available backend (decode graph replays, prefill eager); write table, JSON (PNG with matplotlib)"

# vLLM cooperative_topk measured once on one H200 (the fixed figures the targets were set
# from), us per call; target = 0.8x of it, and <= 10 us at 128K for rows <= 16.
COOP_US = {
    (133120, 1): {4096: 6.9, 32768: 14.0, 131072: 17.0},
    (133120, 64): {4096: 8.0, 32768: 21.0, 131072: 39.0},
    (1048576, 8): {4096: 7.0, 32768: 14.0, 131072: 18.0},
}
VLLM_PREFILL_US = {16384: 690.0, 32768: 1330.0, 65536: 2640.0, 131072: 5040.0}
PREFILL_TARGET_US = {131072: 3000.0}
PREFILL_ROWS = 16384
MIN_REPS = 30  # decode replays a timing, at least (the median of fewer is too noisy here)
DEFAULT_ROWS = "1,8,16,64"
STOCK_ROWS = "1,2,4,8,16,32,64,128,256,512"  # every batch size a step captures, to 512


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="bench-out", help="output directory (default: bench-out)")
    p.add_argument("--reps", type=int, default=MIN_REPS, help=f"replays per decode timing (default and least: {MIN_REPS})")
    p.add_argument("--prefill-reps", type=int, default=5, help="eager calls per prefill timing (default: 5)")
    p.add_argument("--rows", default=None,
                   help=f"decode row counts (default: {DEFAULT_ROWS}, with --stock {STOCK_ROWS}; '' skips decode)")
    p.add_argument("--widths", default="133120,1048576", help="decode widths W (default: 133120,1048576)")
    p.add_argument("--lengths", default="4096,32768,131072,mixed",
                   help="decode live lengths, or 'mixed' (default: 4096,32768,131072,mixed)")
    p.add_argument("--prefill-c", default="16384,32768,65536,131072",
                   help="prefill chunk K lengths C (default: 16384,32768,65536,131072; '' skips prefill)")
    p.add_argument("--k", type=int, default=2048, help="top-k (default: 2048)")
    p.add_argument("--backends", default="", help="comma list (default: every available backend)")
    p.add_argument("--verify-rows", type=int, default=8,
                   help="rows per shape checked against the reference before timing (default: 8, least 1)")
    p.add_argument("--no-raw", action="store_true",
                   help="leave out the raw-kernel columns (vLLM's ops called directly, next to their adapters)")
    p.add_argument("--ref-max-elems", type=int, default=1 << 24,
                   help="time the reference only up to R*W elements (default: %(default)s)")
    p.add_argument("--stock", action="store_true",
                   help="decode only: stock vLLM 0.33.0's own top-k choice for each call (needs vLLM's ops) next to "
                   "the routed call (what the vLLM route runs under --policy), routed / stock in bench.md "
                   "(dsa_ops/commands/bench_stock.py)")
    p.add_argument("--policy", default="",
                   help="with --stock: comma list of policy JSON files to route with, 'default' (this host's "
                   "default policy) or 'builtin' (the built-in rules) (default: $DSA_OPS_POLICY or this host's "
                   "default)")
    bench_e2e.add_arguments(p)


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _verify(family: str, got: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor | None,
            k: int, n: int) -> str:
    idx = testing.sample_rows(x.shape[0], n).to(x.device)
    try:
        if family == "decode":
            testing.assert_decode_equivalent(got[idx], x[idx], a[idx], k)
        else:
            testing.assert_prefill_equivalent(got[idx], x[idx], a[idx], b[idx], k)
    except AssertionError as exc:
        return "FAIL: " + str(exc).splitlines()[0]
    return "ok"


def _decode_case(name: str, rows: int, width: int, length: Any, k: int, reps: int, nver: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(rows * 7 + width)
    x = torch.randn(rows, width, device="cuda", generator=g)
    if length == "mixed":
        lens = torch.randint(2048, 131073, (rows,), device="cuda", generator=g, dtype=torch.int32)
    else:
        lens = torch.full((rows,), int(length), dtype=torch.int32, device="cuda")
    out = torch.empty(rows, k, dtype=torch.int32, device="cuda")

    def call() -> None:
        api.topk_decode(x, lens, k, backend=name, out=out)

    if name in bench_raw.RAW:
        call = bench_raw.raw_call(name, x, lens, k, out)  # noqa: F811 (the kernel alone)
    graph = capture(call)
    out.fill_(-7)
    graph.replay()
    status = _verify("decode", out, x, lens, None, k, nver)
    t = time_graph(call, reps=reps, graph=graph)
    return {**t.summary(), "verified": status}


def _prefill_case(name: str, chunk: int, k: int, reps: int, nver: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(chunk)
    x = torch.randn(PREFILL_ROWS, chunk, device="cuda", generator=g)
    starts = torch.zeros(PREFILL_ROWS, dtype=torch.int32, device="cuda")
    ends = torch.arange(PREFILL_ROWS, dtype=torch.int32, device="cuda") + (chunk - PREFILL_ROWS + 1)
    out = torch.full((PREFILL_ROWS, k), -7, dtype=torch.int32, device="cuda")

    def call() -> None:
        api.topk_prefill(x, starts, ends, k, backend=name, out=out)

    call()
    torch.cuda.synchronize()
    status = _verify("prefill", out, x, starts, ends, k, nver)
    t = time_eager(call, reps=reps, warmup=1)
    return {**t.summary(), "verified": status}  # (x and the closure go with this frame)


def _targets(rec: dict) -> dict:
    """Target figures for a record: 0.8x cooperative_topk, <= 10 us at 128K for <= 16 rows."""
    if rec["family"] == "prefill":
        return {"vllm_us": VLLM_PREFILL_US.get(rec["length"]), "target_us": PREFILL_TARGET_US.get(rec["length"])}
    coop = COOP_US.get((rec["width"], rec["rows"]), {}).get(rec["length"])
    tgt = [0.8 * coop] if coop else []
    if rec["length"] == 131072 and rec["rows"] <= 16:
        tgt.append(10.0)
    return {"coop_us": coop, "target_us": min(tgt) if tgt else None}


def _table(records: list[dict], names: list[str]) -> str:
    head = ["family", "rows", "W", "L"] + [f"{n} us" for n in names] + ["vLLM us", "target us", "triton/target"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys: dict[tuple, dict[str, dict]] = {}
    for r in records:
        keys.setdefault((r["family"], r["rows"], r["width"], r["length"]), {})[r["backend"]] = r
    for key, by in keys.items():
        cells = [str(c) for c in key]
        for n in names:
            r = by.get(n)
            if r is None:
                cells.append("-")
            elif r.get("skipped"):
                cells.append("skipped")
            else:
                bad = "" if r["verified"] == "ok" else " (WRONG)"
                cells.append(f"{r['median_us']:.1f}{bad}")
        tg = next(iter(by.values()))["targets"]
        tgt = tg.get("target_us")
        peer = tg.get("coop_us") or tg.get("vllm_us")
        tri = by.get("triton")
        cells.append(f"{peer:.1f}" if peer else "-")
        cells.append(f"{tgt:.1f}" if tgt else "-")
        ok = tgt and tri and not tri.get("skipped")
        cells.append(f"{tri['median_us'] / tgt:.2f}" if ok else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _overhead_table(records: list[dict], raws: list[str]) -> str:
    """Per decode shape and vLLM backend: raw, routed and routed - raw (us)."""
    pairs = [(raw, base) for raw, base in bench_raw.RAW.items() if raw in raws and raw != "vllm_cooperative:raw"]
    if not pairs:
        return ""
    by = {(r["rows"], r["width"], r["length"], r["backend"]): r for r in records
          if r["family"] == "decode" and "median_us" in r}
    head = ["rows", "W", "L"] + [f"{b}: raw / routed / +" for _, b in pairs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rows, width, length in dict.fromkeys((r["rows"], r["width"], r["length"]) for r in records
                                             if r["family"] == "decode"):
        cells = [str(rows), str(width), str(length)]
        for raw, base in pairs:
            a, b = by.get((rows, width, length, raw)), by.get((rows, width, length, base))
            if not bench_raw.supported(raw, rows):
                a = by.get((rows, width, length, "vllm_persistent:raw"))  # the adapter runs persistent there
            cells.append(f"{a['median_us']:.1f} / {b['median_us']:.1f} / {b['median_us'] - a['median_us']:+.1f}"
                         if a and b else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


PEERS = ("vllm", "aiter")  # backend name prefixes that are the peers, not dsa-ops' own kernels
RAW_COOP = "vllm_cooperative:raw"
SIDES_NOTE = ("The targets from this run's timings (the 'vLLM us' and 'target us' columns above are fixed "
              "figures, measured once on one H200). "
              "Decode: peer = raw cooperative_topk (vLLM's op called directly), target = 0.8x of it; prefill: "
              "peer = the vllm backend (vLLM's top_k_per_row_prefill), target = faster than it. A ratio is the "
              "backend's median over the peer's; a wrong output never holds.")


def _side_by_side(records: list[dict], names: list[str]) -> str:
    """The targets from this run's own timings: per decode shape, each own backend
    against 0.8x raw cooperative_topk (vLLM's op called directly); per prefill chunk, against
    the vllm backend (vLLM's top_k_per_row_prefill). Empty when no peer was timed."""
    own = [n for n in names if n != "reference" and ":" not in n and not n.startswith(PEERS)]
    if not own:
        return ""
    by = {(r["family"], r["rows"], r["width"], r["length"], r["backend"]): r for r in records if "median_us" in r}
    lines, held = [], {n: {"decode": [0, 0], "prefill": [0, 0]} for n in own}  # [held, timed]
    shapes = dict.fromkeys((r["family"], r["rows"], r["width"], r["length"]) for r in records)
    for fam, rows, width, length in shapes:
        peer = by.get((fam, rows, width, length, RAW_COOP if fam == "decode" else "vllm"))
        if peer is None:
            continue
        bar = 0.8 * peer["median_us"] if fam == "decode" else peer["median_us"]
        cells = [fam, str(rows), str(width), str(length), f"{peer['median_us']:.1f}", f"{bar:.1f}"]
        for n in own:
            r = by.get((fam, rows, width, length, n))
            if r is None:
                cells.append("-")
                continue
            ratio = r["median_us"] / peer["median_us"]
            ok = r["median_us"] <= bar if fam == "decode" else r["median_us"] < bar
            if r.get("verified", "ok") != "ok":
                ok = False
            held[n][fam][0] += int(ok)
            held[n][fam][1] += 1
            cells.append(f"{r['median_us']:.1f} ({ratio:.2f}x{', holds' if ok else ''})")
        lines.append("| " + " | ".join(cells) + " |")
    if not lines:
        return ""
    head = ["family", "rows", "W", "L", "peer us", "target us"] + [f"{n} us (/ peer)" for n in own]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + lines + [""]
    for n in own:
        (d_ok, d_n), (p_ok, p_n) = held[n]["decode"], held[n]["prefill"]
        out.append(f"- {n}: decode target held at {d_ok} of {d_n} shapes; prefill at {p_ok} of {p_n} chunks.")
    return "\n".join(out)


def _plot(records: list[dict], names: list[str], path: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return "matplotlib is not importable: no PNG written"
    dec = [r for r in records if r["family"] == "decode" and isinstance(r["length"], int) and "median_us" in r]
    panels = sorted({(r["width"], r["rows"]) for r in dec})
    if not panels:
        return "no decode timings to plot"
    cols = min(4, len(panels))
    nrow = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrow, cols, figsize=(4 * cols, 3.2 * nrow), squeeze=False)
    colors = {n: f"C{i}" for i, n in enumerate(names)}  # one colour per backend in every panel
    for ax, (w, rows) in zip(axes.flat, panels):
        for n in names:
            pts = sorted((r["length"], r["median_us"]) for r in dec if r["backend"] == n and (r["width"], r["rows"]) == (w, rows))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=n, color=colors[n])
        tgt = sorted({(r["length"], r["targets"]["target_us"]) for r in dec
                      if (r["width"], r["rows"]) == (w, rows) and r["targets"].get("target_us")})
        if tgt:
            ax.plot([p[0] for p in tgt], [p[1] for p in tgt], "k--", marker="x", label="target")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"W={w}, rows={rows}", fontsize=9)
        ax.set_xlabel("live length L")
        ax.set_ylabel("us per call (graph replay)")
        ax.grid(True, alpha=0.3)
    for ax in axes.flat:
        if ax.lines:
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return f"wrote {path}"


def _meta() -> dict:
    return {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": module_version("triton"),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "timing": "decode: CUDA-graph replay of one call, 256 MiB written before each replay (L2 flush), "
        "median; prefill: eager calls, median",
    }


def check_args(args: argparse.Namespace) -> None:
    """Every value is checked before anything runs (a bad one is one line and exit 2)."""
    checks.top_k(args.k)
    checks.at_least("reps", args.reps, MIN_REPS)
    checks.at_least("prefill-reps", args.prefill_reps, 1)
    checks.at_least("verify-rows", args.verify_rows, 1)
    if args.rows is None:
        args.rows = STOCK_ROWS if args.stock else DEFAULT_ROWS
    if args.stock:
        from dsa_ops.commands import bench_stock

        if args.e2e:
            raise checks.UsageError("--stock and --e2e: two different benches; run them one at a time")
        if args.backends:
            raise checks.UsageError("--backends: --stock times stock vLLM's choice against the routed call under "
                                    "--policy, not named backends; name the policies with --policy")
        bench_stock.policies(args.policy)  # a bad file fails now, not after the timing
    elif args.policy:
        raise checks.UsageError("--policy: only --stock routes by a policy (the plain bench names each backend)")
    decode = [checks.int_list("rows", args.rows), checks.int_list("widths", args.widths),
              checks.int_list("lengths", args.lengths, 0, extra=("mixed",))]
    prefill = checks.int_list("prefill-c", args.prefill_c)
    checks.backend_names("backends", args.backends)
    checks.folder_path("out", args.out)
    if args.e2e:
        checks.backend_names("e2e-backends", args.e2e_backends)
        checks.int_list("e2e-contexts", args.e2e_contexts, empty=False)
        checks.int_list("e2e-batches", args.e2e_batches, empty=False)
    elif not all(decode) and not prefill:
        raise checks.UsageError("nothing to time: --rows, --widths and --lengths give no decode point and "
                                "--prefill-c no prefill chunk")


def run(args: argparse.Namespace) -> int:
    check_args(args)
    if not torch.cuda.is_available():
        print("dsa-ops bench: needs a CUDA (or ROCm) device; none is visible (torch.cuda.is_available() "
              "is False). Nothing was timed.", file=sys.stderr)
        return 2
    checks.output_dir("out", args.out)  # before any timing: a bad --out fails now, not at the end
    if args.e2e:
        return bench_e2e.run(args, _meta())
    if args.stock:
        from dsa_ops.commands import bench_stock

        return bench_stock.run(args)
    wanted = checks.backend_names("backends", args.backends) or list(dsa_ops.backends())
    names = [n for n in wanted if dsa_ops.backends.get(n).availability()]
    for n in wanted:
        if n not in names:
            _log(f"skipping backend {n}: {dsa_ops.backends.get(n).availability().reason}")
    raws = [] if args.no_raw else bench_raw.raw_names(names)
    cases: list[tuple[str, dict, Callable[[str], dict]]] = []
    for w in _ints(args.widths):
        for rows in _ints(args.rows):
            for length in checks.int_list("lengths", args.lengths, 0, extra=("mixed",)):
                meta = {"family": "decode", "rows": rows, "width": w, "length": length}
                cases.append(("decode", meta, lambda n, r=rows, w=w, l=length: _decode_case(n, r, w, l, args.k, args.reps, args.verify_rows)))
    for c in _ints(args.prefill_c):
        meta = {"family": "prefill", "rows": PREFILL_ROWS, "width": c, "length": c}
        cases.append(("prefill", meta, lambda n, c=c: _prefill_case(n, c, args.k, args.prefill_reps, args.verify_rows)))
    records: list[dict] = []
    columns = names + raws
    total = len(cases) * len(columns)
    done = 0
    for family, meta, fn in cases:
        for n in columns:
            done += 1
            if n in bench_raw.RAW and (family != "decode" or not bench_raw.supported(n, meta["rows"])):
                continue
            rec = {**meta, "backend": n}
            rec["targets"] = _targets(rec)
            base = bench_raw.RAW.get(n, n)
            sup = dsa_ops.backends.get(base).check(Query(family, "cuda", args.k, meta["width"]))
            too_big = n == "reference" and (family == "prefill" or meta["rows"] * meta["width"] > args.ref_max_elems)
            if not sup or too_big:
                rec["skipped"] = "too slow at this size" if too_big else sup.reason
                _log(f"[{done}/{total}] {family} rows={meta['rows']} W={meta['width']} L={meta['length']} {n}: skipped ({rec['skipped']})")
            else:
                try:
                    rec.update(fn(n))
                except Exception as exc:  # one failing backend must not lose the rest of the run
                    rec["skipped"] = f"error: {exc!r}"[:300]
                torch.cuda.empty_cache()
                _log(f"[{done}/{total}] {family} rows={meta['rows']} W={meta['width']} L={meta['length']} {n}: "
                     + (f"{rec['median_us']:.1f} us, {rec['verified']}" if "median_us" in rec else rec["skipped"]))
            records.append(rec)
    os.makedirs(args.out, exist_ok=True)
    meta = _meta()
    table = _table(records, columns)
    overhead = _overhead_table(records, raws)
    sides = _side_by_side(records, columns)
    print(table)
    if overhead:
        print("\n" + overhead)
    if sides:
        print("\n" + sides)
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump({"meta": meta, "k": args.k, "records": records}, f, indent=1)
    with open(os.path.join(args.out, "bench.md"), "w") as f:
        f.write(f"# dsa-ops bench\n\ndevice: {meta['device']}; torch {meta['torch']}; triton {meta['triton']}; "
                f"{meta['date']}\n\nk = {args.k}. {meta['timing']}. Target = 0.8x vLLM cooperative_topk "
                f"(and <= 10 us at 128K for rows <= 16); prefill target 3.0 ms at C = 128K. <backend>:raw columns "
                f"call vLLM's op directly on inputs already in its form (dsa_ops/commands/bench_raw.py).\n\n{table}\n")
        if overhead:
            f.write(f"\n## Adapter cost over the raw kernel\n\nrouted median - raw median, us (cooperative: "
                    f"against raw+fill, the -1 fill its adapter must do too).\n\n{overhead}\n")
        if sides:
            f.write(f"\n## Against the peers, measured in this run\n\n{SIDES_NOTE}\n\n{sides}\n")
    _log(_plot(records, names, os.path.join(args.out, "bench.png")))
    bad = [r for r in records if r.get("verified", "ok") != "ok"]
    return 1 if bad else 0

