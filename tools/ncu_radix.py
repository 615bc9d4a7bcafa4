"""Drive the radix decode kernel for Nsight Compute: ``ncu -k regex:radix_kernel
--launch-skip 2 --launch-count 1 python3 tools/ncu_radix.py ROWS W L [key=value ...]``.

Launches the kernel three times on fresh N(0, 1) logits (the first compiles); keyword
arguments go to ``radix_launch.launch`` as ints (e.g. ``dbits=6 num_warps=4``).
"""

from __future__ import annotations

import sys

import torch

from dsa_ops.backends.triton import radix_launch as radix

rows, width, L = (int(a) for a in sys.argv[1:4])
kw = {a.split("=")[0]: int(a.split("=")[1]) for a in sys.argv[4:]}
x = torch.randn(rows, width, device="cuda")
lt = torch.full((rows,), L, dtype=torch.int32, device="cuda")
out = torch.empty(rows, 2048, dtype=torch.int32, device="cuda")
for _ in range(3):
    radix.launch(x, lt, lt, lt, 2048, 1, False, False, out, **kw)
torch.cuda.synchronize()
t = {**radix.tuning(rows), **{k: v for k, v in kw.items() if k in ("block", "num_warps", "per_sm")}}
if "num_warps" in kw and "per_sm" not in kw:
    t["per_sm"] = None  # as launch: the default for that warp count
print("tuning", t, "plan", radix.plan(rows, width, x.device, block=t["block"], num_warps=t["num_warps"],
                                      per_sm=t["per_sm"]), kw)
