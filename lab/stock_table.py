"""The shipped policy's routed times against stock vLLM, composed from one ``dsa-ops bench --stock``
run that timed each backend the policy can pick (lab tool; no GPU needed).

``bench --stock --policy A,B`` times, per shape, stock vLLM's call and each policy's routed call.
When the shipped policy changes after such a run but picks, at every shape, a backend that one
of the run's policies routed there, its times are already measured: this prints the table of
the shipped policy's choice per shape, with the time of that backend from the same run::

    python -m lab.stock_table BENCH.json dsa_ops/policies/hopper-vllm.json > table.md
"""

from __future__ import annotations

import argparse
import json
import sys

from dsa_ops import policy as P

# What bench --stock's records call a routed backend's run.
RUNS = {"cuda": "cuda", "triton": "triton", "vllm": "vllm", "vllm_persistent": "persistent_topk (vLLM's call)",
        "vllm_cooperative": "cooperative_topk (vLLM's call)"}


def choice(pol: P.Policy, rows: int, width: int, k: int) -> str:
    """The first decode rule of ``pol`` that matches an sm_90 call (every backend assumed available)."""
    facts = P.Facts("cuda", "sm_90", "cuda", k, width=width, rows=rows)
    return next(r.backend for r in pol.decode if r.matches(facts))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench", help="bench.json of a dsa-ops bench --stock run")
    ap.add_argument("policy", help="the policy JSON whose choices to tabulate")
    args = ap.parse_args(argv)
    run = json.load(open(args.bench))
    pol = P.load(args.policy)
    recs = run["records"]
    shapes = sorted({(r["width"], r["rows"], str(r["length"])) for r in recs},
                    key=lambda s: (s[0], s[1], int(s[2]) if s[2].isdigit() else float("inf")))
    print(f"| rows | W | L | stock kernel | stock us | {pol.name}: backend | us | / stock | - stock us |")
    print("|---|---|---|---|---|---|---|---|---|")
    held = 0
    worst = (-1e9, None)
    for w, rows, length in shapes:
        at = [r for r in recs if (r["width"], r["rows"], str(r["length"])) == (w, rows, length)]
        stock = next(r for r in at if r["side"] == "stock")
        want = RUNS[choice(pol, rows, w, run["k"])]
        routed = next((r for r in at if r["side"] != "stock" and r["runs"] == want), None)
        if routed is None:
            print(f"lab.stock_table: {want} was not timed at rows {rows} W {w} L {length}", file=sys.stderr)
            return 2
        d = routed["median_us"] - stock["median_us"]
        held += d <= 1.0
        worst = max(worst, (d, (rows, w, length)))
        miss = " **miss**" if d > 1.0 else ""
        print(f"| {rows} | {w} | {length} | {stock['runs']} | {stock['median_us']:.1f} | {want} | "
              f"{routed['median_us']:.1f} | {routed['median_us'] / stock['median_us']:.2f} | {d:+.1f}{miss} |")
    d, (rows, w, length) = worst
    print(f"\n- {pol.name}: routed <= stock + 1 us at {held} of {len(shapes)} shapes; "
          f"worst {d:+.1f} us at {rows} rows x W {w} x L {length}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
