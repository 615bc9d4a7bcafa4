"""Merge two ``dsa-ops bench`` runs of the triton backend, one with the bracket forced on
(DSA_OPS_TRITON_BRACKET=1, every backend) and one with it forced off (=0, triton only),
into the table of the shipped rule: ``triton`` is the configuration that
``radix_launch.use_bracket`` picks for each shape; the forced runs stay as the columns
``triton bracket on`` / ``triton bracket off``.

    python tools/merge_bench.py ON_DIR OFF_DIR OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys

from dsa_ops.backends.triton import radix_launch
from dsa_ops.commands.bench import PREFILL_ROWS, _plot, _table


def shipped(rec: dict) -> bool:
    """Whether the shipped rule brackets this bench shape (the plan an H200, 132 SMs, gets)."""
    os.environ["DSA_OPS_TRITON_BRACKET"] = "auto"
    if rec["family"] == "prefill":
        p = radix_launch.RadixPlan(grid0=PREFILL_ROWS, slices=1, cand_cap=0, rank_budget=0)
    else:
        t = radix_launch.tuning(rec["rows"])
        slices = max(1, min(-(-rec["width"] // t["block"]), 132 * t["per_sm"] // rec["rows"], radix_launch.MAX_ACT))
        p = radix_launch.RadixPlan(grid0=rec["rows"], slices=slices, cand_cap=0, rank_budget=0)
    return radix_launch.use_bracket(p)


def main(on_dir: str, off_dir: str, out_dir: str) -> None:
    on = json.load(open(os.path.join(on_dir, "bench.json")))
    off = json.load(open(os.path.join(off_dir, "bench.json")))
    key = lambda r: (r["family"], r["rows"], r["width"], str(r["length"]))  # noqa: E731
    off_tri = {key(r): r for r in off["records"] if r["backend"] == "triton"}
    recs = []
    for r in on["records"]:
        if r["backend"] != "triton":
            recs.append(r)
            continue
        o = off_tri[key(r)]
        recs += [{**r, "backend": "triton bracket on"}, {**o, "backend": "triton bracket off"},
                 {**(r if shipped(r) else o), "backend": "triton"}]
    names = [n for n in dict.fromkeys(r["backend"] for r in recs)]
    names = ["triton"] + [n for n in names if n != "triton"]
    meta = {**on["meta"], "merged": f"triton = the shipped rule (radix_launch.use_bracket) over two runs: "
            f"{on['meta']['date']} (bracket on, every backend) and {off['meta']['date']} (bracket off)"}
    os.makedirs(out_dir, exist_ok=True)
    table = _table(recs, names)
    json.dump({"meta": meta, "k": on["k"], "records": recs}, open(os.path.join(out_dir, "bench.json"), "w"), indent=1)
    with open(os.path.join(out_dir, "bench.md"), "w") as f:
        f.write(f"# dsa-ops bench\n\ndevice: {meta['device']}; torch {meta['torch']}; triton {meta['triton']}; "
                f"{meta['merged']}\n\nk = {on['k']}. {meta['timing']}. Target = 0.8x vLLM cooperative_topk "
                f"(and <= 10 us at 128K for rows <= 16); prefill target 3.0 ms at C = 128K.\n\n{table}\n")
    print(table)
    print(_plot(recs, names, os.path.join(out_dir, "bench.png")))


if __name__ == "__main__":
    main(*sys.argv[1:4])
