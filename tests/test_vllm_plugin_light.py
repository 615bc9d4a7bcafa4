"""``passes.vllm`` without vLLM: importing it is light, and the opt-in is parsed strictly.

The tests that need vLLM itself live in ``tests/vllm/`` (run by ``.ci/vllm-tests``).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from passes import vllm as passes_vllm


def test_importing_passes_vllm_does_not_import_vllm():
    code = "import sys, passes.vllm, dsa_ops; assert 'vllm' not in sys.modules, 'vllm imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def _switches():
    from passes import vllm_route

    return [pytest.param(passes_vllm, id="DSA_OPS_VLLM_PASS"), pytest.param(vllm_route, id="DSA_OPS_VLLM_ROUTE")]


@pytest.mark.parametrize("module", _switches())
@pytest.mark.parametrize("value, want", [(None, False), ("", False), ("0", False), (" 1 ", True), ("1", True)])
def test_opt_in_values(monkeypatch, module, value, want):
    """Both plugin switches (the pass and the eager route) read "1" as on, unset / "" / "0" as off."""
    if value is None:
        monkeypatch.delenv(module.ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(module.ENV_VAR, value)
    assert module.opted_in() is want


@pytest.mark.parametrize("module", _switches())
@pytest.mark.parametrize("value", ["yes", "true", "2", "on"])
def test_opt_in_rejects_other_values(monkeypatch, module, value):
    monkeypatch.setenv(module.ENV_VAR, value)
    with pytest.raises(ValueError, match=module.ENV_VAR):
        module.opted_in()


def test_register_without_opt_in_needs_only_dsa_ops(monkeypatch):
    monkeypatch.delenv(passes_vllm.ENV_VAR, raising=False)
    passes_vllm.register()  # registers the ops; touches no vLLM


# --- passes.vllm_route without vLLM: the opt-in, the layer scope and the refusals --------

import logging  # noqa: E402
import types  # noqa: E402

from passes import vllm_route  # noqa: E402


def test_importing_the_route_does_not_import_vllm():
    code = "import sys, passes.vllm_route; assert 'vllm' not in sys.modules, 'vllm imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def _layer(**kw):
    base = dict(topk_tokens=2048, compress_ratio=1, candidate_blocks=None, topk_backend="auto")
    return types.SimpleNamespace(**(base | kw))


@pytest.mark.parametrize("kw, why", [
    ({}, ""),
    ({"topk_tokens": 512}, "k=512"),
    ({"compress_ratio": 4}, "compress_ratio=4"),
    ({"candidate_blocks": object()}, "candidate blocks"),
    ({"topk_backend": "deep_select"}, "topk backend 'deep_select'"),
])
def test_only_dsa_layers_are_routed(kw, why):
    assert vllm_route.eligible(_layer(**kw)) == why


def test_untested_vllm_version_refuses_before_touching_vllm(caplog):
    vllm_route._state.warned.clear()
    with caplog.at_level(logging.WARNING, logger="dsa_ops.vllm_route"):
        assert vllm_route.install("cuda", version="0.32.1") is False
        assert vllm_route.install("rocm", version="0.32.1") is False
    assert len([r for r in caplog.records if r.name == "dsa_ops.vllm_route"]) == 1
    assert "not a tested version" in caplog.text and vllm_route.installed() is None


def test_check_seams_rejects_an_unknown_platform():
    with pytest.raises(ValueError, match="platform"):
        vllm_route.check_seams("xpu", version="0.33.0")


def test_a_caller_that_stopped_calling_a_seam_is_reported():
    def caller(logits, topk_backend):
        return get_indexer_topk(topk_backend)  # noqa: F821  (a name in co_names, never run)

    problems: list[str] = []
    vllm_route._refers(problems, caller, ("get_indexer_topk", "top_k_per_row_prefill"), ("topk_backend", "k_cache_prefix"))
    assert len(problems) == 2
    assert "no longer calls top_k_per_row_prefill" in problems[0] and "no local 'k_cache_prefix'" in problems[1]


# --- the routed calls themselves (no vLLM: they take vLLM's tensors, call dsa-ops) ---------

import torch  # noqa: E402

from dsa_ops.testing import assert_decode_equivalent, assert_prefill_equivalent  # noqa: E402


def _decode_case():
    g = torch.Generator().manual_seed(1)
    logits = torch.randint(-20, 20, (4, 3000), generator=g).float()
    return logits, torch.tensor([2999, 3000, 99, 100], dtype=torch.int32)  # rows of 2 requests, next_n 2


@pytest.mark.parametrize("layout", ["per-row (B, next_n)", "per-row flat", "per-request (B, 1)", "per-request (B,)"])
def test_route_decode_takes_vllms_seq_lens_layouts(layout):
    logits, per_row = _decode_case()
    seq_lens = {"per-row (B, next_n)": per_row.view(2, 2), "per-row flat": per_row,
                "per-request (B, 1)": per_row.view(2, 2)[:, 1:].contiguous(),
                "per-request (B,)": per_row.view(2, 2)[:, 1].contiguous()}[layout]
    out = torch.full((4, 2048), 7, dtype=torch.int32)
    vllm_route.route_decode(logits, seq_lens, 2, out, 2048)
    assert_decode_equivalent(out, logits, per_row, 2048)


def test_route_decode_writes_a_strided_out_view():
    logits, per_row = _decode_case()
    wide = torch.full((6, 2100), 7, dtype=torch.int32)
    vllm_route.route_decode(logits, per_row, 1, wide[1:5, :2048], 2048)
    assert_decode_equivalent(wide[1:5, :2048], logits, per_row, 2048)
    assert (wide[0] == 7).all() and (wide[5] == 7).all() and (wide[:, 2048:] == 7).all()


def test_route_decode_rejects_seq_lens_that_fit_no_layout():
    logits, _ = _decode_case()
    with pytest.raises(ValueError, match="seq_lens"):
        vllm_route.route_decode(logits, torch.tensor([5, 6, 7], dtype=torch.int32), 2, torch.empty(4, 2048, dtype=torch.int32), 2048)


def test_route_prefill_is_sequence_local_and_writes_a_strided_out_view():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 5000, generator=g)
    starts = torch.tensor([0, 1000, 2500], dtype=torch.int32)
    ends = torch.tensor([900, 3500, 5000], dtype=torch.int32)
    wide = torch.full((3, 2050), 7, dtype=torch.int32)
    vllm_route.route_prefill(logits, starts, ends, wide[:, :2048], 2048, 5000)
    assert_prefill_equivalent(wide[:, :2048], logits, starts, ends, 2048)
    assert (wide[:, 2048:] == 7).all()


@pytest.mark.parametrize("bad, match", [
    ("missing.json", r"^policy: policy file 'missing\.json' does not exist"),
    (12345, r"^policy: expected a dsa_ops\.policy\.Policy, a path to a policy JSON file"),
])
def test_add_to_compilation_config_checks_the_policy_first(bad, match, tmp_path, monkeypatch):
    """A bad ``policy`` is refused by the helper, naming it, before vLLM is imported (it
    used to fail at compile time, inside a vLLM worker); the same check as the pass's."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=match):
        passes_vllm.add_to_compilation_config({"mode": 3}, policy=bad)
    with pytest.raises(ValueError, match=match):
        passes_vllm.install(types.SimpleNamespace(inductor_compile_config={}, inductor_passes={}), policy=bad)


def _vllm_cooperative_here(monkeypatch):
    """The vllm_cooperative record made available (its kernels are the stand-ins of tests.standins)."""
    import dataclasses

    from dsa_ops.backends import BACKENDS
    from dsa_ops.backends.base import YES

    monkeypatch.setitem(BACKENDS, "vllm_cooperative", dataclasses.replace(
        BACKENDS["vllm_cooperative"], available=lambda: YES, supports=lambda q: YES, faults="", _cache={}))
    monkeypatch.setattr(vllm_route, "VLLM_CALL_DEVICES", ("cpu",))
    monkeypatch.setattr(vllm_route, "_vllm_call", {})


@pytest.mark.parametrize("rows, kernel", [(4, "cooperative_topk"), (80, "persistent_topk")])
def test_the_cuda_decode_route_makes_vllms_own_call_where_the_policy_picks_vllms_kernel(monkeypatch, rows, kernel):
    """Where the policy picks vllm_cooperative, the route calls vLLM's kernel as stock vLLM does
    (max_seq_len passed on, into vLLM's -1 filled buffer; more than 64 rows: persistent_topk), not
    through the adapter; elsewhere, and without max_seq_len (the ROCm seam), dsa_ops.topk_decode."""
    from dsa_ops import policy as P
    from tests.standins import fake_vllm_kernels

    _vllm_cooperative_here(monkeypatch)
    pol = P.Policy(decode=(P.Rule("vllm_cooperative", max_rows=100), P.Rule("reference")),
                   prefill=(P.Rule("reference"),))
    logits = torch.randn(rows, 3000)
    lens = torch.randint(0, 3001, (rows,), dtype=torch.int32)
    with fake_vllm_kernels() as ran, P.use(pol):
        before = dict(vllm_route.calls)
        out = torch.full((rows, 512), -1, dtype=torch.int32)  # vLLM's indexer fills its buffer first
        vllm_route.route_decode(logits, lens, 1, out, 512, int(lens.max()))
        assert ran == [kernel] and vllm_route.calls["vllm_call"] == before["vllm_call"] + 1
        assert_decode_equivalent(out, logits, lens, 512)
        wide = torch.randn(120, 3000)  # past the band: the policy's reference, through dsa_ops
        wl = torch.full((120,), 2000, dtype=torch.int32)
        wout = torch.full((120, 512), -1, dtype=torch.int32)
        vllm_route.route_decode(wide, wl, 1, wout, 512, 2000)
        assert ran == [kernel] and vllm_route.calls["vllm_call"] == before["vllm_call"] + 1
        assert_decode_equivalent(wout, wide, wl, 512)
        assert vllm_route.vllm_kernel(logits, 1024, P.DEFAULT) is None  # a policy that never picks vLLM's kernels
