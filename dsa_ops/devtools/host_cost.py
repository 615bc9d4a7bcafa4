"""Host cost of an eager dsa-ops call: what one ``dsa_ops.topk_decode`` / ``topk_prefill`` costs
the CPU beyond launching its kernel (validation, policy, op dispatch).

Each row times N back-to-back calls of one form on a shape whose kernel is short (one row whose
length is under k: the trivial path, a few us of device time), so the loop is bound by the host,
and reports the median per call of 5 rounds (the queue is drained before and after each):

* ``kernel``: the backend's writer called directly (the launch itself);
* ``api``: the public function with ``backend=`` and ``out=`` (the cached eager route);
* ``api policy``: the public function with ``backend=None`` (the policy's choice, cached);
* ``op``: the registered backend op through the dispatcher (what the route skips).

Run on the device: ``python -m dsa_ops.devtools.host_cost [--json PATH]``. A CPU run times the
reference backend's host path on tiny shapes (no kernel), for a rough comparison only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import dsa_ops
from dsa_ops import ops


def _per_call_us(fn, n: int, sync) -> float:
    rounds = []
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t0) / n * 1e6)
        sync()
    return statistics.median(rounds)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows here too")
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    backend = "triton" if cuda else "reference"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rows, width, k = (1, 4096, 2048) if cuda else (2, 4096, 2048)
    x = torch.randn(rows, width, device=dev)
    lens = torch.full((rows,), 2000, dtype=torch.int32, device=dev)
    starts = torch.zeros(rows, dtype=torch.int32, device=dev)
    out = torch.empty(rows, k, dtype=torch.int32, device=dev)
    rec = dsa_ops.backends()[backend]
    d_op = ops.backend_op(backend, "decode", out=True)
    p_op = ops.backend_op(backend, "prefill", out=True)
    forms = {
        "decode kernel": lambda: rec.decode(x, lens, k, 1, False, out),
        "decode api (backend=, out=)": lambda: dsa_ops.topk_decode(x, lens, k, backend=backend, out=out),
        "decode api (policy, out=)": lambda: dsa_ops.topk_decode(x, lens, k, out=out),
        "decode api (policy, new out)": lambda: dsa_ops.topk_decode(x, lens, k),
        "decode op (dispatcher)": lambda: d_op(x, lens, k, 1, 1, False, out),
        "prefill kernel": lambda: rec.prefill(x, starts, lens, k, False, out),
        "prefill api (policy, out=)": lambda: dsa_ops.topk_prefill(x, starts, lens, k, max_seqlen_k=2000, out=out),
        "prefill op (dispatcher)": lambda: p_op(x, starts, lens, k, 1, False, out),
    }
    if not cuda:
        forms = {n: f for n, f in forms.items() if "policy" not in n}  # CPU policy picks the reference too
    res = {}
    for name, fn in forms.items():
        fn()
        res[name] = _per_call_us(fn, args.calls if cuda else 200, sync)
    base = {"decode": res["decode kernel"], "prefill": res["prefill kernel"]}
    print(f"device {torch.cuda.get_device_name() if cuda else 'cpu'}, torch {torch.__version__}, backend {backend}, "
          f"{rows} x {width}, k {k}")
    print("| call form | us a call | over the kernel |\n|---|---|---|")
    for name, us in res.items():
        print(f"| {name} | {us:.1f} | {us - base[name.split()[0]]:+.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev, "torch": torch.__version__, "backend": backend, "us": res}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
