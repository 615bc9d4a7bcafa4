"""Row bands (issue 46): rules chosen by the row count, in the policy, its JSON, the pass (concrete
and symbolic rows), the eager API and the eager vLLM route."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import Iterator

import pytest
import torch
from torch._inductor import config as inductor_config

import dsa_ops
import passes
from dsa_ops import policy as P
from dsa_ops.backends import BACKENDS, reference, register
from dsa_ops.backends.base import YES, Backend
from dsa_ops.testing import assert_decode_equivalent

FEW, MANY = "rows_few_double", "rows_many_double"
calls = {FEW: 0, MANY: 0}


def _counting(name: str) -> Backend:
    def decode(logits, lengths, k, next_n, stable, out):
        calls[name] += 1
        reference.decode(logits, lengths, k, next_n, stable, out)

    return Backend(name, decode, reference.prefill, lambda: YES, lambda q: YES, lambda: "test",
                   description="test-only: reference, counting calls", test_only=True)


@contextlib.contextmanager
def banded(split: int = 64) -> Iterator[P.Policy]:
    """FEW serves rows below ``split``, MANY at or above it; anything else falls to reference."""
    for name in (FEW, MANY):
        BACKENDS.pop(name, None)
        register(_counting(name))
        calls[name] = 0
    pol = P.Policy(decode=(P.Rule(FEW, "few rows", max_rows=split), P.Rule(MANY, "many rows", min_rows=split),
                           P.Rule("reference", "fallback")), prefill=(P.Rule("reference"),), name="rows-test")
    try:
        with P.use(pol):
            yield pol
    finally:
        for name in (FEW, MANY):
            BACKENDS.pop(name, None)


def _facts(**kw) -> P.Facts:
    return dataclasses.replace(P.facts_for("cpu", 64, 1, 1000), **kw)


# ------------------------------------------------------------------ the rule and the choice

@pytest.mark.parametrize("rows, bounds, want", [
    (1, (0, None), True), (63, (0, None), True), (64, (0, None), False),
    (None, (2, 63), True), (None, (2, 64), False), (None, (2, None), False), (None, (0, 10), True),
])
def test_row_band_on_concrete_and_symbolic_rows(rows, bounds, want):
    rule = P.Rule("x", max_rows=64)
    assert rule.rows_hold(_facts(rows=rows, rows_bounds=bounds)) is want


def test_a_rule_without_a_row_band_holds_for_any_rows_known_or_not():
    rule = P.Rule("x")
    assert all(rule.rows_hold(_facts(rows=r, rows_bounds=b)) for r, b in ((None, (0, None)), (7, (7, 7)), (None, (2, None))))
    low = P.Rule("x", min_rows=8)
    assert [low.rows_hold(_facts(rows=r)) for r in (7, 8, 10**6)] == [False, True, True]
    assert low.rows_hold(_facts(rows_bounds=(8, None))) and not low.rows_hold(_facts(rows_bounds=(7, None)))


def test_choice_by_rows_records_why_a_symbolic_range_missed_the_band():
    with banded() as pol:
        assert pol.choose("decode", _facts(rows=3)).backend == FEW
        assert pol.choose("decode", _facts(rows=64)).backend == MANY
        assert pol.choose("decode", _facts(rows_bounds=(2, 63))).backend == FEW
        straddle = pol.choose("decode", _facts(rows_bounds=(2, 128)))
        assert straddle.backend == "reference"
        assert straddle.skipped == (
            f"rule 1 ({FEW}): the row count is symbolic in [2, 128], not inside the row band [0, 64)",
            f"rule 2 ({MANY}): the row count is symbolic in [2, 128], not inside the row band [64, inf)")
        # concrete rows outside a band are no reason to list the rule
        assert pol.choose("decode", _facts(rows=100)).skipped == ()


# ------------------------------------------------------------------ JSON

def test_row_bands_round_trip_and_change_the_hash(tmp_path):
    pol = P.Policy(decode=(P.Rule("torch_topk", min_rows=2, max_rows=64), P.Rule("reference")),
                   prefill=(P.Rule("reference", max_rows=4096),))
    path = tmp_path / "rows.json"
    P.save(pol, path)
    data = json.loads(path.read_text())
    assert data["decode"][0]["min_rows"] == 2 and data["decode"][0]["max_rows"] == 64
    assert "min_rows" not in data["decode"][1]  # defaults are left out (old files keep their hash)
    loaded = P.load(path)
    assert loaded.decode == pol.decode and loaded.content_hash() == pol.content_hash()
    for change in ({"max_rows": 65}, {"min_rows": 1}, {"max_rows": None}):
        other = dataclasses.replace(pol, decode=(dataclasses.replace(pol.decode[0], **change),) + pol.decode[1:])
        assert other.content_hash() != pol.content_hash(), change
    assert P.DEFAULT.content_hash() == P.from_dict(P.DEFAULT.to_dict()).content_hash()


@pytest.mark.parametrize("rule, message", [
    ({"max_rows": -1}, "decode[0].max_rows: expected a non-negative int or null, got -1"),
    ({"min_rows": "8"}, "decode[0].min_rows: expected a non-negative int or null, got '8'"),
    ({"max_rows": True}, "decode[0].max_rows: expected a non-negative int or null, got True"),
    ({"max_rows": 1.5}, "decode[0].max_rows: expected a non-negative int or null, got 1.5"),
    ({"min_rows": None}, "decode[0].min_rows: expected a non-negative int, got null"),
    ({"min_rows": 64, "max_rows": 64}, "decode[0].max_rows: expected more than min_rows (64), got 64"),
    ({"min_width": 10, "max_width": 5}, "decode[0].max_width: expected more than min_width (10), got 5"),
    ({"rows": 4}, "decode[0]: unknown field(s) ['rows']"),
])
def test_bad_row_bands_name_the_file_and_the_field(tmp_path, rule, message):
    import re

    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"decode": [{"backend": "reference", **rule}]}))
    with pytest.raises(ValueError, match=re.escape(f"policy ({path}): {message}")):
        P.load(path)


# ------------------------------------------------------------------ the pass

def _compile(rows: int, mark: tuple | None, dynamic: bool | None):
    x = torch.randn(rows, 300)
    lt = torch.randint(0, 301, (rows,), dtype=torch.int32)
    if mark:
        torch._dynamo.mark_dynamic(x, 0, min=mark[0], max=mark[1])
        torch._dynamo.mark_dynamic(lt, 0, min=mark[0], max=mark[1])
    with banded() as pol, passes.install(pol) as pass_, inductor_config.patch(fx_graph_cache=False):
        f = torch.compile(lambda x, lt: dsa_ops.topk_decode(x, lt, k=16), fullgraph=True, dynamic=dynamic)
        assert_decode_equivalent(f(x, lt), x, lt, 16)
    assert pass_.count == 1
    return pass_.rewrites[0]


@pytest.mark.parametrize("rows, want", [(4, FEW), (80, MANY)])
def test_pass_picks_by_a_static_row_count(fresh_dynamo, rows, want):
    rw = _compile(rows, None, False)
    assert (rw.backend, rw.rows) == (want, rows)


@pytest.mark.parametrize("mark, want, why", [
    # mark_dynamic's max is inclusive: [2, 64] is not inside [0, 64)
    ((2, 64), "reference", "the row count is symbolic in [2, 64], not inside the row band [0, 64)"),
    ((2, 63), FEW, None),
    ((64, 512), MANY, None),
    ((2, 128), "reference", "the row count is symbolic in [2, 128], not inside the row band [0, 64)"),
    (None, "reference", "the row count is symbolic in [2, inf], not inside the row band [0, 64)"),
])
def test_pass_applies_a_row_band_to_symbolic_rows_only_when_the_range_fits(fresh_dynamo, mark, want, why):
    rw = _compile(5 if mark is None or mark[0] < 5 else mark[0], mark, True)
    assert rw.backend == want and rw.rows is None
    if why:
        assert any(why in s for s in rw.skipped), rw.skipped
    else:
        assert rw.rows_bounds == (mark[0], mark[1])


# ------------------------------------------------------------------ eager API and the vLLM route

def test_eager_call_picks_by_rows():
    with banded():
        for rows, name in ((3, FEW), (64, MANY), (3, FEW)):
            before = dict(calls)
            x = torch.randn(rows, 500)
            lt = torch.full((rows,), 400, dtype=torch.int32)
            assert_decode_equivalent(dsa_ops.topk_decode(x, lt, k=32), x, lt, 32)
            assert calls[name] == before[name] + 1 and sum(calls.values()) == sum(before.values()) + 1


def test_vllm_route_picks_by_rows():
    """The eager route (passes/vllm_route.py) is one dsa_ops.topk_decode call: rows from vLLM's
    logits choose the band, per-request seq_lens (B,) with next_n = 2 included."""
    from passes import vllm_route

    with banded(split=8):
        for rows, name in ((4, FEW), (16, MANY)):
            before = calls[name]
            logits = torch.randn(rows, 3000)
            seq_lens = torch.full((rows // 2,), 2500, dtype=torch.int32)  # one per request, next_n = 2
            out = torch.full((rows, 2048), 7, dtype=torch.int32)
            vllm_route.route_decode(logits, seq_lens, 2, out, 2048)
            assert calls[name] == before + 1
            per_row = (seq_lens.repeat_interleave(2) - 1 + torch.arange(rows) % 2).to(torch.int32)
            assert_decode_equivalent(out, logits, per_row, 2048)
