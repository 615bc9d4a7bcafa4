"""Op schemas and the registry: one schema per family, out forms that only add ``out``."""

from __future__ import annotations

import re
from types import MappingProxyType

import pytest
import torch

import dsa_ops
from dsa_ops import ops
from dsa_ops.backends.base import Query, Support

# The schemas documented in dsa_ops/ops.py; a change here is an API change.
DOCUMENTED = {
    "decode": "(Tensor logits, Tensor lengths, int k=2048, int next_n=1, int compress_ratio=1, "
    "bool stable=False) -> Tensor",
    "prefill": "(Tensor logits, Tensor row_starts, Tensor row_ends, int k=2048, int compress_ratio=1, "
    "bool stable=False) -> Tensor",
}
_NAME = re.compile(r"^dsa_ops::topk_(decode|prefill)(_[a-z0-9_]+)?$")


def _registered() -> dict[tuple[str, bool], list[str]]:
    """Every dsa_ops::topk_* op the dispatcher knows, grouped by (family, is_out)."""
    groups: dict[tuple[str, bool], list[str]] = {}
    for name in torch._C._dispatch_get_all_op_names():
        m = _NAME.match(name)
        if m:
            groups.setdefault((m.group(1), name.endswith("_out")), []).append(name)
    return groups


def _schema(qualname: str) -> torch._C.FunctionSchema:
    return getattr(torch.ops.dsa_ops, qualname.split("::")[1]).default._schema


def _sig(schema) -> str:
    """The schema text without the op name."""
    return str(schema)[len(schema.name) :]


@pytest.mark.parametrize("family", ops.FAMILIES)
def test_every_op_of_a_family_has_the_documented_schema(family):
    names = _registered()[(family, False)]
    expected = {f"dsa_ops::topk_{family}"} | {
        f"dsa_ops::topk_{family}_{b}" for b, rec in dsa_ops.backends().items() if getattr(rec, family)
    }
    assert expected <= set(names), f"missing ops: {expected - set(names)}"
    for name in names:
        assert _sig(_schema(name)) == DOCUMENTED[family], name


@pytest.mark.parametrize("family", ops.FAMILIES)
def test_out_forms_add_exactly_a_mutated_out(family):
    functional = _schema(f"dsa_ops::topk_{family}")
    outs = _registered()[(family, True)]
    assert len(outs) == len(_registered()[(family, False)])  # every functional op has its out form
    for name in outs:
        s = _schema(name)
        *args, out = s.arguments
        assert [(a.name, str(a.type)) for a in args] == [(a.name, str(a.type)) for a in functional.arguments]
        assert (out.name, str(out.type)) == ("out", "Tensor")
        assert out.alias_info is not None and out.alias_info.is_write, f"{name}: out is not Tensor(a!)"
        assert all(a.alias_info is None for a in args), f"{name}: an input other than out aliases"
        assert s.returns == [], f"{name}: an out form must return nothing (no alias of out)"
        assert _sig(s).endswith(", Tensor(a!) out) -> ()")


@pytest.mark.parametrize("family", ops.FAMILIES)
def test_functional_forms_mutate_nothing(family):
    for name in _registered()[(family, False)]:
        s = _schema(name)
        assert all(a.alias_info is None for a in s.arguments), name
        assert len(s.returns) == 1 and s.returns[0].alias_info is None, name


@pytest.mark.parametrize("out", [False, True])
@pytest.mark.parametrize("family", ops.FAMILIES)
def test_backend_op_names(family, out):
    suffix = "_out" if out else ""
    assert ops.generic_op(family, out=out)._schema.name == f"dsa_ops::topk_{family}{suffix}"
    for name, backend in dsa_ops.backends().items():
        if getattr(backend, family) is None:  # e.g. decode-only vllm_persistent
            with pytest.raises(ValueError, match=f"registers no {family} op"):
                ops.backend_op(name, family, out=out)
            continue
        op = ops.backend_op(name, family, out=out)
        assert op._schema.name == f"dsa_ops::topk_{family}_{name}{suffix}"
        assert op._schema.name == f"dsa_ops::{ops.op_name(backend.name, family, out)}"  # named from the record


def test_backend_op_rejects_unknown_names():
    with pytest.raises(ValueError, match="family"):
        ops.backend_op("reference", "sample")
    with pytest.raises(ValueError, match="backend"):
        ops.backend_op("nope", "decode")


def test_registry_records():
    reg = dsa_ops.backends()
    assert isinstance(reg, MappingProxyType)
    assert {"reference", "torch_topk"} <= set(reg)
    with pytest.raises(TypeError):
        reg["x"] = reg["reference"]  # read-only
    for name, b in reg.items():
        assert b.name == name and not b.test_only
        assert isinstance(b.availability(), Support)
        assert isinstance(b.supports(Query("decode", "cpu", 2048, 4096)), Support)
        assert isinstance(b.version(), str) and b.description
    assert reg["reference"].exact and not reg["torch_topk"].exact


def test_support_reasons():
    """A 'no' carries its reason; torch_topk has no stable mode."""
    sup = dsa_ops.backends()["torch_topk"].check(Query("decode", "cpu", 64, 1000, stable=True))
    assert not sup and "stable" in sup.reason
    assert dsa_ops.backends()["reference"].check(Query("prefill", "cpu", 4096, 10, stable=True))
