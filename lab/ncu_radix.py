"""Drive the radix kernel for Nsight Compute: ``ncu -k regex:radix_kernel --launch-skip 2
--launch-count 1 python3 -m lab.ncu_radix ROWS W L [key=value ...]`` (decode), or
``... -m lab.ncu_radix prefill ROWS C [key=value ...]`` (one ROWS-row causal chunk of a
C-token context, as the bench's prefill: row r ends at C - ROWS + r + 1).

Launches the kernel three times on fresh N(0, 1) logits (the first compiles); keyword
arguments go to ``radix_launch.launch`` as ints (e.g. ``dbits=6 num_warps=4 wagg=0``).
"""

from __future__ import annotations

from lab import help_requested

help_requested(__doc__)

import sys

import torch

from dsa_ops.backends.triton import radix_launch as radix

prefill = sys.argv[1] == "prefill"
args = sys.argv[2:] if prefill else sys.argv[1:]
rows, width = int(args[0]), int(args[1])
kw = {a.split("=")[0]: int(a.split("=")[1]) for a in args[3 - prefill:]}
x = torch.randn(rows, width, device="cuda")
out = torch.empty(rows, 2048, dtype=torch.int32, device="cuda")
if prefill:
    s = torch.zeros(rows, dtype=torch.int32, device="cuda")
    e = torch.arange(rows, dtype=torch.int32, device="cuda") + (width - rows + 1)
    call = lambda: radix.launch(x, s, s, e, 2048, 1, True, False, out, **kw)  # noqa: E731
else:
    lt = torch.full((rows,), int(args[2]), dtype=torch.int32, device="cuda")
    call = lambda: radix.launch(x, lt, lt, lt, 2048, 1, False, False, out, **kw)  # noqa: E731
for _ in range(3):
    call()
torch.cuda.synchronize()
knobs = ("slices", "block", "num_warps", "per_sm", "min_slice", "maxnreg")
p, shape = radix.launch_plan(rows, width, x.device, **{n: v for n, v in kw.items() if n in knobs},
                             lanes=bool(kw["lanes"]) if "lanes" in kw else None)
print("plan", p, shape, kw)
