"""Bad input: a ValueError that names the argument, raised before anything touches ``out``,
through the public API and through the ops called directly; and the ``check=True`` value
checks versus the default clamping."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import dsa_ops
from tests import data, oracle

R, W, K = 4, 50, 8
META = torch.device("meta")  # stands in for "some other device"


def _x():
    return torch.randn(R, W, generator=torch.Generator().manual_seed(0))


def _pitch_below_width():
    """(R, W) view with stride(1) == 1 but row pitch 10 < W (rows overlap)."""
    return torch.randn(R * W).as_strided((R, W), (10, 1))


@dataclass
class Case:
    arg: str  # the argument the message must start with
    change: dict = field(default_factory=dict)  # overrides of the good call's arguments
    direct: bool = True  # also expressible through torch.ops (the schema types allow it)
    says: str = ""  # when set, a phrase the message must also contain


def _good(family: str) -> dict:
    base = {"logits": _x(), "k": K, "compress_ratio": 1, "out": data.poisoned_out(R, K)}
    if family == "decode":
        return {**base, "lengths": data.i32([0, 10, W, 20]), "next_n": 1}
    return {**base, "row_starts": data.i32([0, 3, 10, 40]), "row_ends": data.i32([0, 30, W, 45])}


COMMON = {
    "logits_f64": Case("logits", {"logits": _x().double()}),
    "logits_f16": Case("logits", {"logits": _x().half()}),
    "logits_bf16": Case("logits", {"logits": _x().bfloat16()}),
    "logits_int": Case("logits", {"logits": torch.zeros(R, W, dtype=torch.int32)}),
    "logits_rank1": Case("logits", {"logits": torch.randn(W)}),
    "logits_rank3": Case("logits", {"logits": torch.randn(R, W, 1)}),
    "logits_transposed": Case("logits", {"logits": torch.randn(W, R).t()}),
    "logits_stride1_2": Case("logits", {"logits": torch.randn(R, 2 * W)[:, ::2]}),
    "logits_pitch_lt_width": Case("logits", {"logits": _pitch_below_width()}),
    "logits_not_tensor": Case("logits", {"logits": [[0.0] * W] * R}, direct=False),
    "k_zero": Case("k", {"k": 0}),
    "k_negative": Case("k", {"k": -3}),
    "k_too_big": Case("k", {"k": 4097}),
    "k_float": Case("k", {"k": 8.0}, direct=False),
    "k_bool": Case("k", {"k": True}, direct=False),
    "k_str": Case("k", {"k": "8"}, direct=False),
    "k_tensor": Case("k", {"k": torch.tensor(8)}, direct=False),
    "compress_ratio_zero": Case("compress_ratio", {"compress_ratio": 0}),
    "out_int64": Case("out", {"out": torch.full((R, K), data.POISON, dtype=torch.int64)}),
    "out_float": Case("out", {"out": torch.zeros(R, K)}),
    "out_too_few_rows": Case("out", {"out": data.poisoned_out(R - 1, K)}),
    "out_too_few_cols": Case("out", {"out": data.poisoned_out(R, K - 1)}),
    "out_rank3": Case("out", {"out": data.poisoned_out(R, K)[..., None]}),
    "out_rank1": Case("out", {"out": data.poisoned_out(1, R * K)[0]}),
    "out_pitch_gt_k": Case("out", {"out": data.poisoned_out(R, 2 * K)[:, :K]}),
    "out_transposed": Case("out", {"out": data.poisoned_out(K, R).t()}),
    "out_other_device": Case("out", {"out": torch.empty(R, K, dtype=torch.int32, device=META)}),
    "stable_str": Case("stable", {"stable": "no"}, direct=False),
    "stable_int": Case("stable", {"stable": 1}, direct=False),
}


def _index_cases(arg: str, good: torch.Tensor) -> dict:
    return {
        f"{arg}_int64": Case(arg, {arg: good.long()}),
        f"{arg}_float": Case(arg, {arg: good.float()}),
        f"{arg}_int16": Case(arg, {arg: good.short()}),
        f"{arg}_other_device": Case(arg, {arg: good.to(META)}),
        f"{arg}_too_short": Case(arg, {arg: good[:-1].clone()}),
        f"{arg}_too_long": Case(arg, {arg: torch.cat([good, good[:1]])}),
        f"{arg}_strided": Case(arg, {arg: torch.stack([good, good], 1)[:, 0]}),
        f"{arg}_rank0": Case(arg, {arg: good[0].clone()}),
        f"{arg}_rank3": Case(arg, {arg: good.reshape(R, 1, 1)}),
        f"{arg}_not_tensor": Case(arg, {arg: good.tolist()}, direct=False),
    }


DECODE = {
    **COMMON,
    **_index_cases("lengths", _good("decode")["lengths"]),
    "lengths_2d_wrong_numel": Case("lengths", {"lengths": data.i32([[1, 2, 3]] * 2)}),
    "lengths_ambiguous_b1_next_n2": Case("lengths", {"lengths": data.i32([[5], [9]]), "next_n": 2}, says="ambiguous"),
    "lengths_ambiguous_b1_next_n4": Case(
        "lengths",
        {"logits": torch.randn(8, W), "lengths": data.i32([[5], [9]]), "next_n": 4, "out": data.poisoned_out(8, K)},
        says="ambiguous",
    ),
    "lengths_per_request_wrong_batch": Case("lengths", {"lengths": data.i32([5, 9, 7]), "next_n": 2}),
    # issue #24 item 4: name the real problem, and list a shape once
    "lengths_rows_not_multiple_of_next_n": Case(
        "lengths",
        {"logits": torch.randn(6, W), "lengths": data.i32([5]), "next_n": 4, "out": data.poisoned_out(6, K)},
        says="6 logits rows are not a multiple of next_n=4",
    ),
    "lengths_next_n_1_wrong_size": Case("lengths", {"lengths": data.i32([5, 9, 7])},
                                        says=f"expected shape ({R},), one length per logits row, got shape (3,)"),
    # issue #24 item 5: per-row lengths with a next_n that does not divide the rows
    "next_n_per_row_not_multiple": Case("next_n", {"next_n": 3}, says="not a multiple of next_n=3"),
    "next_n_zero": Case("next_n", {"next_n": 0}),
    "next_n_negative": Case("next_n", {"next_n": -2}),
    "next_n_float": Case("next_n", {"next_n": 1.0}, direct=False),
}
PREFILL = {
    **COMMON,
    **_index_cases("row_starts", _good("prefill")["row_starts"]),
    **_index_cases("row_ends", _good("prefill")["row_ends"]),
    "row_ends_2d": Case("row_ends", {"row_ends": data.i32([[0], [30], [W], [45]])}),
    "max_seqlen_k_float": Case("max_seqlen_k", {"max_seqlen_k": 5.0}, direct=False),
    "max_seqlen_k_tensor": Case("max_seqlen_k", {"max_seqlen_k": torch.tensor(5)}, direct=False),
    "max_seqlen_k_negative": Case("max_seqlen_k", {"max_seqlen_k": -1}, direct=False),
}
CASES = {"decode": DECODE, "prefill": PREFILL}


def _call_api(family: str, a: dict, use_out: bool, **extra):
    out = a["out"] if use_out else None
    if family == "decode":
        extra = {**({"stable": a["stable"]} if "stable" in a else {}), **extra}
        return dsa_ops.topk_decode(
            a["logits"], a["lengths"], a["k"], a["next_n"], compress_ratio=a["compress_ratio"], out=out, **extra
        )
    kw = {"max_seqlen_k": a["max_seqlen_k"]} if "max_seqlen_k" in a else {}
    kw.update({"stable": a["stable"]} if "stable" in a else {})
    return dsa_ops.topk_prefill(
        a["logits"], a["row_starts"], a["row_ends"], a["k"], compress_ratio=a["compress_ratio"], out=out, **kw, **extra
    )


def _call_op(op, family: str, a: dict, use_out: bool):
    idx = (a["lengths"],) if family == "decode" else (a["row_starts"], a["row_ends"])
    tail = (a["next_n"],) if family == "decode" else ()
    args = (a["logits"], *idx, a["k"], *tail, a["compress_ratio"], False)
    return op(*args, a["out"]) if use_out else op(*args)


def _entry_points(family: str) -> list:
    """("api"|op, out?) pairs: the public function and every CPU-runnable op of the family."""
    points = [pytest.param("api", False, id="api"), pytest.param("api", True, id="api-out")]
    for name in [None] + [p.values[0].name for p in data.backend_params(family) if not p.marks]:
        for out in (False, True):
            op = dsa_ops.ops.backend_op(name, family, out=out)
            points.append(pytest.param(op, out, id=op._schema.name.split("::")[1]))
    return points


def _expect_value_error(family, case: Case, entry, use_out: bool):
    a = {**_good(family), **case.change}
    poison = a["out"].clone() if a["out"].device.type != "meta" else None
    with pytest.raises(ValueError) as info:
        if entry == "api":
            _call_api(family, a, use_out)
        else:
            _call_op(entry, family, a, use_out)
    assert str(info.value).startswith(f"{case.arg}:"), str(info.value)
    assert case.says in str(info.value), str(info.value)
    if poison is not None:
        assert torch.equal(a["out"], poison), "out was written although validation failed"


def _params(family: str) -> list:
    out = []
    for entry in _entry_points(family):
        ep, use_out = entry.values
        for name, case in CASES[family].items():
            if ep != "api" and not case.direct:
                continue  # the op's schema types already refuse it
            if case.arg == "out" and not use_out:
                continue
            if case.arg in ("max_seqlen_k", "stable") and ep != "api":
                continue
            out.append(pytest.param(case, ep, use_out, id=f"{entry.id}-{name}"))
    return out


@pytest.mark.parametrize("case, entry, use_out", _params("decode"))
def test_decode_bad_input(case, entry, use_out):
    _expect_value_error("decode", case, entry, use_out)


@pytest.mark.parametrize("case, entry, use_out", _params("prefill"))
def test_prefill_bad_input(case, entry, use_out):
    _expect_value_error("prefill", case, entry, use_out)


@pytest.mark.parametrize(
    "family, name",
    [(f, n) for f, cases in CASES.items() for n, c in cases.items() if c.direct and c.arg != "max_seqlen_k"],
)
def test_fake_kernels_reject_the_same_input(family, name):
    """Under FakeTensorMode (what torch.compile traces with) the same ValueError is raised."""
    case = CASES[family][name]
    mode = FakeTensorMode()
    real = {**_good(family), **case.change}
    a = {n: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for n, v in real.items()}
    with mode, pytest.raises(ValueError, match=f"^{case.arg}:.*{re.escape(case.says)}"):
        _call_op(dsa_ops.ops.generic_op(family, out=case.arg == "out"), family, a, case.arg == "out")


@pytest.mark.parametrize("family", ["decode", "prefill"])
def test_good_input_passes(family):
    """The base call every bad case perturbs is itself valid (so each case tests one thing)."""
    a = _good(family)
    assert _call_api(family, a, True) is a["out"]
    assert not (a["out"] == data.POISON).any()


@pytest.mark.parametrize("family", ["decode", "prefill"])
def test_unknown_backend_lists_registered(family):
    a = _good(family)
    with pytest.raises(ValueError, match="nope") as info:
        _call_api(family, a, True, backend="nope")
    msg = str(info.value)
    assert msg.startswith("backend:") and all(repr(n) in msg for n in dsa_ops.backends())
    assert (a["out"] == data.POISON).all()


def test_unsupported_backend_request_is_rejected():
    a = _good("decode")
    with pytest.raises(ValueError, match="^backend:.*stable"):
        _call_api("decode", a, True, backend="torch_topk", stable=True)
    assert (a["out"] == data.POISON).all()


# --- device values: check=True raises, the default clamps -------------------------------

DECODE_VALUES = {
    "length_past_width": (data.i32([0, 10, W + 1, 20]), 1),
    "negative_length": (data.i32([0, -1, W, 20]), 1),
    "per_request_negative": (data.i32([-1, 30]), 2),
    "per_request_row_past_width": (data.i32([10, W + 1]), 2),
}


@pytest.mark.parametrize("lengths", [[0, 5], [1, 0]])
def test_decode_check_accepts_padded_mtp_requests(lengths):
    """Issue #25: per-request lengths whose draft rows come out negative (request length 0 or 1
    with next_n = 2: L - 2 + 1 + j < 0) are normal padded rows; check=True must accept them."""
    a = {**_good("decode"), "lengths": data.i32(lengths), "next_n": 2}
    got = _call_api("decode", a, False, check=True)
    assert torch.equal(got, oracle.topk_decode(a["logits"], a["lengths"], K, 2, "per_request"))


@pytest.mark.parametrize("name", list(DECODE_VALUES))
def test_decode_check_raises_default_clamps(name):
    lengths, next_n = DECODE_VALUES[name]
    a = {**_good("decode"), "lengths": lengths, "next_n": next_n}
    with pytest.raises(ValueError, match="^lengths:"):
        _call_api("decode", a, True, check=True)
    assert (a["out"] == data.POISON).all()
    layout = "per_request" if next_n > 1 else "per_row"
    got = _call_api("decode", a, True)
    assert torch.equal(got, oracle.topk_decode(a["logits"], lengths, K, next_n, layout))


PREFILL_VALUES = {
    "negative_start": (data.i32([0, -3, 10, 40]), data.i32([0, 30, W, 45]), "row_starts"),
    "end_before_start": (data.i32([0, 3, 10, 40]), data.i32([0, 30, 9, 45]), "row_ends"),
    "end_past_width": (data.i32([0, 3, 10, 40]), data.i32([0, 30, W + 1, 45]), "row_ends"),
}


@pytest.mark.parametrize("name", list(PREFILL_VALUES))
def test_prefill_check_raises_default_clamps(name):
    starts, ends, arg = PREFILL_VALUES[name]
    a = {**_good("prefill"), "row_starts": starts, "row_ends": ends}
    with pytest.raises(ValueError, match=f"^{arg}:"):
        _call_api("prefill", a, True, check=True)
    assert (a["out"] == data.POISON).all()
    got = _call_api("prefill", a, True)
    assert torch.equal(got, oracle.topk_prefill(a["logits"], starts, ends, K))


@pytest.mark.parametrize("family", ["decode", "prefill"])
def test_check_accepts_valid_values(family):
    a = _good(family)
    assert torch.equal(_call_api(family, a, False, check=True), _call_api(family, a, False))


def _overlapping_out(into: str) -> dict:
    """A good call whose out shares bytes with the logits or an index tensor."""
    a = _good("decode")
    buf = torch.zeros(R * W + R * K, dtype=torch.int32)
    if into == "logits":
        a["logits"] = buf[: R * W].view(torch.float32).view(R, W).copy_(a["logits"])
        a["out"] = buf[R * W - 3: R * W - 3 + R * K].view(R, K)
    else:
        a["out"] = buf[: R * K].view(R, K)
        a["lengths"] = buf[R * K - 2: R * K + 2].copy_(a["lengths"])
    return a


@pytest.mark.parametrize("into", ["logits", "lengths"])
@pytest.mark.parametrize("entry", ["api", "op"])
def test_out_overlapping_an_input_is_rejected(into, entry):
    """Issue #25 item 8: an ``out`` that shares memory with the logits or the lengths would be
    read while written; the API and the ops refuse it by name and write nothing."""
    a = _overlapping_out(into)
    before = a["out"].clone()
    with pytest.raises(ValueError, match=f"^out: overlaps {into}"):
        if entry == "api":
            _call_api("decode", a, True)
        else:
            _call_op(dsa_ops.ops.backend_op("reference", "decode", out=True), "decode", a, True)
    assert torch.equal(a["out"], before)


@pytest.mark.parametrize("family", ["decode", "prefill"])
def test_empty_batch_from_numpy_is_accepted(family):
    """Issue #25 item 5: numpy's (0, W) arrays have strides (0, 0); an empty batch addresses no
    memory, so no stride rule applies and the result is an empty (0, k) tensor."""
    np = pytest.importorskip("numpy")
    x = torch.from_numpy(np.zeros((0, 5), np.float32))
    assert x.stride() == (0, 0)
    empty = data.i32([])
    got = (dsa_ops.topk_decode(x, empty, k=4) if family == "decode"
           else dsa_ops.topk_prefill(x, empty, empty, k=4))
    assert got.shape == (0, 4) and got.dtype == torch.int32


def test_stable_and_max_seqlen_k_accept_their_legal_values():
    a = _good("prefill")
    for stable in (None, False, True):
        _call_api("prefill", {**a, "stable": stable, "max_seqlen_k": 0}, False)


def _compiled_check_call(family: str, backend: str):
    def f(x, a, b, out):
        if family == "decode":
            return dsa_ops.topk_decode(x, a, K, b, out=out, check=True)
        return dsa_ops.topk_prefill(x, a, b, K, out=out, check=True)

    return torch.compile(f, fullgraph=True, backend=backend)


def _value_cases(family: str) -> list:
    if family == "decode":
        return [(name, lengths, next_n, "lengths") for name, (lengths, next_n) in DECODE_VALUES.items()]
    return [(name, s, e, arg) for name, (s, e, arg) in PREFILL_VALUES.items()]


@pytest.mark.parametrize("use_out", [False, True], ids=["functional", "out"])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("family", ["decode", "prefill"])
def test_check_true_under_compile(fresh_dynamo, family, backend, use_out):
    """Issue #44 item 2: check=True under torch.compile(fullgraph=True) traced `bool(bad.any())`
    and failed with dynamo's 'Could not guard on data-dependent expression' even on good
    values. Compiled, good values give the eager result, and each bad value raises eager's
    ValueError when the graph runs (one graph: values are device data), before out is written."""
    f = _compiled_check_call(family, backend)
    good = _good(family)
    a, b = (good["lengths"], 1) if family == "decode" else (good["row_starts"], good["row_ends"])
    out = data.poisoned_out(R, K) if use_out else None
    got = f(good["logits"], a, b, out)
    want = _call_api(family, good, False)
    assert torch.equal(got, want) and (out is None or torch.equal(out, want))
    for name, a, b, arg in _value_cases(family):
        if family == "decode" and b != 1:
            continue  # next_n is a constant: another graph, checked below
        out = data.poisoned_out(R, K) if use_out else None
        with torch.compiler.set_stance("fail_on_recompile"):
            with pytest.raises(ValueError) as info:
                f(good["logits"], a, b, out)
        eager = {**good, **({"lengths": a} if family == "decode" else {"row_starts": a, "row_ends": b})}
        with pytest.raises(ValueError) as want_info:
            _call_api(family, eager, False, check=True)
        assert str(info.value) == str(want_info.value) and str(info.value).startswith(f"{arg}:"), name
        assert out is None or (out == data.POISON).all(), f"{name}: out was written"
    if family == "decode":  # per-request lengths (next_n = 2): their own graph
        for name, (lengths, next_n) in DECODE_VALUES.items():
            if next_n == 2:
                with pytest.raises(ValueError, match="^lengths: request"):
                    f(good["logits"], lengths, next_n, None)


def test_check_true_under_inductor(fresh_dynamo):
    """The same through Inductor (which must not drop the check as dead code)."""
    f = _compiled_check_call("decode", "inductor")
    good = _good("decode")
    assert torch.equal(f(good["logits"], good["lengths"], 1, None), _call_api("decode", good, False))
    with pytest.raises(ValueError, match="^lengths: row 2 has length 51"):
        f(good["logits"], data.i32([0, 10, W + 1, 20]), 1, None)
