"""One shape of the ``cuda`` backend's kernel, launched three times, for Nsight Compute
(device only): ``python -m lab.ncu_cuda_topk ROWS W L [CLUSTER]``.
``lab/ncu_cuda_topk.sh`` runs ncu on the third launch."""

from __future__ import annotations

from lab import help_requested

help_requested(__doc__)

import sys

import torch


def main(argv: list[str]) -> None:
    from dsa_ops.backends.cuda import topk

    rows, width, length = (int(v) for v in argv[:3])
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, width, device="cuda", generator=g)
    lens = torch.full((rows,), length, dtype=torch.int32, device="cuda")
    out = torch.empty(rows, 2048, dtype=torch.int32, device="cuda")
    plan = topk.plan(rows, width, device=0).shape
    if len(argv) > 3:
        facts = topk.device_facts(0)
        plan = topk.make_plan(rows, width, facts.sms, facts.smem_block, cluster=int(argv[3]))
    for _ in range(3):
        topk.launch(x, lens, lens, lens, 0, 1, 2048, out, plan=plan)
    torch.cuda.synchronize()
    print(plan)


if __name__ == "__main__":
    main(sys.argv[1:])
