"""The eager route (``passes.vllm_route``) inside vLLM 0.33.0's real CUDA indexer function.

vLLM's ``sparse_attn_indexer`` runs here as shipped, called directly (DeepSeek-V3.2's
attention does that) and through ``torch.ops.vllm.sparse_attn_indexer`` (the layer's
``forward_cuda``), with a real ``DeepseekV32IndexerMetadata`` under ``set_forward_context``.
Replaced by torch stand-ins, because they are DeepGEMM / CUDA / Triton kernels that cannot
run on this CPU box: the two DeepGEMM logits functions, the K-cache insert, the Triton
pack/unpack helpers, and (route off only) vLLM's ``torch.ops._C.top_k_per_row_*``.
"""

from __future__ import annotations

import types

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here (.ci/vllm-tests runs these in its own venv)")

from vllm import _custom_ops  # noqa: E402
from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.model_executor.layers import indexer_topk  # noqa: E402
from vllm.model_executor.layers import sparse_attn_indexer as sai  # noqa: E402
from vllm.v1.worker import workspace  # noqa: E402

from dsa_ops.testing import assert_decode_equivalent, assert_prefill_equivalent  # noqa: E402
from passes import vllm_route  # noqa: E402
from tests.vllm import route_harness as H  # noqa: E402


@pytest.fixture
def vc():
    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    with set_current_vllm_config(config):
        yield config


@pytest.fixture
def cuda_indexer(monkeypatch, vc):
    """The stand-ins around vLLM's CUDA indexer function; yields a batch whose logits they return."""
    H.define_stock_topk_ops()
    H.reset_counts()
    batch = H.make_batch()
    monkeypatch.setattr(workspace, "_manager", None)
    workspace.init_workspace_manager(torch.device("cpu"))

    def paged_logits(q, kv_cache, weights, seq_lens, block_table, schedule_metadata, max_model_len, indices=None):
        assert max_model_len == H.MAX_MODEL_LEN and q[0].shape[:2] == (2, 2)  # (B, next_n)
        return batch.decode_logits.clone()

    def mqa_logits(q, kv, weights, ks, ke, max_seqlen_k):
        assert max_seqlen_k == batch.meta.prefill.chunks[0].max_seqlen_k
        return batch.prefill_logits.clone()

    inserted = []
    monkeypatch.setattr(sai, "fp8_fp4_paged_mqa_logits", paged_logits)
    monkeypatch.setattr(sai, "fp8_fp4_mqa_logits", mqa_logits)
    monkeypatch.setattr(_custom_ops, "indexer_k_quant_and_cache", lambda k, cache, slots, block, fmt: inserted.append(k))
    monkeypatch.setattr(sai, "pack_seq_triton", H.pack_seq)
    monkeypatch.setattr(sai, "unpack_seq_triton", H.unpack_seq)
    batch.inserted = inserted
    yield batch
    vllm_route.uninstall()


def _layer(vc) -> sai.SparseAttnIndexer:
    cache = types.SimpleNamespace(prefix=H.PREFIX, kv_cache=torch.zeros(4, 64, H.HEAD_DIM + 4, dtype=torch.uint8))
    buf = torch.full((12, H.K), 7, dtype=torch.int32)
    return sai.SparseAttnIndexer(cache, 128, "ue8m0", H.K, H.HEAD_DIM, H.MAX_MODEL_LEN, 3600, buf)


def _run_direct(batch: H.Batch, vc, topk_backend: str) -> torch.Tensor:
    x = H.indexer_inputs(batch)
    q = torch.zeros(batch.num_tokens, H.HEADS, H.HEAD_DIM, dtype=torch.float8_e4m3fn)
    with set_forward_context({H.PREFIX: batch.meta}, vc):
        return sai.sparse_attn_indexer(
            x["hidden_states"], H.PREFIX, x["kv_cache"], q, None, x["k"], x["weights"], 128, "ue8m0", H.K,
            H.HEAD_DIM, H.MAX_MODEL_LEN, 3600, x["topk_indices_buffer"], False, False, False, "",
            topk_backend=topk_backend)


def _run_op(batch: H.Batch, vc, layer: sai.SparseAttnIndexer) -> torch.Tensor:
    """Through the layer's forward_cuda, i.e. ``torch.ops.vllm.sparse_attn_indexer``."""
    x = H.indexer_inputs(batch)
    layer.topk_indices_buffer.fill_(7)
    q = torch.zeros(batch.num_tokens, H.HEADS, H.HEAD_DIM, dtype=torch.float8_e4m3fn)
    with set_forward_context({H.PREFIX: batch.meta}, vc):
        return layer.forward_cuda(x["hidden_states"], q, x["k"], x["weights"])


def _check_rows(buf: torch.Tensor, batch: H.Batch) -> None:
    assert_decode_equivalent(buf[:4], batch.decode_logits, batch.decode_lengths, H.K)
    zeros = torch.zeros_like(batch.prefill_ends)
    assert_prefill_equivalent(buf[4:9], batch.prefill_logits, zeros, batch.prefill_ends, H.K)
    assert (buf[9:] == 7).all()  # rows past the batch untouched


def test_route_on_every_row_comes_from_dsa_ops(cuda_indexer, vc):
    assert vllm_route.install("cuda")
    layer = _layer(vc)
    assert layer.topk_backend == vllm_route.MARK and vllm_route.layers() == {H.PREFIX: vllm_route.MARK}
    with H.counting_policy():
        buf = _run_direct(cuda_indexer, vc, layer.topk_backend)
    assert H.counts["decode_rows"] == 4 and H.counts["prefill_rows"] == 5
    assert H.counts["stock_decode"] == 0 and H.counts["stock_prefill"] == 0
    assert len(cuda_indexer.inserted) == 1  # vLLM's own K-cache insert step ran
    _check_rows(buf, cuda_indexer)


def test_route_on_through_the_custom_op(cuda_indexer, vc):
    assert vllm_route.install("cuda")
    layer = _layer(vc)
    with H.counting_policy():
        buf = _run_op(cuda_indexer, vc, layer)
    assert buf is layer.topk_indices_buffer
    assert H.counts["decode_rows"] == 4 and H.counts["prefill_rows"] == 5
    assert H.counts["stock_decode"] == 0 and H.counts["stock_prefill"] == 0
    _check_rows(buf, cuda_indexer)


def test_route_on_default_policy_matches_the_reference(cuda_indexer, vc):
    """No test policy: the default policy's CPU choice (reference) serves every row."""
    assert vllm_route.install("cuda")
    before = dict(vllm_route.calls)
    buf = _run_direct(cuda_indexer, vc, _layer(vc).topk_backend)
    assert vllm_route.calls["decode"] == before["decode"] + 1 and vllm_route.calls["prefill"] == before["prefill"] + 1
    assert H.counts["stock_decode"] == 0 and H.counts["stock_prefill"] == 0
    _check_rows(buf, cuda_indexer)


def test_route_off_runs_vllms_stock_path(cuda_indexer, vc):
    layer = _layer(vc)
    assert layer.topk_backend == "auto" and vllm_route.installed() is None
    with H.counting_policy():
        buf = _run_op(cuda_indexer, vc, layer)
    assert H.counts["stock_decode"] == 1 and H.counts["stock_prefill"] == 1
    assert H.counts["decode_rows"] == 0 and H.counts["prefill_rows"] == 0
    _check_rows(buf, cuda_indexer)


@pytest.mark.parametrize("change", [dict(topk_tokens=512), dict(compress_ratio=4),
                                    dict(candidate_blocks=torch.zeros(12, 8, dtype=torch.int32))])
def test_other_layers_stay_stock(cuda_indexer, vc, change):
    assert vllm_route.install("cuda")
    cache = types.SimpleNamespace(prefix="other.k_cache", kv_cache=torch.zeros(1))
    args = dict(topk_tokens=H.K, compress_ratio=1, candidate_blocks=None) | change
    layer = sai.SparseAttnIndexer(cache, 128, "ue8m0", args.pop("topk_tokens"), H.HEAD_DIM, H.MAX_MODEL_LEN, 3600,
                                  torch.zeros(1), candidate_block_size=64 if args["candidate_blocks"] is not None
                                  else 0, **args)
    assert layer.topk_backend == "auto" and vllm_route.layers()["other.k_cache"] != vllm_route.MARK
    with H.counting_policy():  # a stock layer's call: vLLM's top-k even with the route installed
        buf = _run_direct(cuda_indexer, vc, layer.topk_backend)
    assert H.counts["stock_decode"] == 1 and H.counts["stock_prefill"] == 1 and H.counts["decode_rows"] == 0
    _check_rows(buf, cuda_indexer)


def test_other_callers_of_the_seams_get_vllms_functions(cuda_indexer, vc):
    assert vllm_route.install("cuda")
    assert isinstance(sai.get_indexer_topk("auto"), indexer_topk.SparseIndexerTopk)
    logits = torch.randn(2, 50)
    out = torch.full((2, H.K), 7, dtype=torch.int32)
    _custom_ops.top_k_per_row_prefill(logits, torch.zeros(2, dtype=torch.int32), torch.tensor([10, 50], dtype=torch.int32),
                                      out, 2, 50, 1, H.K)
    assert H.counts["stock_prefill"] == 1 and H.counts["prefill_rows"] == 0


def test_uninstall_restores_vllm(cuda_indexer, vc):
    before = (sai.get_indexer_topk, _custom_ops.top_k_per_row_prefill, sai.SparseAttnIndexer.__init__)
    assert vllm_route.install("cuda") and vllm_route.install("cuda")  # twice: no stacking
    assert sai.get_indexer_topk is not before[0]
    vllm_route.uninstall()
    assert (sai.get_indexer_topk, _custom_ops.top_k_per_row_prefill, sai.SparseAttnIndexer.__init__) == before
