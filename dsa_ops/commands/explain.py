"""Compile the demo decode step with passes.IndexerTopKPass and show every top-k node with
the backend the policy chose and why, which policy applies and why (a file, or this host's
default: a shipped Hopper policy with or without vLLM's kernels, or the built-in rules), the
decode backend by row count (the row bands), the prefill guards on max_seqlen_k, and the pass
uuid."""

from __future__ import annotations

import argparse
import os

import torch

import dsa_ops
from dsa_ops import ops
from dsa_ops import policy as P
from dsa_ops.commands import checks
from dsa_ops.commands.demo import build_step

HELP = "show which backend each compiled top-k node gets, the prefill guards and the pass uuid"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", help="policy JSON file (default: $DSA_OPS_POLICY, else this host's default: a shipped "
                   "Hopper policy or the built-in rules)")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--width", type=int, default=8192, help="decode logits width W (default: 8192)")
    p.add_argument("--layers", type=int, default=2, help="indexer layers (default: 2)")
    p.add_argument("--k", type=int, default=2048, help="top-k (default: 2048)")
    p.add_argument("--rows", type=int, default=4, help="decode rows of the compiled step (default: 4)")


BY_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # the row counts the decode-by-rows table shows


def policy_source(path: str | None) -> str:
    """Where the policy in force comes from, and why (the default's choice says which and why)."""
    if path:
        return f"--policy {path}"
    if os.environ.get(P.ENV_VAR):
        return f"${P.ENV_VAR}={os.environ[P.ENV_VAR]}"
    return f"this host's default: {P._default_here().why}"


def by_rows(pol, device: str, k: int, width: int) -> list[tuple[str, str, str]]:
    """(rows, backend, reason) over the row counts in BY_ROWS (neighbours with the same choice
    merged: "1..16") and for an unbounded symbolic row count."""
    out: list[list] = []
    for r in BY_ROWS:
        choice = pol.choose("decode", P.facts_for(device, k, 1, width, rows=r))
        if out and out[-1][1:] == [choice.backend, choice.reason]:
            out[-1][0] = f"{out[-1][0].split('..')[0]}..{r}"
        else:
            out.append([str(r), choice.backend, choice.reason])
    sym = pol.choose("decode", P.facts_for(device, k, 1, width, rows_bounds=(2, None)))
    return [tuple(x) for x in out] + [("symbolic [2, inf]", sym.backend, sym.reason)]


def decode_rewrites(step: torch.nn.Module, example: tuple, pol) -> list:
    """Compile ``step`` with the pass (cache off, so the pass really runs); return its rewrites."""
    import passes
    from torch._inductor import config as inductor_config

    torch._dynamo.reset()
    with passes.install(pol) as pass_, inductor_config.patch(fx_graph_cache=False), torch.no_grad():
        torch.compile(step, fullgraph=True)(*example)
    return pass_.rewrites


def prefill_guards(pol, device: str, k: int) -> list[tuple[int, list[str], str]]:
    """For one max_seqlen_k on each side of the threshold: the dynamo guards on it and the op called."""
    x = torch.randn(4, 256, device=device)
    s = torch.zeros(4, dtype=torch.int32, device=device)
    e = torch.full((4,), 200, dtype=torch.int32, device=device)

    def prefill(x, s, e, max_seqlen_k):
        return dsa_ops.topk_prefill(x, s, e, k=k, max_seqlen_k=max_seqlen_k)

    names = {ops.backend_op(b, "prefill"): b for b in dsa_ops.backends(include_test_only=True)
             if dsa_ops.backends.get(b).prefill is not None}
    rows = []
    for m in (max(pol.prefill_threshold - 1, 0), pol.prefill_threshold):
        torch._dynamo.reset()
        with dsa_ops.policy.use(pol), torch.compiler.config.patch(dynamic_sources="L['max_seqlen_k']"):
            ex = torch._dynamo.explain(prefill)(x, s, e, m)
        code = [c for g in ex.out_guards for c in (g.code_list or []) if "max_seqlen_k" in c and "type" not in c]
        called = [names[n.target] for gm in ex.graphs for n in gm.graph.nodes if n.target in names]
        rows.append((m, code, ", ".join(called) or "?"))
    return rows


def run(args: argparse.Namespace) -> int:
    import passes

    checks.device(args.device)
    checks.at_least("width", args.width, 1)
    checks.at_least("layers", args.layers, 1)
    checks.top_k(args.k)
    pol = checks.policy(args.policy)
    checks.at_least("rows", args.rows, 1)
    step, example = build_step(args.device, batch=args.rows, width=args.width, layers=args.layers, k=args.k, seed=0,
                               rows_option="rows")
    print(f"policy: {pol.name} (hash {pol.content_hash()[:16]}), prefill threshold {pol.prefill_threshold}, "
          f"stable={pol.stable}")
    print(f"  from {policy_source(args.policy)}")
    platform, arch = P.device_platform(torch.device(args.device).type)
    print(f"device: {args.device} (platform {platform}{', arch ' + arch if arch else ''})")
    print(f"\ndecode: {args.layers}-layer indexer step, {args.rows} rows, W={args.width}, k={args.k}, compiled with "
          f"inductor")
    for rw in decode_rewrites(step, example, pol):
        print(f"  {rw.node:<16} {rw.form:<10} -> dsa_ops::topk_decode_{rw.backend}")
        print(f"  {'':<16} why: {rw.reason}")
    choice = pol.choose("decode", P.facts_for(args.device, args.k, 1, args.width, rows=args.rows))
    for why in choice.skipped:
        print(f"  {'':<16} skipped {why}")
    print(f"\ndecode by row count (W={args.width}; a captured graph has one row count, a dynamic one its range):")
    for label, backend, reason in by_rows(pol, args.device, args.k, args.width):
        print(f"  rows {label:<17} -> {backend:<17} {reason}")
    print(f"\nprefill: host branch on max_seqlen_k >= {pol.prefill_threshold} (a dynamo guard when compiled)")
    for m, code, called in prefill_guards(pol, args.device, min(args.k, 64)):
        print(f"  max_seqlen_k={m:<8} guards {code or ['(none)']} -> {called}")
    print(f"\npass uuid: {passes.IndexerTopKPass(pol).uuid()}")
    print(f"dsa_ops {dsa_ops.__version__}, torch {torch.__version__}")
    return 0
