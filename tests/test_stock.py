"""Stock vLLM 0.33.0's own decode top-k choice (dsa_ops/stock.py) and bench --stock, on synthetic
host facts: the baseline ``dsa-ops bench --stock`` times the routed call against."""

from __future__ import annotations

import pytest

from dsa_ops import stock
from dsa_ops.commands import bench_stock as S

H100 = (9, 0)


@pytest.mark.parametrize("rows, want", [(1, "cooperative"), (32, "cooperative"), (64, "cooperative"),
                                        (65, "persistent"), (128, "persistent"), (512, "persistent")])
def test_hopper_takes_cooperative_up_to_64_rows_then_persistent(rows, want):
    assert stock.stock_choice("decode", "cuda", H100, 2048, rows, 133120) == want


@pytest.mark.parametrize("cap, want", [((8, 0), "persistent"), ((8, 9), "persistent"), ((9, 0), "cooperative"),
                                       ((10, 0), "cooperative"), ((12, 0), "persistent"), ((12, 1), "persistent"),
                                       (None, "persistent")])
def test_cooperative_needs_sm90_or_newer_but_not_sm12x(cap, want):
    assert stock.stock_choice("decode", "cuda", cap, 2048, 8, 133120) == want


def test_other_k_pitch_platform_and_prefill():
    assert stock.stock_choice("decode", "cuda", H100, 1024, 8, 133120) == "cooperative"
    assert stock.stock_choice("decode", "cuda", H100, 4096, 8, 133120) == "per_row"  # no radix kernel for k 4096
    assert stock.stock_choice("decode", "cuda", H100, 2048, 8, 133121) == "persistent"  # pitch not a multiple of 4
    assert stock.stock_choice("decode", "rocm", H100, 2048, 8, 133120) == "per_row"
    assert stock.stock_choice("prefill", "cuda", H100, 2048, 8, 133120) == "per_row"


def test_stock_table_counts_where_routed_is_within_a_microsecond():
    def rec(side, rows, us, runs="x", ok="ok"):
        return {"family": "decode", "rows": rows, "width": 133120, "length": 4096, "side": side, "runs": runs,
                "median_us": us, "verified": ok}

    records = [rec("stock", 1, 10.0, "cooperative_topk"), rec("routed:p", 1, 10.9, "cuda"),
               rec("stock", 128, 40.0, "persistent_topk"), rec("routed:p", 128, 45.0, "cuda"),
               rec("stock", 2, 10.0), rec("routed:p", 2, 5.0, ok="FAIL: row 0")]
    text, summary = S.table(records, ["p"])
    assert "| 1 | 133120 | 4096 | cooperative_topk | 10.0 | cuda | 10.9 | 1.09 | +0.9 |" in text
    assert "| 128 | 133120 | 4096 | persistent_topk | 40.0 | cuda | 45.0 | 1.12 | +5.0 **miss** |" in text
    assert "x (WRONG)" in text and "-5.0 **miss**" in text  # a wrong output never holds
    assert summary == ["- p: routed <= stock + 1 us at 1 of 3 shapes; worst +5.0 us at 128 rows x W 133120 x L 4096"]


def test_policy_labels(tmp_path):
    from dsa_ops import policy as P

    path = tmp_path / "mine.json"
    P.save(P.DEFAULT, path)
    pols = S.policies(f"builtin,default,{path}")
    assert list(pols) == ["builtin", "default", "mine"] and pols["builtin"] is P.DEFAULT
    from dsa_ops.commands.checks import UsageError

    with pytest.raises(UsageError, match="two policies are labelled 'mine'"):
        S.policies(f"{path},{path}")


# ------------------------------------------------------------------ the bench's calls, on the CPU

@pytest.fixture
def fake_vllm_ops():
    from tests.standins import fake_vllm_kernels

    with fake_vllm_kernels() as ran:
        yield ran


def _eager_runner(call, reps):
    return call, lambda: {"median_us": 10.0, "p10_us": 9.0, "p90_us": 11.0, "n": reps}


@pytest.mark.parametrize("rows, kernel", [(4, "cooperative_topk"), (80, "persistent_topk")])
def test_case_runs_stock_and_each_routed_policy_and_checks_both(fake_vllm_ops, rows, kernel):
    from dsa_ops import policy as P

    pols = {"builtin": P.DEFAULT, "tt": P.Policy(decode=(P.Rule("torch_topk"),), prefill=(P.Rule("reference"),))}
    recs = S.case(rows, 3000, 2500, 512, 30, 8, pols, device="cpu", runner=_eager_runner, capability=H100)
    assert [(r["side"], r["runs"], r["verified"]) for r in recs] == [
        ("stock", kernel, "ok"), ("routed:builtin", "reference", "ok"), ("routed:tt", "torch_topk", "ok")]
    assert fake_vllm_ops == [kernel.split("_")[0] + "_topk"]
    recs = S.case(2, 3000, "mixed", 512, 30, 8, pols, device="cpu", runner=_eager_runner, capability=(8, 0))
    assert recs[0]["runs"] == "persistent_topk" and all(r["verified"] == "ok" for r in recs)


def test_the_stock_call_fills_before_the_kernel(fake_vllm_ops):
    """Stock's buffer is vLLM's, -1 filled before the top-k: a kernel that writes only the valid
    prefix still yields -1 past min(L, k)."""
    import torch

    x = torch.randn(3, 100)
    lens = torch.tensor([10, 100, 0], dtype=torch.int32)
    out = torch.full((3, 64), 7, dtype=torch.int32)
    stock.stock_call("per_row", x, lens, 64, out, 100)()
    assert (out[0, 10:] == -1).all() and (out[2] == -1).all()
    with pytest.raises(ValueError, match="choice: expected one of"):
        stock.stock_call("deep_select", x, lens, 64, out, 100)


def test_run_writes_the_side_by_side_table(tmp_path, monkeypatch, capsys):
    import argparse

    from dsa_ops.commands import bench

    def fake_case(rows, width, length, k, reps, nver, pols):
        st = {"family": "decode", "rows": rows, "width": width, "length": length, "verified": "ok"}
        return [{**st, "side": "stock", "runs": "cooperative_topk", "median_us": 10.0},
                *({**st, "side": f"routed:{lab}", "runs": "cuda", "median_us": 9.0 + rows} for lab in pols)]

    monkeypatch.setattr(S, "available", lambda: "")
    monkeypatch.setattr(S, "case", fake_case)
    monkeypatch.setattr(bench, "_meta", lambda: {"device": "H100 (fake)", "torch": "t", "triton": "tr", "date": "d",
                                                 "timing": "graph replay"})
    args = argparse.Namespace(widths="133120", rows="1,2", lengths="4096, mixed", k=2048, reps=30, verify_rows=8,
                              policy="builtin", out=str(tmp_path))
    assert S.run(args) == 0
    md = (tmp_path / "bench.md").read_text()
    assert "| 1 | 133120 | 4096 | cooperative_topk | 10.0 | cuda | 10.0 | 1.00 | +0.0 |" in md
    assert "| 2 | 133120 | mixed | cooperative_topk | 10.0 | cuda | 11.0 | 1.10 | +1.0 |" in md
    assert "- builtin: routed <= stock + 1 us at 4 of 4 shapes" in md
    import json

    assert json.loads((tmp_path / "bench.json").read_text())["mode"] == "stock"


def test_the_routed_side_is_the_routes_call_so_picking_vllms_kernel_costs_stocks_call(fake_vllm_ops, monkeypatch):
    """A policy that picks vllm_cooperative: the routed side runs vLLM's own kernel call (as the
    CUDA route does), not the adapter, and says so."""
    import dataclasses

    from dsa_ops import policy as P
    from dsa_ops.backends import BACKENDS
    from dsa_ops.backends.base import YES
    from passes import vllm_route

    monkeypatch.setitem(BACKENDS, "vllm_cooperative", dataclasses.replace(
        BACKENDS["vllm_cooperative"], available=lambda: YES, supports=lambda q: YES, faults="", _cache={}))
    monkeypatch.setattr(vllm_route, "VLLM_CALL_DEVICES", ("cpu",))
    monkeypatch.setattr(vllm_route, "_vllm_call", {})
    pols = {"vc": P.Policy(decode=(P.Rule("vllm_cooperative"),), prefill=(P.Rule("reference"),))}
    recs = S.case(8, 3000, 2500, 512, 30, 8, pols, device="cpu", runner=_eager_runner, capability=H100)
    assert [(r["side"], r["runs"], r["verified"]) for r in recs] == [
        ("stock", "cooperative_topk", "ok"), ("routed:vc", "cooperative_topk (vLLM's call)", "ok")]
    assert fake_vllm_ops == ["cooperative_topk", "cooperative_topk"]
