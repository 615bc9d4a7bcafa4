"""``dsa-ops bench --e2e``: the captured 21-layer decode step, per decode backend."""

from __future__ import annotations

import argparse
import json
import os
import sys

import dsa_ops
from dsa_ops import e2e
from dsa_ops.commands import checks


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--e2e", action="store_true",
                   help="instead: time the compiled 21-layer indexer decode step captured as one CUDA graph "
                        "(takes the --e2e-* options, --reps and --out; not --k, --backends, --rows)")
    p.add_argument("--e2e-backends", default="reference,triton,torch_topk",
                   help="decode backends for --e2e (default: reference,triton,torch_topk)")
    p.add_argument("--e2e-contexts", default="4096,32768,131072", help="contexts for --e2e (default: %(default)s)")
    p.add_argument("--e2e-batches", default="1,8,16", help="batch sizes for --e2e (default: %(default)s)")


def _progress(i: int, n: int, what: str) -> None:
    print(f"[{i}/{n}] {what}", file=sys.stderr, flush=True)


def table(rows: list[dict]) -> str:
    names = list(dict.fromkeys(r["backend"] for r in rows))
    head = "| context | batch | " + " | ".join(f"{n} (us/step)" for n in names) + " | kernels/step |"
    lines = [head, "|---|---|" + "---|" * len(names) + "---|"]
    by = {(r["context"], r["batch"], r["backend"]): r for r in rows}
    for ctx, batch in dict.fromkeys((r["context"], r["batch"]) for r in rows):
        cells = [by.get((ctx, batch, n)) for n in names]
        lines.append(f"| {ctx} | {batch} | " + " | ".join(f"{c['step_us']:.1f}" if c else "-" for c in cells)
                     + " | " + ", ".join(f"{n}: {c['kernels']}" for n, c in zip(names, cells) if c) + " |")
    return "\n".join(lines)


def run(args: argparse.Namespace, meta: dict) -> int:
    names = []
    for n in checks.backend_names("e2e-backends", args.e2e_backends):
        sup = dsa_ops.backends.get(n).availability()
        if sup:
            names.append(n)
        else:
            _progress(0, 0, f"skipping backend {n}: {sup.reason}")
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    rows = e2e.bench_e2e(names, ints(args.e2e_contexts), ints(args.e2e_batches), reps=args.reps,
                         progress=_progress)
    text = table(rows)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "e2e.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "e2e.md"), "w") as f:
        f.write(f"# dsa-ops bench --e2e\n\ndevice: {meta['device']}; torch {meta['torch']}; triton {meta['triton']}; "
                f"{meta['date']}\n\n{e2e.GLM52_INDEXER_LAYERS} indexer layers (bf16 q/k, 8 heads x 64, "
                f"weighted ReLU) + top-k (k = 2048) per step, compiled with IndexerTopKPass routing every "
                f"layer to the named backend, captured as one CUDA graph; median of {args.reps} replays, "
                f"256 MiB written before each (L2 flush). W = context, every row's L = context.\n\n{text}\n")
    bad = [r for r in rows if r["mismatches"]]
    return 1 if bad else 0
