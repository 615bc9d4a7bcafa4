"""GPU: the compiled 21-layer indexer decode step under FULL CUDA-graph capture."""

from __future__ import annotations

import pytest
import torch

from dsa_ops import e2e
from dsa_ops import policy as P

pytestmark = pytest.mark.gpu  # CUDA-graph capture

BATCH, WIDTH = 8, 16384


def _expected_backend() -> str:
    return P.current().choose("decode", P.facts_for("cuda", 2048, 1, WIDTH)).backend


def test_captured_step_replays_1000_times_with_new_lengths():
    setup = e2e.build(BATCH, WIDTH)
    with e2e.compiled(setup, None) as (call, rewrites):
        assert len(rewrites) == e2e.GLM52_INDEXER_LAYERS
        assert {r.backend for r in rewrites} == {_expected_backend()}
        graph, out = e2e.capture(call)
        report = e2e.replay_and_check(setup, graph, out, replays=1000)
    assert report.replays == 1000
    assert report.mismatches == 0, report.first_error


def test_reduce_overhead_mode_with_new_lengths():
    from dsa_ops.testing import assert_decode_equivalent

    setup = e2e.build(BATCH, WIDTH, layers=4)
    gen = torch.Generator().manual_seed(1)
    with e2e.compiled(setup, None, mode="reduce-overhead") as (call, rewrites):
        assert len(rewrites) == 4
        logits = setup.layer_logits()
        for _ in range(200):
            setup.lengths.copy_(e2e.random_lengths(BATCH, WIDTH, setup.k, gen))
            out = call().clone()
            for layer, lg in enumerate(logits):
                assert_decode_equivalent(out[layer], lg, setup.lengths, setup.k)


def test_pass_adds_no_kernels():
    backend = _expected_backend()
    routed = e2e.build(BATCH, WIDTH, layers=3)
    with e2e.compiled(routed, None) as (call, rewrites):
        assert {r.backend for r in rewrites} == {backend}
        with_pass = e2e.count_kernels(call)
    explicit = e2e.build(BATCH, WIDTH, layers=3, backend=backend)
    with e2e.compiled(explicit, None, use_pass=False) as (call, rewrites):
        assert rewrites == []
        without_pass = e2e.count_kernels(call)
    assert with_pass == without_pass
