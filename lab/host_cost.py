"""Host cost of an eager dsa-ops call: what ``dsa_ops.topk_decode`` / ``topk_prefill`` cost the CPU
beyond the kernel launch itself (host checks, policy, route lookup, dispatch).

Two groups of rows, each the per-call time of N back-to-back calls, the minimum over 7 rounds
that interleave the forms (so a slow stretch of a shared host hits every form alike):

* ``no-op``: a test-only backend whose writer does nothing, so the row is the wrapper alone:
  ``writer`` (the bare function call), ``api`` with ``backend=`` and ``out=`` (the cached
  eager route), ``api`` with the policy's choice, ``api`` allocating ``out``, and the backend op
  through the dispatcher (what the route skips on plain tensors);
* ``triton`` and ``cuda`` (CUDA only): the same forms around the real launch, on one row
  shorter than k (the trivial path, a few us of device time, so the loop is bound by the host).

Run on the device: ``python -m lab.host_cost [--json PATH]``; on the CPU only the
no-op group runs.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import dsa_ops
from dsa_ops import ops
from dsa_ops import policy as P
from dsa_ops.backends import register
from dsa_ops.backends.base import YES, Backend

NOP = "host_cost_nop"


def _nop_backend() -> None:
    if NOP not in dsa_ops.backends(include_test_only=True):
        register(Backend(NOP, decode=lambda *a: None, prefill=lambda *a: None, available=lambda: YES,
                         supports=lambda q: YES, version=lambda: "0", test_only=True,
                         description="host_cost: does nothing"))


def _forms(backend: str, dev: str) -> dict:
    k = 2048
    x = torch.randn(1, 4096, device=dev)
    lens = torch.full((1,), 2000, dtype=torch.int32, device=dev)
    starts = torch.zeros(1, dtype=torch.int32, device=dev)
    out = torch.empty(1, k, dtype=torch.int32, device=dev)
    rec = dsa_ops.backends(include_test_only=True)[backend]
    d_op = ops.backend_op(backend, "decode", out=True)
    return {
        "decode writer": lambda: rec.decode(x, lens, k, 1, False, out),
        "decode api backend= out=": lambda: dsa_ops.topk_decode(x, lens, k, backend=backend, out=out),
        "decode api policy out=": lambda: dsa_ops.topk_decode(x, lens, k, out=out),
        "decode api policy (allocates out)": lambda: dsa_ops.topk_decode(x, lens, k),
        "decode op through the dispatcher": lambda: d_op(x, lens, k, 1, 1, False, out),
        "prefill writer": lambda: rec.prefill(x, starts, lens, k, False, out),
        "prefill api policy out=": lambda: dsa_ops.topk_prefill(x, starts, lens, k, max_seqlen_k=2000, out=out),
    }


def measure(backend: str, dev: str, calls: int, rounds: int = 7) -> dict:
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    forms = _forms(backend, dev)
    pol = P.Policy(decode=(P.Rule(backend),), prefill=(P.Rule(backend),))
    best = {name: float("inf") for name in forms}
    with P.use(pol):
        for fn in forms.values():
            fn()
        for _ in range(rounds):
            for name, fn in forms.items():
                sync()
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                best[name] = min(best[name], (time.perf_counter() - t0) / calls * 1e6)
                sync()
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows here too")
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    _nop_backend()
    groups = {"no-op": measure(NOP, "cuda" if cuda else "cpu", args.calls)}
    if cuda:
        groups["triton"] = measure("triton", "cuda", args.calls)
        if dsa_ops.backends()["cuda"].availability():
            groups["cuda"] = measure("cuda", "cuda", args.calls)
    print(f"{torch.cuda.get_device_name() if cuda else 'cpu'}, torch {torch.__version__}; one row, W 4096, L 2000, "
          f"k 2048; min over 7 interleaved rounds of {args.calls} calls")
    print("| backend | call form | us a call | over the writer |\n|---|---|---|---|")
    for group, res in groups.items():
        for name, us in res.items():
            base = res[name.split()[0] + " writer"]
            print(f"| {group} | {name} | {us:.1f} | {us - base:+.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "us": groups}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
