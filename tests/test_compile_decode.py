"""Compiled decode: no graph breaks, no recompiles across lengths and batch sizes."""

from __future__ import annotations

import torch
from torch._inductor import config as inductor_config

import dsa_ops
import passes
from dsa_ops import ops
from dsa_ops import policy as P
from dsa_ops.indexer import indexer_logits
from dsa_ops.testing import assert_decode_equivalent


def test_inductor_decode_step_no_breaks_no_recompiles():
    """>= 50 length tensors x 3 batch sizes under fail_on_recompile after warm-up."""
    from torch._dynamo.utils import counters

    heads, dim, width, k = 2, 16, 512, 64
    pol = P.Policy(decode=(P.Rule("torch_topk", "fast path"),), prefill=(P.Rule("reference"),))

    def step(q, kc, w, lengths):
        return dsa_ops.topk_decode(indexer_logits(q, kc, w), lengths, k=k)

    g = torch.Generator().manual_seed(0)

    def inputs(batch):
        q = torch.randn(batch, heads, dim, generator=g)
        kc = torch.randn(batch, width, dim, generator=g)
        return q, kc, torch.rand(batch, heads, generator=g)

    torch._dynamo.reset()
    counters.clear()
    with passes.install(pol) as pass_, inductor_config.patch(fx_graph_cache=False):
        compiled = torch.compile(step, fullgraph=True, dynamic=True)
        compiled(*inputs(3), torch.full((3,), width, dtype=torch.int32))  # warm-up compile
        with torch.compiler.set_stance("fail_on_recompile"):
            for batch in (2, 5, 9):
                q, kc, w = inputs(batch)
                for trial in range(17):
                    lengths = torch.randint(0, width + 1, (batch,), generator=g, dtype=torch.int32)
                    lengths[0] = (0, k - 1, k, width)[trial % 4]
                    out = compiled(q, kc, w, lengths)
                    assert_decode_equivalent(out, indexer_logits(q, kc, w), lengths, k)
    assert sum(counters["graph_break"].values()) == 0
    assert counters["stats"]["unique_graphs"] == 1
    assert pass_.count == 1 and pass_.rewrites[0].backend == "torch_topk"


def test_eager_uses_policy_backend(monkeypatch):
    """Eagerly, backend=None takes the policy's choice (a host decision), not the generic op."""
    pol = P.Policy(decode=(P.Rule("torch_topk", "eager pick"),), prefill=(P.Rule("reference"),))
    calls = []
    real = ops.backend_op

    def spy(name, family, out=False):
        calls.append(name)
        return real(name, family, out)

    monkeypatch.setattr(ops, "backend_op", spy)
    x = torch.randn(3, 100)
    lengths = torch.tensor([0, 50, 100], dtype=torch.int32)
    with P.use(pol):
        out = dsa_ops.topk_decode(x, lengths, k=16)
    assert calls == ["torch_topk"]
    assert_decode_equivalent(out, x, lengths, 16)
