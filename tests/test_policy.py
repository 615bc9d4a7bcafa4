"""The policy object: defaults, JSON round trip, validation, hash, env var, choices."""

from __future__ import annotations

import json

import pytest

from dsa_ops import policy as P
from dsa_ops.validate import ArgumentError
from tests.standins import standin_backend


def test_default_reproduces_pr_61943_gate_on_gfx950():
    """With AITER and vLLM stand-ins available on a ROCm gfx950 host."""
    with standin_backend("aiter_sub") as aiter, standin_backend("vllm_sub") as vllm:
        swap = {"aiter": aiter, "vllm": vllm}
        pol = P.Policy(
            decode=tuple(P.Rule(**{**r.__dict__, "backend": swap.get(r.backend, r.backend)}) for r in P.DEFAULT.decode),
            prefill=tuple(P.Rule(**{**r.__dict__, "backend": swap.get(r.backend, r.backend)}) for r in P.DEFAULT.prefill),
        )
        rocm = dict(platform="rocm", arch="gfx950:sramecc+", device_type="cpu")
        assert pol.choose("decode", P.Facts(k=2048, width=133120, **rocm)).backend == aiter
        assert pol.choose("decode", P.Facts(k=1024, width=133120, **rocm)).backend == vllm
        assert pol.choose("decode", P.Facts(k=2048, compress_ratio=4, **rocm)).backend == vllm
        f = P.Facts(k=2048, width=200000, **rocm)
        assert pol.choose("prefill", f, long=pol.is_long(32767)).backend == vllm
        assert pol.choose("prefill", f, long=pol.is_long(32768)).backend == aiter
        gfx942 = P.Facts(platform="rocm", arch="gfx942", device_type="cpu", k=2048)
        assert pol.choose("decode", gfx942).backend == vllm


def test_default_on_this_cpu_host_is_reference():
    f = P.facts_for("cpu", 2048, 1, 133120)
    assert P.DEFAULT.choose("decode", f).backend == "reference"
    assert P.DEFAULT.choose("prefill", f, long=True).backend == "reference"
    assert P.DEFAULT.prefill_threshold == 32768


def test_cuda_facts_route_to_triton_when_available():
    from dsa_ops.backends import BACKENDS

    f = P.Facts(platform="cuda", arch="sm_90", device_type="cuda", k=2048, width=133120)
    choice = P.DEFAULT.choose("decode", f)
    if "triton" in BACKENDS and BACKENDS["triton"].check(
            P.Query("decode", "cuda", 2048, 133120)):  # pragma: no cover - GPU hosts
        assert choice.backend == "triton"
    else:
        assert choice.backend == "reference" and any("triton" in s for s in choice.skipped)


def test_json_round_trip_and_hash(tmp_path):
    path = tmp_path / "p.json"
    P.save(P.DEFAULT, path)
    loaded = P.load(path)
    assert loaded.decode == P.DEFAULT.decode and loaded.prefill == P.DEFAULT.prefill
    assert loaded.content_hash() == P.DEFAULT.content_hash()
    data = json.loads(path.read_text())
    data["prefill_threshold"] = 65536
    path.write_text(json.dumps(data))
    assert P.load(path).content_hash() != P.DEFAULT.content_hash()


@pytest.mark.parametrize("patch, field", [
    ({"prefill_threshold": -1}, "prefill_threshold"),
    ({"prefill_threshold": "32k"}, "prefill_threshold"),
    ({"stable": "yes"}, "stable"),
    ({"bogus": 1}, "bogus"),
    ({"decode": {"backend": "x"}}, "decode"),
    ({"decode": [{"backend": "nope"}]}, "nope"),
    ({"decode": [{"backend": "reference", "platform": "tpu"}]}, "platform"),
    ({"decode": [{"backend": "reference", "k": -5}]}, "k"),
    ({"decode": [{"backend": "reference", "long": True}]}, "long"),
    ({"prefill": [{"backend": "reference", "colour": 1}]}, "colour"),
])
def test_bad_policy_json_names_the_field(tmp_path, patch, field):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**P.DEFAULT.to_dict(), **patch}))
    with pytest.raises(ValueError, match=field):
        P.load(path)


def test_unreadable_policy_files(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        P.load(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        P.load(tmp_path / "x.json")


def test_env_var_and_use(tmp_path, monkeypatch):
    pol = P.Policy(decode=(P.Rule("torch_topk"),), prefill=(P.Rule("reference"),), prefill_threshold=5)
    path = tmp_path / "env.json"
    P.save(pol, path)
    monkeypatch.setenv(P.ENV_VAR, str(path))
    assert P.current().prefill_threshold == 5
    with P.use(P.DEFAULT):
        assert P.current() is P.DEFAULT
    assert P.current().prefill_threshold == 5
    monkeypatch.delenv(P.ENV_VAR)
    assert P.current() is P.DEFAULT


def test_width_band_rules():
    pol = P.Policy(decode=(P.Rule("torch_topk", min_width=1000, max_width=5000), P.Rule("reference")),
                   prefill=(P.Rule("reference"),))
    f = lambda w: P.Facts("cpu", "", "cpu", 64, width=w)  # noqa: E731
    assert [pol.choose("decode", f(w)).backend for w in (999, 1000, 4999, 5000, None)] == [
        "reference", "torch_topk", "torch_topk", "reference", "reference"]


def test_explicit_request_for_unavailable_backend_says_why():
    import torch

    import dsa_ops

    with standin_backend("standin_off", available=False) as name:
        with pytest.raises(ValueError, match="not available: stand-in marked unavailable"):
            dsa_ops.topk_decode(torch.randn(2, 10), torch.tensor([3, 4], dtype=torch.int32), k=4, backend=name)


@pytest.mark.parametrize("fam, rule, field, expected", [
    ("decode", {"backend": "nope"}, "backend", "no backend named 'nope'"),
    ("prefill", {"backend": 7}, "backend", "expected a backend name"),
    ("decode", {"backend": "reference", "why": 3}, "why", "expected a string"),
    ("decode", {"backend": "reference", "arch": None}, "arch", "expected a string"),
    ("prefill", {"backend": "reference", "long": "yes"}, "long", "expected true, false or null"),
])
def test_bad_rule_names_the_file_and_the_field(tmp_path, fam, rule, field, expected):
    """docs/policy.md: each bad rule is a ValueError naming the file and the field, e.g.
    ``policy (path): decode[1].backend: ...``; an unknown backend also lists the known ones."""
    import re

    path = tmp_path / "bad.json"
    d = P.DEFAULT.to_dict()
    d[fam] = [{"backend": "reference"}, rule]
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=re.escape(f"policy ({path}): {fam}[1].{field}: {expected}")) as exc:
        P.load(path)
    if expected.startswith("no backend"):
        assert "registered: [" in str(exc.value) and "'reference'" in str(exc.value)


def test_env_var_file_is_read_again_when_it_changes(tmp_path, monkeypatch):
    import os

    path = tmp_path / "env.json"
    P.save(P.Policy(decode=(P.Rule("reference"),), prefill=(P.Rule("reference"),), prefill_threshold=5), path)
    monkeypatch.setenv(P.ENV_VAR, str(path))
    first = P.current()
    assert first.prefill_threshold == 5 and P.current() is first  # cached while the file is unchanged
    P.save(P.Policy(decode=(P.Rule("reference"),), prefill=(P.Rule("reference"),), prefill_threshold=7), path)
    st = os.stat(path)
    os.utime(path, (st.st_atime, st.st_mtime + 10))  # a later mtime, whatever the clock's resolution
    assert P.current().prefill_threshold == 7
    path.unlink()
    with pytest.raises(ValueError, match="cannot read"):
        P.current()


@pytest.mark.parametrize("bad, match", [
    (0, r"^policy: expected a dsa_ops\.policy\.Policy, a path to a policy JSON file \(str or os\.PathLike\), "
        r"got int 0"),  # open(0) would have read stdin
    (None, r"^policy: expected .*, got NoneType"),
    ("missing.json", r"^policy: policy file 'missing\.json' does not exist"),
])
def test_use_refuses_what_is_not_a_policy(bad, match, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ArgumentError, match=match):
        P.use(bad)


def test_no_policy_picks_a_backend_with_a_known_fault(monkeypatch):
    """vllm_cooperative (available and supporting the call here) names a fault of vLLM's kernel on
    legal input: the policy skips it, says why, and an explicit backend= is still the caller's."""
    import dataclasses

    from dsa_ops.backends import BACKENDS
    from dsa_ops.backends.base import YES

    rec = BACKENDS["vllm_cooperative"]
    assert "illegal memory access" in rec.faults
    monkeypatch.setitem(BACKENDS, "vllm_cooperative", dataclasses.replace(
        rec, available=lambda: YES, supports=lambda q: YES, _cache={}))
    pol = P.Policy(decode=(P.Rule("vllm_cooperative"), P.Rule("torch_topk")), prefill=(P.Rule("reference"),))
    got = pol.choose("decode", P.Facts("cuda", "sm_90", "cuda", 2048, width=133120, rows=9))
    assert got.backend == "torch_topk"
    assert any("known to fault on legal input, so no policy picks it" in s for s in got.skipped)
