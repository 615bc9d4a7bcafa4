"""vLLM's real top-k kernels through the dsa-ops backends: tie-heavy rows, both widths, row
counts 1-80, lengths past W and negative, and CUDA-graph replay with new lengths.

Runs only where the compiled ops import on a CUDA GPU (built by
``dsa_ops.tools.build_vllm_topk``; docs/vllm-kernels.md); skips elsewhere. On finite
logits (ties of every flavour included) all three backends must meet the contract exactly,
as measured on the H200. Special values (NaN, -0, +-inf, denormals) are held to the
contract only for a backend flagged ``exact``: none of the three is (measured, see
docs/vllm-kernels.md). The full sweep with raw JSON is ``lab.vllm_real_check`` (a checkout's lab/).
"""

from __future__ import annotations

import pytest
import torch

import dsa_ops
from dsa_ops.backends.base import Query
from tests import data

rc = pytest.importorskip("lab.vllm_real_check", reason="lab/ is in a checkout, not in the wheel")

pytestmark = pytest.mark.gpu
NAMES = ("vllm", "vllm_persistent", "vllm_cooperative")


def _record_or_skip(name: str, width: int):
    rec = dsa_ops.backends()[name]
    sup = rec.check(Query("decode", "cuda", 2048, width))
    if not sup:
        pytest.skip(f"{name} cannot run here: {sup.reason}")
    return rec


def _check(name: str, got, x, lengths, k: int = 2048) -> None:
    v = rc.verdict(got, x, lengths, k)
    assert v["ok"], f"{name}: {v['why']}"


@pytest.mark.parametrize("width", [133120, 1048576])
@pytest.mark.parametrize("rows", [1, 8, 64])
@pytest.mark.parametrize("kind", ["equal", "few", "fp16"])
@pytest.mark.parametrize("name", NAMES)
def test_real_vllm_kernels_on_heavy_ties(name, kind, rows, width):
    _record_or_skip(name, width)
    for length in (3072, 32768, 131072):
        gen = torch.Generator(device="cuda").manual_seed(rows + length)
        x = rc.make_logits(kind, rows, width, gen)
        lens = rc.make_lengths(rows, width, length, torch.Generator().manual_seed(length))
        out = data.poisoned_out(rows, 2048, "cuda")
        dsa_ops.topk_decode(x, lens, 2048, backend=name, out=out)
        _check(name, out, x, lens)


@pytest.mark.parametrize("width", [133120, 1048576])
@pytest.mark.parametrize("rows", [1, 64])
@pytest.mark.parametrize("name", NAMES)
def test_real_exact_vllm_kernels_rank_special_values_by_the_contract(name, rows, width):
    """NaN of both signs, +-inf, +-0, denormals: an ``exact`` backend ranks them by
    contract §1.1 (the key order); the others are not held to it."""
    rec = _record_or_skip(name, width)
    if not rec.exact:
        pytest.skip(f"{name} is not exact (documented special-value defects)")
    for length in (3072, 131072):
        x = rc.make_logits("specials", rows, width, torch.Generator(device="cuda").manual_seed(length))
        lens = rc.make_lengths(rows, width, length, torch.Generator().manual_seed(length))
        out = data.poisoned_out(rows, 2048, "cuda")
        dsa_ops.topk_decode(x, lens, 2048, backend=name, out=out)
        _check(name, out, x, lens)


@pytest.mark.parametrize("rows, width", [(1, 1048576), (64, 133120), (80, 1048576)])
@pytest.mark.parametrize("name", NAMES)
def test_real_vllm_kernels_graph_replay_with_new_lengths(name, rows, width):
    """One capture, replayed with lengths from 0 to past W (negative ones mixed in)."""
    from dsa_ops.benchmarking import capture

    _record_or_skip(name, width)
    x = rc.make_logits("randn", rows, width, torch.Generator(device="cuda").manual_seed(rows))
    lens = torch.full((rows,), 4096, dtype=torch.int32, device="cuda")
    out = torch.empty(rows, 2048, dtype=torch.int32, device="cuda")
    graph = capture(lambda: dsa_ops.topk_decode(x, lens, 2048, backend=name, out=out))
    for i, length in enumerate((3072, 131072, 0, 2049, width)):
        lens.copy_(rc.make_lengths(rows, width, length, torch.Generator().manual_seed(i)))
        out.fill_(data.POISON)
        graph.replay()
        torch.cuda.synchronize()
        _check(name, out, x, lens)


def test_real_vllm_kernels_per_request_lengths():
    """next_n = 2 with one length per request: the adapters' layout work on the GPU."""
    width, next_n, batch = 133120, 2, 8
    for name in NAMES:
        _record_or_skip(name, width)
        x = rc.make_logits("randn", batch * next_n, width, torch.Generator(device="cuda").manual_seed(3))
        lens = torch.tensor([0, 1, 2048, 5000, 40_000, width, width + 7, -3], dtype=torch.int32, device="cuda")
        got = dsa_ops.topk_decode(x, lens, 2048, next_n=next_n, backend=name)
        from dsa_ops.testing import assert_decode_equivalent

        assert_decode_equivalent(got, x, lens, 2048, next_n=next_n)
