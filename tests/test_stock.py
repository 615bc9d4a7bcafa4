"""Stock vLLM 0.33.0's own decode top-k choice (dsa_ops/commands/bench_stock.py), on synthetic
host facts: the baseline ``dsa-ops bench --stock`` times the routed call against."""

from __future__ import annotations

import pytest

from dsa_ops.commands import bench_stock as S

H100 = (9, 0)


@pytest.mark.parametrize("rows, want", [(1, "cooperative"), (32, "cooperative"), (64, "cooperative"),
                                        (65, "persistent"), (128, "persistent"), (512, "persistent")])
def test_hopper_takes_cooperative_up_to_64_rows_then_persistent(rows, want):
    assert S.stock_choice("decode", "cuda", H100, 2048, rows, 133120) == want


@pytest.mark.parametrize("cap, want", [((8, 0), "persistent"), ((8, 9), "persistent"), ((9, 0), "cooperative"),
                                       ((10, 0), "cooperative"), ((12, 0), "persistent"), ((12, 1), "persistent"),
                                       (None, "persistent")])
def test_cooperative_needs_sm90_or_newer_but_not_sm12x(cap, want):
    assert S.stock_choice("decode", "cuda", cap, 2048, 8, 133120) == want


def test_other_k_pitch_platform_and_prefill():
    assert S.stock_choice("decode", "cuda", H100, 1024, 8, 133120) == "cooperative"
    assert S.stock_choice("decode", "cuda", H100, 4096, 8, 133120) == "per_row"  # no radix kernel for k 4096
    assert S.stock_choice("decode", "cuda", H100, 2048, 8, 133121) == "persistent"  # pitch not a multiple of 4
    assert S.stock_choice("decode", "rocm", H100, 2048, 8, 133120) == "per_row"
    assert S.stock_choice("prefill", "cuda", H100, 2048, 8, 133120) == "per_row"


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
