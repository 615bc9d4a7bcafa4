"""The default policy by host (issue 46): shipped Hopper policies with and without vLLM's kernels,
the built-in rules elsewhere or while none is shipped; the tool that builds them; explain's view."""

from __future__ import annotations

import json

import pytest

from dsa_ops import cli
from dsa_ops import policy as P


def _ship():
    """``lab.ship_policies`` (a checkout's tool, not in the wheel)."""
    return pytest.importorskip("lab.ship_policies", reason="lab/ is in a checkout, not in the wheel")

ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def _write_calibration(path, platform="cuda", arch="sm_90", backends=("cuda", "triton", "vllm_cooperative",
                                                                     "vllm_persistent")):
    """A calibrate .measurements.jsonl: vllm_cooperative fastest up to 64 rows (but it has a known
    fault, so no policy may pick it), cuda above, triton never."""
    lines = [{"meta": {"device": "NVIDIA H100 80GB HBM3", "platform": platform, "arch": arch, "torch": "2.11",
                       "triton": "3.6", "date": "2026-12-08", "k": 2048}}]
    for w in (133120, 1048576):
        for r in ROWS:
            for L in (4096, 32768, 131072):
                for b in backends:
                    fast = "vllm_cooperative" if r <= 64 else "cuda"
                    us = 10.0 + r / 10 + (0.0 if b == fast else 3.0 if b in ("cuda", "vllm_cooperative") else 9.0)
                    lines.append({"family": "decode", "backend": b, "rows": r, "length": L, "width": w, "us": us})
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_the_default_is_the_built_in_rules_off_hopper_and_while_nothing_is_shipped(tmp_path):
    for platform, arch in (("cpu", ""), ("cuda", ""), ("cuda", "sm_80"), ("cuda", "sm_100"), ("rocm", "gfx950")):
        got = P.default_choice(platform, arch, vllm=True, folder=str(tmp_path))
        assert got.policy is P.DEFAULT and got.path is None and "built-in rules" in got.why
    assert P.default_choice("cpu", "", folder=str(tmp_path)).why == (
        "built-in rules: no shipped policy for this host, where no CUDA GPU is visible; the shipped ones are for "
        "Hopper (sm_90)")
    got = P.default_choice("cuda", "sm_90", vllm=True, folder=str(tmp_path))
    assert got.policy is P.DEFAULT and "no measured hopper-vllm.json is shipped yet" in got.why
    assert "no measured hopper.json" in P.default_choice("cuda", "sm_90", vllm=False, folder=str(tmp_path)).why


def test_hopper_gets_the_vllm_policy_where_vllms_kernels_load_else_the_other(tmp_path):
    P.save(P.Policy(decode=(P.Rule("vllm_cooperative"),), prefill=(P.Rule("reference"),), name="hopper-vllm"),
           tmp_path / P.HOPPER_VLLM)
    P.save(P.Policy(decode=(P.Rule("cuda"),), prefill=(P.Rule("reference"),), name="hopper"), tmp_path / P.HOPPER)
    with_vllm = P.default_choice("cuda", "sm_90", vllm=True, folder=str(tmp_path))
    without = P.default_choice("cuda", "sm_90", vllm=False, folder=str(tmp_path))
    assert with_vllm.policy.name == "hopper-vllm" and "with vLLM's kernels" in with_vllm.why
    assert without.policy.name == "hopper" and "without vLLM's kernels" in without.why
    # on this host the vLLM kernels do not load: the probe's reason is part of the why
    probed = P.default_choice("cuda", "sm_90", folder=str(tmp_path))
    assert probed.policy.name == "hopper" and "not available: vllm_persistent:" in probed.why


def test_current_falls_back_to_this_hosts_default(monkeypatch):
    mine = P.Policy(decode=(P.Rule("reference"),), prefill=(P.Rule("reference"),), name="host-default")
    monkeypatch.delenv(P.ENV_VAR, raising=False)
    monkeypatch.setattr(P, "_default_here", lambda: P.DefaultChoice(mine, "test"))
    assert P.current() is mine and P.default() is mine


def test_ship_policies_builds_both_from_one_calibration(tmp_path, capsys):
    cal = _write_calibration(tmp_path / "h100.measurements.jsonl")
    dest, reports = tmp_path / "policies", tmp_path / "reports"
    reports.mkdir()
    assert _ship().main([str(cal), "--dest", str(dest), "--reports", str(reports)]) == 0
    with_vllm, without = P.load(dest / P.HOPPER_VLLM), P.load(dest / P.HOPPER)
    assert with_vllm.name == "hopper-vllm" and without.name == "hopper"
    f = lambda rows: P.Facts("cuda", "sm_90", "cuda", 2048, 1, 133120, rows=rows)  # noqa: E731
    first = lambda pol, rows: next(r.backend for r in pol.decode if r.matches(f(rows)))  # noqa: E731
    # vllm_cooperative is the fastest up to 64 rows, but its known fault keeps it out: cuda next
    assert [first(with_vllm, r) for r in (1, 64, 65, 512)] == ["cuda"] * 4
    assert [first(with_vllm, r) for r in (64, 65) for f in [lambda rows, w=1048576: P.Facts(
        "cuda", "sm_90", "cuda", 2048, 1, w, rows=rows)]] == ["cuda", "cuda"]
    assert "vllm_cooperative" not in with_vllm.backends_named()
    assert [first(without, r) for r in (1, 64, 65, 512)] == ["cuda"] * 4
    calibrated = [r for r in without.decode if r.arch == "sm_90" and r.why.startswith("calibrated on")]
    assert calibrated and not any(r.backend.startswith("vllm") for r in calibrated)
    assert "## Regret" in (reports / "h100-policy-vllm.md").read_text() and (reports / "h100-policy.md").exists()


@pytest.mark.parametrize("kw, message", [({"arch": "sm_80"}, "the shipped policies are for Hopper"),
                                         ({"backends": ("cuda", "triton")}, "no vLLM backend was measured")])
def test_ship_policies_refuses_what_cannot_make_them(tmp_path, capsys, kw, message):
    cal = _write_calibration(tmp_path / "c.measurements.jsonl", **kw)
    assert _ship().main([str(cal), "--dest", str(tmp_path / "p"), "--reports", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_explain_says_where_the_policy_comes_from_and_shows_the_row_bands(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(P.ENV_VAR, raising=False)
    assert cli.main(["explain", "--width", "4096", "--layers", "1"]) == 0
    assert "from this host's default: built-in rules" in capsys.readouterr().out
    path = tmp_path / "rows.json"
    P.save(P.Policy(decode=(P.Rule("torch_topk", "few rows", max_rows=16), P.Rule("reference", "the rest")),
                    prefill=(P.Rule("reference"),), name="rowtest"), path)
    assert cli.main(["explain", "--policy", str(path), "--width", "4096", "--layers", "1", "--rows", "32"]) == 0
    text = capsys.readouterr().out
    assert f"from --policy {path}" in text and "4-layer" not in text and "32 rows" in text
    assert "-> dsa_ops::topk_decode_reference" in text  # 32 rows: past the band
    import re

    assert re.search(r"rows 1\.\.8 +-> torch_topk +decode rule 1: few rows", text)
    assert re.search(r"rows 16\.\.512 +-> reference", text) and re.search(r"rows symbolic \[2, inf\] +-> reference", text)


def test_the_shipped_vllm_policy_has_the_stock_guard_and_the_other_has_none(tmp_path, capsys):
    """With stock measured, hopper-vllm.json is built with the 1 us stock guard (recorded in its
    meta and report), hopper.json without; neither routes to the 'stock' pseudo-backend."""
    cal = _write_calibration(tmp_path / "h100.measurements.jsonl")
    lines = cal.read_text().splitlines()
    for w in (133120, 1048576):
        for r in ROWS:
            for L in (4096, 32768, 131072):
                us = (10.0 + r / 10) if r <= 64 else 11.0 + r / 10  # stock: coop's time up to 64, then a bit slower
                lines.append(json.dumps({"family": "decode", "backend": "stock", "rows": r, "length": L, "width": w,
                                         "us": us}))
    cal.write_text("\n".join(lines) + "\n")
    dest = tmp_path / "p"
    assert _ship().main([str(cal), "--dest", str(dest), "--reports", str(tmp_path)]) == 0
    with_vllm, without = P.load(dest / P.HOPPER_VLLM), P.load(dest / P.HOPPER)
    assert with_vllm.meta["stock_guard_us"] == 1.0 and without.meta["stock_guard_us"] is None
    assert "stock" not in {r.backend for r in with_vllm.decode + without.decode}
    assert "Against stock: chosen <= stock + 1 us at" in (tmp_path / "h100-policy-vllm.md").read_text()


def test_the_shipped_files_rebuild_from_the_stored_calibration_or_are_absent(tmp_path, capsys):
    """Once measured, dsa_ops/policies/hopper*.json must be what ship_policies makes of
    docs/benchmarks/h100-cal.json (same hashes); until then Hopper keeps the built-in rules."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cal = os.path.join(root, "docs", "benchmarks", "h100-cal.json")
    shipped = [os.path.join(P.SHIPPED_DIR, n) for n in (P.HOPPER_VLLM, P.HOPPER)]
    if not any(os.path.exists(p) for p in shipped):
        assert P.default_choice("cuda", "sm_90", vllm=True).policy is P.DEFAULT
        return
    assert all(os.path.exists(p) for p in shipped) and os.path.exists(cal), "ship both files and the calibration"
    meta = P.load(shipped[0]).meta
    mix, guard = meta.get("context_mix"), meta.get("stock_guard_us")
    args = [cal, "--dest", str(tmp_path), "--reports", str(tmp_path)] + (["--stock-guard", str(guard)] if guard else [])
    if mix and len(set(mix.values())) > 1:  # a non-default mix was used: rebuild with it
        args += ["--context-mix", ",".join(f"{L}:{w}" for L, w in mix.items())]
    assert _ship().main(args) in (0, 1)
    for p in shipped:
        assert P.load(tmp_path / os.path.basename(p)).content_hash() == P.load(p).content_hash(), p
