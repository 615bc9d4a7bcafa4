"""The eager route inside vLLM 0.33.0's real ROCm indexer function, with the AITER gate and
launchers in place.

``rocm_aiter_sparse_attn_indexer`` runs as shipped under ``set_forward_context`` with a real
``DeepseekV32IndexerMetadata`` (the same mixed batch as the CUDA test). vLLM's own
``rocm_aiter_ops.is_indexer_top_k_supported``, ``rocm_aiter_ops.indexer_top_k_decode`` /
``indexer_top_k_prefill`` and ``_launch_aiter_top_k_per_row_prefill`` stay in place. Torch
stand-ins replace what needs a ROCm GPU: the Triton K-cache insert and gather, the two
mqa-logits functions, pack/unpack, the Triton ``_localize`` kernel (counted), the AITER
package's ``aiter.ops.topk`` kernels (chunk-global output, as AITER's), and vLLM's
``torch.ops._C.top_k_per_row_*``. "AITER on" forces vLLM's gfx950 check to yes.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here (.ci/vllm-tests runs these in its own venv)")

from vllm._aiter_ops import rocm_aiter_ops  # noqa: E402
from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.model_executor.layers import sparse_attn_indexer as sai  # noqa: E402
from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rocm  # noqa: E402
from vllm.v1.worker import workspace  # noqa: E402

from dsa_ops.testing import assert_decode_equivalent, assert_prefill_equivalent  # noqa: E402
from passes import vllm_route  # noqa: E402
from tests.vllm import route_harness as H  # noqa: E402


def _aiter_decode(logits, next_n, seq_lens, out, num_rows, stride0, stride1, k):
    """AITER's decode kernel as documented: lengths read flat at r // next_n."""
    H.counts["aiter_decode"] += 1
    ends = seq_lens.reshape(-1).long()[torch.arange(num_rows) // next_n]
    out[:num_rows] = H._masked_topk(logits[:num_rows], torch.zeros_like(ends), ends, k)


def _aiter_prefill(logits, row_starts, row_ends, out, _values, num_rows, stride0, stride1, k):
    """AITER's prefill kernel: chunk-global indices (vLLM localizes them afterwards)."""
    H.counts["aiter_prefill"] += 1
    starts = row_starts.long()
    local = H._masked_topk(logits[:num_rows], starts, row_ends.long(), k)
    out[:num_rows] = torch.where(local >= 0, local + starts[:, None].int(), local)


def _localize(indices, row_starts):
    H.counts["localize"] += 1
    indices.copy_(torch.where(indices < 0, indices, indices - row_starts[:, None]))


@pytest.fixture
def rocm_indexer(monkeypatch):
    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    H.define_stock_topk_ops()
    H.reset_counts()
    batch = H.make_batch()
    chunk_logits = H.global_to_chunk_logits(batch)
    monkeypatch.setattr(workspace, "_manager", None)
    workspace.init_workspace_manager(torch.device("cpu"))
    monkeypatch.setattr(rocm, "indexer_k_quant_and_cache_triton", lambda *a, **kw: None)
    monkeypatch.setattr(rocm, "cp_gather_indexer_k_quant_cache_triton", lambda *a, **kw: None)
    monkeypatch.setattr(rocm, "rocm_fp8_mqa_logits", lambda q, kv, w, ks, ke: chunk_logits.clone())
    monkeypatch.setattr(rocm, "rocm_fp8_paged_mqa_logits",
                        lambda q, kv, w, lens, bt, sm, max_model_len, compress_ratio=1: batch.decode_logits.clone())
    monkeypatch.setattr(rocm, "pack_seq_triton", H.pack_seq)
    monkeypatch.setattr(rocm, "unpack_seq_triton", H.unpack_seq)
    monkeypatch.setattr(rocm, "_localize_aiter_prefill_topk", _localize)
    fake_topk = types.ModuleType("aiter.ops.topk")
    fake_topk.top_k_per_row_decode, fake_topk.top_k_per_row_prefill = _aiter_decode, _aiter_prefill
    for name, mod in (("aiter", types.ModuleType("aiter")), ("aiter.ops", types.ModuleType("aiter.ops")),
                      ("aiter.ops.topk", fake_topk)):
        monkeypatch.setitem(sys.modules, name, mod)
    with set_current_vllm_config(config):
        batch.config = config
        yield batch
    vllm_route.uninstall()


def _aiter_on(monkeypatch) -> None:
    monkeypatch.setattr(rocm_aiter_ops, "is_indexer_top_k_enabled", classmethod(lambda cls: True))


def _layer() -> None:
    cache = types.SimpleNamespace(prefix=H.PREFIX, kv_cache=torch.zeros(1))
    sai.SparseAttnIndexer(cache, 128, "ue8m0", H.K, H.HEAD_DIM, H.MAX_MODEL_LEN, 3600, torch.zeros(1))


def _run(batch: H.Batch) -> torch.Tensor:
    x = H.indexer_inputs(batch)
    q = torch.zeros(batch.num_tokens, H.HEADS, H.HEAD_DIM, dtype=torch.float8_e4m3fn)
    with set_forward_context({H.PREFIX: batch.meta}, batch.config):
        return rocm.rocm_aiter_sparse_attn_indexer(
            x["hidden_states"], H.PREFIX, x["kv_cache"], q, x["k"], x["weights"], 128, "ue8m0", H.K, H.HEAD_DIM,
            H.MAX_MODEL_LEN, 3600, x["topk_indices_buffer"])


def _check_rows(buf: torch.Tensor, batch: H.Batch) -> None:
    assert_decode_equivalent(buf[:4], batch.decode_logits, batch.decode_lengths, H.K)
    zeros = torch.zeros_like(batch.prefill_ends)
    assert_prefill_equivalent(buf[4:9], batch.prefill_logits, zeros, batch.prefill_ends, H.K)


@pytest.mark.parametrize("aiter", [False, True], ids=["aiter-off", "aiter-on"])
def test_rocm_route_on_every_row_from_dsa_ops_no_double_localize(rocm_indexer, monkeypatch, aiter):
    if aiter:
        _aiter_on(monkeypatch)
    assert vllm_route.install("rocm")
    _layer()
    with H.counting_policy():
        buf = _run(rocm_indexer)
    assert H.counts["decode_rows"] == 4 and H.counts["prefill_rows"] == 5
    assert H.counts["localize"] == 0 and H.counts["aiter_decode"] == H.counts["aiter_prefill"] == 0
    assert H.counts["stock_decode"] == H.counts["stock_prefill"] == 0
    _check_rows(buf, rocm_indexer)


def test_rocm_route_off_aiter_off_runs_the_in_tree_kernels(rocm_indexer):
    with H.counting_policy():
        buf = _run(rocm_indexer)
    assert H.counts["stock_decode"] == 1 and H.counts["stock_prefill"] == 1
    assert H.counts["decode_rows"] == 0 and H.counts["prefill_rows"] == 0
    _check_rows(buf, rocm_indexer)


def test_rocm_route_off_aiter_on_runs_aiter_and_localizes_once(rocm_indexer, monkeypatch):
    """The stock gfx950 path: AITER decode; prefill (rows < 32K) stays in-tree."""
    _aiter_on(monkeypatch)
    with H.counting_policy():
        buf = _run(rocm_indexer)
    assert H.counts["aiter_decode"] == 1 and H.counts["stock_prefill"] == 1 and H.counts["localize"] == 0
    assert H.counts["decode_rows"] == 0 and H.counts["prefill_rows"] == 0
    _check_rows(buf, rocm_indexer)


def test_rocm_route_off_aiter_long_prefill_localizes_once(rocm_indexer, monkeypatch):
    """A 32K+ chunk takes AITER's prefill launcher, which localizes once (the baseline
    the routed path must not repeat)."""
    _aiter_on(monkeypatch)
    rocm_indexer.meta.prefill.chunks[0].max_seqlen_k = 40_000  # the gate's host bound only
    with H.counting_policy():
        buf = _run(rocm_indexer)
    assert H.counts["aiter_prefill"] == 1 and H.counts["localize"] == 1
    _check_rows(buf, rocm_indexer)


def test_rocm_stock_layers_and_other_callers_stay_stock(rocm_indexer, monkeypatch):
    _aiter_on(monkeypatch)
    assert vllm_route.install("rocm")
    cache = types.SimpleNamespace(prefix=H.PREFIX, kv_cache=torch.zeros(1))
    sai.SparseAttnIndexer(cache, 128, "ue8m0", 512, H.HEAD_DIM, H.MAX_MODEL_LEN, 3600, torch.zeros(1))
    assert vllm_route.layers()[H.PREFIX] != vllm_route.MARK
    with H.counting_policy():
        buf = _run(rocm_indexer)  # the layer is not marked: AITER / in-tree as stock
    assert H.counts["aiter_decode"] == 1 and H.counts["decode_rows"] == H.counts["prefill_rows"] == 0
    _check_rows(buf, rocm_indexer)
    # A caller outside the indexer function gets vLLM's gate and launcher.
    assert rocm_aiter_ops.is_indexer_top_k_supported(is_prefill=False, compress_ratio=1, num_rows=4,
                                                     max_valid_seq_len=10, topk_tokens=H.K) is True
    out = torch.full((2, H.K), 7, dtype=torch.int32)
    rocm_aiter_ops.indexer_top_k_decode(torch.randn(2, 30), 1, torch.tensor([5, 30], dtype=torch.int32), out, H.K)
    assert H.counts["aiter_decode"] == 2 and H.counts["decode_rows"] == 0
