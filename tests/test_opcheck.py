"""torch.library.opcheck on every registered top-k op (generic and per backend, functional
and out forms) on contiguous, sliced (row pitch > W) and 0-row inputs."""

from __future__ import annotations

import pytest
import torch

from dsa_ops import ops
from tests import data

UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
WIDTH, K = 300, 64


def _decode_args(layout: str, gen: torch.Generator):
    if layout == "zero_rows":
        return torch.empty(0, WIDTH), data.i32([]), K, 1
    if layout == "per_request":  # (B,) lengths with next_n = 2: 3 requests, 6 rows
        return torch.randn(6, WIDTH, generator=gen), data.i32([1, 64, 400]), K, 2
    x = torch.randn(5, WIDTH, generator=gen)
    return (data.sliced(x) if layout == "sliced" else x), data.i32([0, 1, 63, 64, WIDTH]), K, 1


def _prefill_args(layout: str, gen: torch.Generator):
    if layout == "zero_rows":
        return torch.empty(0, WIDTH), data.i32([]), data.i32([]), K
    x = torch.randn(5, WIDTH, generator=gen)
    starts, ends = data.i32([0, 3, 10, 250, 100]), data.i32([0, 70, 200, WIDTH, 90])
    return (data.sliced(x) if layout == "sliced" else x), starts, ends, K


LAYOUTS = {
    "decode": ("contiguous", "sliced", "zero_rows", "per_request"),
    "prefill": ("contiguous", "sliced", "zero_rows"),
}


def _opcheck_params() -> list:
    """(backend name or None, family, layout), from the registry so new backends are covered."""
    params = []
    for fam in ops.FAMILIES:
        backends = [(None, "generic", [])]
        backends += [(p.values[0].name, p.id, p.marks) for p in data.backend_params(fam)]
        for name, pid, marks in backends:
            for layout in LAYOUTS[fam]:
                params.append(pytest.param(name, fam, layout, id=f"{pid}-{fam}-{layout}", marks=marks))
    return params


@pytest.mark.parametrize("out", [False, True], ids=["functional", "out"])
@pytest.mark.parametrize("backend, family, layout", _opcheck_params())
def test_opcheck(backend, family, layout, out, gen):
    args = _decode_args(layout, gen) if family == "decode" else _prefill_args(layout, gen)
    args = (*args, 1, False)  # compress_ratio, stable
    if out:
        args = (*args, data.poisoned_out(args[0].shape[0], K))
    op = ops.backend_op(backend, family, out=out)
    torch.library.opcheck(op, args, test_utils=UTILS)
    if out:  # opcheck runs on clones; run once more to see that the buffer really is written
        op(*args)
        assert not (args[-1] == data.POISON).any()


@pytest.mark.parametrize("family", ops.FAMILIES)
def test_opcheck_value_checks(family, gen):
    """The ops that run check=True's device-value checks under torch.compile (on values that
    pass them: the layouts above hold lengths past W and inverted windows on purpose)."""
    x = torch.randn(6, WIDTH, generator=gen)
    if family == "decode":
        torch.library.opcheck(ops.check_op("decode"), (x, data.i32([1, 64, WIDTH]), 2), test_utils=UTILS)
    else:
        starts, ends = data.i32([0, 3, 10, 250, 90, 0]), data.i32([0, 70, 200, WIDTH, 100, 5])
        torch.library.opcheck(ops.check_op("prefill"), (x, starts, ends), test_utils=UTILS)
