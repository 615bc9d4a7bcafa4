"""Input builders shared by the test files: special fp32 bit patterns, tie-heavy rows,
sliced (row pitch > W) views, poisoned buffers and tails, decode / prefill inputs,
registry-driven backend parameters and a graph's call targets."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import dsa_ops
from dsa_ops.backends.base import Query
from dsa_ops.testing import POISON  # what every poisoned `out` slot starts as (one definition)

# fp32 bit patterns ranked by contract §1.1 (best first): a sign-clear NaN beats +inf,
# -0.0 ranks below +0.0, a sign-set NaN loses to -inf. NaN payloads rank by their bits.
SPECIAL_BITS = {
    "+nan_max": 0x7FFF_FFFF,
    "+nan": 0x7FC0_0000,
    "+snan": 0x7F80_0001,
    "+inf": 0x7F80_0000,
    "+max": 0x7F7F_FFFF,
    "+1": 0x3F80_0000,
    "+denorm": 0x0000_0001,
    "+0": 0x0000_0000,
    "-0": 0x8000_0000,
    "-denorm": 0x8000_0001,
    "-1": 0xBF80_0000,
    "-max": 0xFF7F_FFFF,
    "-inf": 0xFF80_0000,
    "-snan": 0xFF80_0001,
    "-nan": 0xFFC0_0000,
    "-nan_max": 0xFFFF_FFFF,
}


def from_bits(bits) -> Tensor:
    """float32 tensor with exactly the given unsigned 32-bit patterns (NaN payloads kept)."""
    t = torch.as_tensor(bits, dtype=torch.int64)
    t = torch.where(t >= 1 << 31, t - (1 << 32), t)
    return t.to(torch.int32).view(torch.float32)


def bits_of(x: Tensor) -> Tensor:
    """Unsigned bit patterns (int64) of a float32 tensor, for bitwise equality checks."""
    return x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFF_FFFF


def logits(gen: torch.Generator, rows: int, width: int, kind: str = "randn") -> Tensor:
    """(rows, width) float32 of a given flavour.

    kinds: "randn"; "ties" (4 distinct values, heavy ties at any cut); "equal" (every row
    constant); "specials" (NaN of both signs and several payloads, +-inf, +-0, denormals,
    mixed with a few ordinary values and repeated so they tie).
    """
    if kind == "randn":
        return torch.randn(rows, width, generator=gen)
    if kind == "ties":
        return torch.randint(-1, 3, (rows, width), generator=gen).float()
    if kind == "equal":
        return torch.full((rows, width), 0.5)
    if kind == "specials":
        pool = list(SPECIAL_BITS.values()) + [0x3F00_0000, 0xBF00_0000, 0x4000_0000]
        pick = torch.randint(0, len(pool), (rows, width), generator=gen)
        return from_bits(torch.tensor(pool)[pick])
    raise ValueError(kind)


def sliced(x: Tensor, extra: int = 37, fill: float = float("nan")) -> Tensor:
    """Same values as ``x`` (R, W) in a view with row pitch W + extra, on x's device; the gap
    holds ``fill``. (Make it on the device: ``.cuda()`` of the view copies it contiguous.)"""
    rows, width = x.shape
    big = torch.full((rows, width + extra), fill, dtype=x.dtype, device=x.device)
    big[:, :width] = x
    view = big[:, :width]
    assert view.stride(0) == width + extra and view.stride(1) == 1
    return view


def poisoned_out(rows: int, k: int, device="cpu") -> Tensor:
    return torch.full((rows, k), POISON, dtype=torch.int32, device=device)


def poison_tail(x: Tensor, ends, value: float = float("nan")) -> Tensor:
    """A copy of ``x`` whose columns at or past each row's end (a list or tensor; negative
    ends poison the whole row) hold ``value``: +NaN, the best key, by default, so a kernel
    that reads past a row's length picks it and shows."""
    ends = torch.as_tensor(ends, device=x.device).long()
    col = torch.arange(x.shape[1], device=x.device)
    return torch.where(col[None, :] >= ends[:, None], torch.tensor(value, dtype=x.dtype, device=x.device), x)


def decode_inputs(gen: torch.Generator, rows: int = 4, width: int = 300, kind: str = "randn",
                  lengths=None) -> tuple[Tensor, Tensor]:
    """(logits, int32 per-row lengths): random lengths in [0, W] unless given."""
    x = logits(gen, rows, width, kind)
    if lengths is None:
        return x, torch.randint(0, width + 1, (rows,), generator=gen, dtype=torch.int32)
    return x, i32(lengths)


def prefill_inputs(gen: torch.Generator, rows: int = 6, width: int = 400) -> tuple[Tensor, Tensor, Tensor]:
    """(logits, row_starts, row_ends): starts in [0, 100), windows of 0..299 columns."""
    x = logits(gen, rows, width)
    starts = torch.randint(0, 100, (rows,), generator=gen, dtype=torch.int32)
    ends = (starts + torch.randint(0, 300, (rows,), generator=gen, dtype=torch.int32)).to(torch.int32)
    return x, starts, ends


def call_targets(graph: torch.fx.Graph) -> list:
    """The targets of a graph's call_function nodes, in order."""
    return [n.target for n in graph.nodes if n.op == "call_function"]


def i32(values) -> Tensor:
    return torch.tensor(values, dtype=torch.int32)


def backend_params(family: str, *, exact_only: bool = False) -> list:
    """One pytest.param per registered backend; those that cannot run on CPU skip with the reason."""
    params = []
    for name, backend in dsa_ops.backends().items():
        marks = []
        sup = backend.check(Query(family, "cpu", 16, 64))
        if not sup:
            marks.append(pytest.mark.skip(reason=f"{name} cannot run {family} on CPU: {sup.reason}"))
        elif exact_only and not backend.exact:
            marks.append(pytest.mark.skip(reason=f"{name} is exact=False (not exact on NaN/-inf/-0)"))
        params.append(pytest.param(backend, id=name, marks=marks))
    return params


def opcheck_backend_pair(name: str, family: str, gen: torch.Generator) -> None:
    """opcheck a backend's functional and out= ops on a small tie-heavy call of ``family``."""
    from dsa_ops import ops

    x = logits(gen, 4, 100, "ties")
    if family == "decode":
        args = (x, i32([0, 5, 50, 200]), 16, 1, 1, False)
    else:
        args = (x, i32([0, 10, 90, 50]), i32([100, 10, 130, 20]), 16, 1, False)
    torch.library.opcheck(ops.backend_op(name, family), args)
    torch.library.opcheck(ops.backend_op(name, family, out=True), args + (poisoned_out(4, 16),))
