"""Time the available backends on this GPU over decode (rows, L, W) and prefill (chunk size,
max_seqlen_k), check every output against the reference, and write a policy JSON with row and
width bands (plus a markdown report with the regret table) that dsa_ops.policy.load and the
pass accept. Refuses to run without a GPU, except --from-measurements, which rebuilds the
policy from a calibrate JSON's stored measurements (another backend subset or context mix)."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import time
from dataclasses import asdict
from typing import Callable, Optional

import torch

import dsa_ops
from dsa_ops import ops, stock
from dsa_ops import policy as P
from dsa_ops.backends.base import Query, module_version
from dsa_ops.benchmarking import time_eager, time_graph
from dsa_ops.calibration import Measurement
from dsa_ops.calibration_rows import STOCK, Regret, build_row_policy, parse_context_mix, regret_table
from dsa_ops.commands import checks
from dsa_ops.testing import assert_decode_equivalent, assert_prefill_equivalent, sample_rows

HELP = "measure backends on this GPU and write a calibrated policy JSON (row and width bands)"

# Decode grid: every batch size a serving step captures up to 512, two widths (DeepSeek-V3.2's
# 128K context + MTP slack, and 1M), three live lengths. 10 x 2 x 3 = 60 shapes; with ~6
# backends ~360 graph timings of (reps + 3) replays each, one reference check per shape.
DECODE_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
DECODE_WIDTHS = (133120, 1048576)
DECODE_LENGTHS = (4096, 32768, 131072)
PREFILL_ROWS = 4096
PREFILL_SEQLENS = (8192, 16384, 32768, 65536, 131072)
CHECK_ROWS = 64  # rows checked against the reference per output (first, last, evenly spaced)
BASELINES = ("reference", "torch_topk")  # never fast; timed only when --backends names them


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="dsa-ops-policy.json", help="policy JSON to write (default: %(default)s)")
    p.add_argument("--report", help="markdown report to write (default: next to --out, .md)")
    p.add_argument("--k", type=int, default=2048, help="top-k (default: 2048)")
    p.add_argument("--reps", type=int, default=20, help="timed replays per decode point (default: %(default)s)")
    p.add_argument("--rows", default=",".join(map(str, DECODE_ROWS)), help="decode row counts (default: %(default)s)")
    p.add_argument("--widths", default=",".join(map(str, DECODE_WIDTHS)), help="decode widths W (default: %(default)s)")
    p.add_argument("--lengths", default=",".join(map(str, DECODE_LENGTHS)),
                   help="decode live lengths L (default: %(default)s); the context mix's lengths are added")
    p.add_argument("--context-mix", help="weights of the lengths a captured graph will see, e.g. "
                   "4096:0.5,32768:0.3,131072:0.2 (default: the measured lengths, equally weighted)")
    p.add_argument("--prefill-seqlens", default=",".join(map(str, PREFILL_SEQLENS)),
                   help=f"prefill max_seqlen_k points, {PREFILL_ROWS}-row causal chunks (default: %(default)s; '' skips)")
    p.add_argument("--quick", action="store_true", help="a smaller grid (rows 1/16/128, W 133120, 3 prefill sizes)")
    p.add_argument("--backends", help="comma-separated backends to consider (default: every available one but "
                   f"the baselines {', '.join(BASELINES)})")
    p.add_argument("--stock-guard", default="1.0", metavar="US",
                   help="where vLLM's own choice was measured (the 'stock' column: vLLM's ops load), keep to the "
                   "backends within US us of it at every measured L (default: %(default)s; 'off': no guard)")
    p.add_argument("--for-vllm-route", action="store_true",
                   help="decide on what the CUDA vLLM route pays: where it picks vllm_cooperative / vllm_persistent it "
                   "makes stock vLLM's own kernel call, so those cost the 'stock' column's time there")
    p.add_argument("--name", help="the policy's name (default: calibrated-<device>)")
    p.add_argument("--from-measurements", metavar="JSON",
                   help="no GPU: rebuild from this calibrate JSON's (or .measurements.jsonl's) measurements "
                   "(their grid: --rows, --widths, --lengths, --prefill-seqlens, --reps, --quick do not apply)")


def _candidates(names: str | None, k: int, width: int) -> list[str]:
    named = checks.backend_names("backends", names)  # stripped, each registered, as run() checked them
    pool = dsa_ops.backends(include_test_only=bool(named))
    chosen = named or [n for n in pool if n not in BASELINES]
    return [n for n in chosen if pool[n].check(Query("decode", "cuda", k, width))]


def _serving(names: list[str], family: str, k: int, width: int) -> list[str]:
    """The candidates that serve this family at this width (decode-only backends such as
    vllm_persistent have no prefill op and are left out of the prefill points)."""
    pool = dsa_ops.backends(include_test_only=True)
    return [n for n in names if pool[n].check(Query(family, "cuda", k, width))]


def grid(args: argparse.Namespace) -> tuple[list[int], list[int], list[int], list[int]]:
    """(rows, widths, lengths, prefill seqlens) to measure; the mix's lengths join the lengths."""
    rows = checks.int_list("rows", args.rows, empty=False)
    widths = checks.int_list("widths", args.widths, empty=False)
    lengths = checks.int_list("lengths", args.lengths, empty=False)
    seqlens = checks.int_list("prefill-seqlens", args.prefill_seqlens)
    if args.quick:
        rows, widths, seqlens = [1, 16, 128], widths[:1], seqlens[1:4]
    if args.context_mix:
        lengths = sorted(set(lengths) | set(mix_of(args)))
    return sorted(set(rows)), sorted(set(widths)), sorted(set(lengths)), sorted(set(seqlens))


def mix_of(args: argparse.Namespace) -> Optional[dict[int, float]]:
    if not args.context_mix:
        return None
    try:
        return parse_context_mix(args.context_mix)
    except ValueError as exc:
        msg = str(exc)
        raise checks.UsageError("--context-mix: " + (msg[len("context mix: "):] if msg.startswith("context mix: ")
                                                     else msg)) from None


def stock_guard(value: str) -> Optional[float]:
    """``--stock-guard``: a tolerance in us (>= 0), or None for 'off'."""
    if value.strip().lower() == "off":
        return None
    try:
        tol = float(value)
    except ValueError:
        tol = -1.0
    if not (tol >= 0 and tol != float("inf")):
        raise checks.UsageError(f"--stock-guard: expected a number of us >= 0 or 'off', got {value!r}")
    return tol


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def measure(args: argparse.Namespace, progress: Callable[[str], None] = _log, timer: Optional[Callable] = None,
            device: str = "cuda", sink: Optional[str] = None, meta: Optional[dict] = None,
            stock_capability: Optional[tuple[int, int]] = None) -> list:
    """All decode and prefill measurements. Every output is checked against the reference (up to
    CHECK_ROWS rows of it); a wrong one is kept with ``ok=False`` (never chosen) and reported.
    ``timer(call, family) -> us`` defaults to graph replay (decode) / eager calls (prefill);
    ``sink`` gets ``{"meta": meta}`` and then one JSON line per measurement as it is made (a killed
    run keeps its data: ``--from-measurements`` reads the file). Where vLLM's ops load (or
    ``stock_capability`` says which device to take stock vLLM's choice for), each decode shape
    also gets ``stock``: the kernel stock vLLM 0.33.0 runs for the call with the shape's L as its
    bound, timed alone (vLLM -1 fills the buffer before it, routed or not), checked after that fill."""
    if timer is None:
        def timer(call, family):  # noqa: F811
            return (time_graph(call, reps=args.reps) if family == "decode" else time_eager(call, reps=5, warmup=1)).median

    k = args.k
    rows_grid, widths, lengths, seqlens = grid(args)
    names = _candidates(args.backends, k, max(widths))
    jobs = [("decode", r, L, w) for w in widths for r in rows_grid for L in lengths if L <= w]
    jobs += [("prefill", PREFILL_ROWS, c, c) for c in seqlens]
    if stock_capability is None and device == "cuda" and not stock.available():
        stock_capability = torch.cuda.get_device_capability()
    n = sum(len(_serving(names, f, k, w)) + (f == "decode" and stock_capability is not None) for f, _, _, w in jobs)
    progress(f"calibrate: {n} timings ({len(jobs)} shapes x {names}"
             + (f" + {STOCK} (vLLM's own choice)" if stock_capability else "")
             + f"); decode: CUDA-graph replay, {args.reps} reps")
    out, i, t0 = [], 0, time.monotonic()
    sink_f = open(sink, "w", encoding="utf-8") if sink else None
    if sink_f:
        sink_f.write(json.dumps({"meta": meta or {}}) + "\n")
    g = torch.Generator(device=device).manual_seed(0)
    logits, key = None, None
    try:
        for family, rows, length, width in jobs:
            if key != (family, rows, width):  # one logits buffer per (rows, W): the lengths change
                logits = None
                if device == "cuda":
                    torch.cuda.empty_cache()  # 512 x 1M is 2 GiB: hand the last shape's back first
                logits = torch.randn(rows, width, device=device, generator=g)
                key = (family, rows, width)
            res = torch.empty(rows, k, dtype=torch.int32, device=device)
            if family == "decode":
                lens = torch.full((rows,), length, dtype=torch.int32, device=device)
                idx = sample_rows(rows, CHECK_ROWS).to(device)
            else:  # one causal chunk: row r ends at C - R + r + 1
                starts = torch.zeros(rows, dtype=torch.int32, device=device)
                ends = (torch.arange(rows, device=device, dtype=torch.int32) + (length - rows + 1)).clamp(min=0)
            served = _serving(names, family, k, width)
            if family == "decode" and stock_capability is not None:
                served.append(STOCK)
            for name in served:
                i += 1
                if name == STOCK:
                    choice = stock.stock_choice("decode", "cuda", stock_capability, k, rows,
                                                      int(logits.stride(0)))
                    first = stock.stock_call(choice, logits, lens, k, res, length)  # vLLM's fill, the kernel
                    call = stock.stock_call(choice, logits, lens, k, res, length, fill=False)
                elif family == "decode":
                    op = ops.backend_op(name, family, out=True)
                    call = first = lambda: op(logits, lens, k, 1, 1, False, res)  # noqa: E731
                else:
                    op = ops.backend_op(name, family, out=True)
                    call = first = lambda: op(logits, starts, ends, k, 1, False, res)  # noqa: E731
                try:
                    first()
                    try:
                        if family == "decode":
                            assert_decode_equivalent(res[idx], logits[idx], lens[idx], k)
                        else:
                            assert_prefill_equivalent(res, logits, starts, ends, k)
                        ok, note = True, "ok"
                    except AssertionError as exc:
                        ok, note = False, "WRONG (never chosen): " + str(exc).splitlines()[0]
                    us = float(timer(call, family))
                except Exception as exc:  # one failing backend must not lose the rest of the run
                    progress(f"[{i}/{n}] {time.monotonic() - t0:7.1f}s {family} {name} rows={rows} L={length} "
                             f"W={width}: ERROR, not measured: {exc!r}"[:400])
                    continue
                m = Measurement(family, name, rows, length, width, round(us, 3), ok)
                out.append(m)
                if sink_f:
                    sink_f.write(json.dumps(asdict(m)) + "\n")
                    sink_f.flush()
                progress(f"[{i}/{n}] {time.monotonic() - t0:7.1f}s {family} {name} rows={rows} L={length} W={width}: "
                         f"{us:.1f} us {note}")
            res = None
    finally:
        if sink_f:
            sink_f.close()
    logits = None
    progress(f"calibrate: measured {len(out)} points in {time.monotonic() - t0:.1f} s")
    return out


def load_measurements(path: str) -> tuple[list, dict]:
    """Measurements (and the meta, for a policy JSON) from a calibrate policy JSON or its
    ``.measurements.jsonl``."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise checks.UsageError(f"--from-measurements: cannot read {path!r}: {exc.strerror}") from None
    try:
        if path.endswith(".jsonl"):
            items = [json.loads(line) for line in text.splitlines() if line.strip()]
            meta = next((x["meta"] for x in items if "meta" in x), {})
            return [Measurement(**x) for x in items if "meta" not in x], meta
        meta = json.loads(text).get("meta", {})
        return [Measurement(**m) for m in meta["measurements"]], meta
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise checks.UsageError(f"--from-measurements: {path!r} holds no calibrate measurements ({exc!r})") from None


def report(policy, ms: list) -> str:
    """The markdown report: timings, the bands and their reasons, the regret table."""
    meta = policy.meta
    names = sorted({m.backend for m in ms})
    lines = [f"# Calibrated policy: {policy.name}", "",
             f"Device {meta.get('device')}, torch {meta.get('torch')}, triton {meta.get('triton')}, {meta.get('date')}. "
             f"Policy hash `{policy.content_hash()[:16]}`. Context mix (L: weight) {meta.get('context_mix')}."]
    if meta.get("rebuilt_from"):
        lines.append(f"Rebuilt without a GPU from `{meta['rebuilt_from']}` (backends {meta.get('backends')}).")
    lines += ["", "## Decode (us per call, CUDA-graph replay, L2 flushed, median; WRONG = failed the contract "
              "check, never chosen)", "", "| W | rows | L | " + " | ".join(names) + " |",
              "|---|---|---|" + "---|" * len(names)]
    table: dict = {}
    for m in ms:
        table.setdefault((m.family, m.width, m.rows, m.length), {})[m.backend] = m
    cell = lambda m, scale=1.0, fmt=".1f": "-" if m is None else f"{m.us / scale:{fmt}}" + ("" if m.ok else " WRONG")  # noqa: E731
    for (fam, w, r, L), t in sorted(table.items()):
        if fam == "decode":
            lines.append(f"| {w} | {r} | {L} | " + " | ".join(cell(t.get(n)) for n in names) + " |")
    if any(fam == "prefill" for fam, *_ in table):
        lines += ["", "## Prefill (ms per call, eager, median)", "", "| rows | max_seqlen_k | " + " | ".join(names)
                  + " |", "|---|---|" + "---|" * len(names)]
        for (fam, w, r, L), t in sorted(table.items()):
            if fam == "prefill":
                lines.append(f"| {r} | {L} | " + " | ".join(cell(t.get(n), 1e3, ".3f") for n in names) + " |")
    lines += ["", "## Decisions", ""]
    for b in meta["decode_row_bands"]:
        where = f"W in [{b['min_width']}, {b['max_width'] or 'inf'})"
        if b["fallback"]:
            lines.append(f"- decode {where}, a symbolic row range across these bands: **{b['backend']}** (least "
                         f"geo-mean slowdown over rows {b['rows']})")
        else:
            lines.append(f"- decode {where}, rows in [{b['min_rows']}, {b['max_rows'] or 'inf'}): **{b['backend']}** "
                         f"(least expected time over the mix at rows {b['rows']})")
    pf = meta.get("prefill")
    if pf:
        lines.append(f"- prefill: below {pf['threshold']} **{pf['below']}**, at or above **{pf['above']}**"
                     + ("" if pf["crossover"] else " (no crossover: one backend wins everywhere)"))
    regrets = [Regret(**{k: v for k, v in g.items() if k != "regret_us"}) for g in meta["regret"]]
    shapes = [g for g in regrets if g.length != "mix"]
    worst = max(shapes, key=lambda g: g.regret_us, default=None)
    lines += ["", "## Regret", "",
              "A captured graph cannot see L, so each (W, rows) gets one backend for the whole context mix. Per "
              "measured shape: the chosen backend's time against the fastest backend at that shape (regret = "
              "chosen - best; 0 where the choice is the fastest). The `mix` lines compare the chosen backend's "
              "expected time over the mix with an oracle that picks the fastest backend for each L.", ""]
    if meta.get("for_vllm_route"):
        lines += ["Costs as the CUDA vLLM route pays them (`--for-vllm-route`): where the policy picks "
                  "vllm_cooperative / vllm_persistent the route makes stock vLLM's own kernel call, so in the choice and "
                  "in the regret table below those backends cost the `stock` column's time where stock runs their "
                  "kernel (the decode table above keeps the adapters' own times).", ""]
    if meta.get("stock_guard_us") is not None:
        lines += [f"Stock guard: at each (W, rows) only the backends within {meta['stock_guard_us']:g} us of stock vLLM "
                  f"0.33.0's own choice (the `stock` column: its kernel alone, with the shape's L as its bound) at "
                  f"every measured L were candidates (if none was, the one with the least worst excess).", ""]
    if worst is not None:
        over = sum(g.regret_us > 1.0 for g in shapes)
        lines += [f"Worst: {worst.regret_us:+.1f} us ({worst.ratio:.3f}x) at W {worst.width}, rows {worst.rows}, "
                  f"L {worst.length} ({worst.chosen} against {worst.best}); {over} of {len(shapes)} shapes lose "
                  f"more than 1 us."]
        vs = [g for g in shapes if g.stock_us is not None]
        if vs:
            bad = max(vs, key=lambda g: g.over_stock_us)
            lines.append(f"Against stock: chosen <= stock + 1 us at {sum(g.over_stock_us <= 1.0 for g in vs)} of "
                         f"{len(vs)} shapes; worst {bad.over_stock_us:+.1f} us at W {bad.width}, rows {bad.rows}, "
                         f"L {bad.length} ({bad.chosen}).")
        lines.append("")
    lines.append(regret_table(regrets))
    return "\n".join(lines) + "\n"


def report_path(out: str, given: str | None) -> str:
    """The report's path (``--report``, else ``--out`` with its extension replaced by .md),
    with both paths checked before anything is measured."""
    checks.output_file("out", out)
    rep = given or os.path.splitext(out)[0] + ".md"
    checks.output_file("report", rep)
    if os.path.abspath(rep) == os.path.abspath(out):
        raise checks.UsageError(f"--report: {rep!r} is also --out (the policy JSON); name another file")
    return rep


def _sink_path(out: str) -> str:
    return os.path.splitext(out)[0] + ".measurements.jsonl"


def run(args: argparse.Namespace) -> int:
    checks.top_k(args.k)
    checks.at_least("reps", args.reps, 1)
    wanted = checks.backend_names("backends", args.backends)
    mix = mix_of(args)
    tol = stock_guard(args.stock_guard)
    grid(args)  # the lists are checked before any work
    faulty = [n for n in wanted if dsa_ops.backends.get(n).faults]
    if wanted and len(faulty) == len(wanted):
        raise checks.UsageError(f"--backends: {', '.join(faulty)} {'has' if len(faulty) == 1 else 'have'} a known "
                                f"fault on legal input, so calibration never chooses it; name another backend too")
    args.report = report_path(args.out, args.report)
    if args.from_measurements:
        measuring = {"rows": ",".join(map(str, DECODE_ROWS)), "widths": ",".join(map(str, DECODE_WIDTHS)),
                     "lengths": ",".join(map(str, DECODE_LENGTHS)), "prefill_seqlens": ",".join(map(str, PREFILL_SEQLENS)),
                     "reps": 20, "quick": False}
        given = [name for name, default in measuring.items() if getattr(args, name) != default]
        if given:
            raise checks.UsageError(f"--{given[0].replace('_', '-')}: only for a measuring run; --from-measurements "
                                    f"rebuilds from the stored grid (--backends and --context-mix choose from it)")
        ms, meta = load_measurements(args.from_measurements)
        measured = sorted({m.backend for m in ms} - {STOCK})
        unmeasured = [n for n in wanted if n not in measured]
        if unmeasured:
            raise checks.UsageError(f"--backends: {', '.join(unmeasured)} not measured in {args.from_measurements!r} "
                                    f"(measured: {', '.join(measured)})")
        lengths = sorted({m.length for m in ms if m.family == "decode"})
        if mix and set(mix) - set(lengths):
            raise checks.UsageError(f"--context-mix: L = {sorted(set(mix) - set(lengths))} not measured in "
                                    f"{args.from_measurements!r} (measured L: {lengths}); a rebuilt mix may only "
                                    f"name measured lengths")
        if wanted:
            ms = [m for m in ms if m.backend in wanted or m.backend == STOCK]
        meta = {k: v for k, v in meta.items() if k in ("device", "platform", "arch", "torch", "triton", "date", "k")}
        if meta.get("k", args.k) != args.k and args.k != 2048:  # --k given, and not what was measured
            raise checks.UsageError(f"--k {args.k}: {args.from_measurements!r} was measured at k = {meta['k']}")
        if "platform" not in meta or "arch" not in meta:
            raise checks.UsageError(f"--from-measurements: {args.from_measurements!r} names no platform / arch")
        meta.update(rebuilt_from=os.path.basename(args.from_measurements), backends=sorted({m.backend for m in ms}))
    else:
        if not torch.cuda.is_available():
            print("dsa-ops calibrate: needs a CUDA or ROCm GPU (it times kernels on the device it calibrates); "
                  "none is visible here (--from-measurements rebuilds a policy from stored ones)", file=sys.stderr)
            return 2
        platform, arch = P.device_platform("cuda")
        meta = {"device": torch.cuda.get_device_name(), "platform": platform, "arch": arch,
                "torch": torch.__version__, "triton": module_version("triton"),
                "date": datetime.date.today().isoformat(), "k": args.k}
        ms = measure(args, sink=_sink_path(args.out), meta=meta)
        meta["backends"] = sorted({m.backend for m in ms})
    try:
        pol = build_row_policy(ms, meta["platform"], meta["arch"], meta, mix, k=meta.get("k", args.k), stock_tol=tol,
                               for_route=args.for_vllm_route)
    except ValueError as exc:
        raise checks.UsageError(str(exc)) from None
    if args.name:
        pol = dataclasses.replace(pol, name=args.name)
    P.save(pol, args.out)
    P.load(args.out)  # what we wrote must load
    text = report(pol, ms)
    with open(args.report, "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    print(f"wrote {args.out} and {args.report}")
    wrong = [m for m in ms if not m.ok]
    if wrong:
        print(f"{len(wrong)} output(s) failed the contract check (left out of the choice): "
              + "; ".join(f"{m.backend} rows={m.rows} L={m.length} W={m.width}" for m in wrong[:10]), file=sys.stderr)
    return 1 if wrong else 0
