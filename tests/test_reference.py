"""The reference backend (the generic ops' kernel) against the brute-force oracle of
tests/oracle.py: random, tie-heavy and special-value data, every lengths layout, prefill
windows, poisoned buffers, and rows up to 1M columns."""

from __future__ import annotations

import random

import pytest
import torch

import dsa_ops
from tests import data, oracle

KINDS = ("randn", "ties", "equal", "specials")


def _check(got, logits, windows, k, stable):
    """Stable: identical to the oracle. Otherwise: the contract's tie-tolerant conformance."""
    if stable:
        want = oracle.topk_windows(logits, windows, k)
        assert torch.equal(got, want), _first_diff(got, want)
    else:
        oracle.assert_conforms(got, logits, windows, k)


def _first_diff(got, want) -> str:
    r = int((got != want).any(dim=1).nonzero()[0, 0])
    return f"row {r}: got {got[r, :12].tolist()} want {want[r, :12].tolist()}"


# --- the oracle itself ---------------------------------------------------------------


def test_oracle_key_order_matches_contract():
    """SPECIAL_BITS is listed best first; the oracle's keys must be strictly increasing."""
    keys = [oracle.key_of_bits(b) for b in data.SPECIAL_BITS.values()]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)


def test_oracle_key_order_matches_float_order(gen):
    """On ordinary floats (no NaN, no -0), a larger value has a smaller key."""
    x = torch.randn(4000, generator=gen) * torch.logspace(-30, 30, 4000)
    keys = oracle.row_keys(x)
    order_by_value = sorted(range(len(keys)), key=lambda i: -float(x[i]))
    order_by_key = sorted(range(len(keys)), key=lambda i: keys[i])
    assert [float(x[i]) for i in order_by_value] == [float(x[i]) for i in order_by_key]


@pytest.mark.parametrize("kind", KINDS)
def test_oracle_numpy_path_matches_python_path(gen, kind):
    row = data.logits(gen, 1, 3000, kind)[0]
    for m in (0, 1, 700, 3000):
        py = oracle.best_columns(oracle.row_keys(row), m)
        np_ = oracle.best_columns_np(oracle.np_keys(row), m)
        assert py == np_


# --- decode ---------------------------------------------------------------------------


@pytest.mark.parametrize("stable", [True, False], ids=["stable", "unstable"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("width, k", [(64, 16), (300, 64), (2048, 2048), (2047, 2048), (5000, 2048)])
def test_decode_length_edges(gen, kind, width, k, stable):
    """L in {0, 1, k-1, k, k+1, W} plus lengths past W (clamped) and negative (clamped to 0)."""
    lengths = data.i32([0, 1, k - 1, k, k + 1, width, width + 5, -3])
    x = data.logits(gen, len(lengths), width, kind)
    got = dsa_ops.topk_decode(x, lengths, k, stable=stable)
    windows = [(0, oracle.clamp(int(n), 0, width)) for n in lengths]
    _check(got, x, windows, k, stable)


@pytest.mark.parametrize("kind", KINDS)
def test_decode_random_lengths(gen, kind):
    rows, width, k = 24, 1500, 256
    x = data.logits(gen, rows, width, kind)
    lengths = torch.randint(0, width + 1, (rows,), generator=gen, dtype=torch.int32)
    got = dsa_ops.topk_decode(x, lengths, k, stable=True)
    assert torch.equal(got, oracle.topk_decode(x, lengths, k))


def test_decode_special_values_rank_as_contract(gen):
    """One of each special value in a shuffled row: the k best are the first k in contract order."""
    names = list(data.SPECIAL_BITS)
    perm = torch.randperm(len(names), generator=gen).tolist()  # column c holds names[perm[c]]
    x = data.from_bits([data.SPECIAL_BITS[names[p]] for p in perm])[None, :]
    width = x.shape[1]
    for k in range(1, width + 2):
        got = dsa_ops.topk_decode(x, data.i32([width]), k, stable=True)[0].tolist()
        m = min(k, width)
        best = sorted(perm.index(rank) for rank in range(m))  # columns of the m best names
        assert got == best + [-1] * (k - m), (k, [names[perm[c]] for c in got if c >= 0])


@pytest.mark.parametrize("kind", ["randn", "ties"])
def test_decode_1m_columns(gen, kind):
    """W = 2^20, as in long-context decode; the oracle takes the vectorised numpy path."""
    rows, width, k = 16, 1 << 20, 2048
    if kind == "randn":
        x = torch.randn(rows, width, generator=gen)
    else:  # 100 distinct values over 1M columns: the cut-off always falls inside a tie
        x = torch.randint(0, 100, (rows, width), generator=gen).float()
    fixed = [0, 1, k - 1, k, k + 1, width, width + 9]
    rand = torch.randint(k + 2, width, (rows - len(fixed),), generator=gen).tolist()
    lengths = data.i32(fixed + rand)
    got = dsa_ops.topk_decode(x, lengths, k, stable=True)
    assert torch.equal(got, oracle.topk_decode(x, lengths, k))


LAYOUTS = {
    # name: (batch, next_n passed, builder(gen, batch, width) -> lengths, oracle layout)
    "per_row_1d": (6, 1, lambda g, b, w: torch.randint(-5, w + 6, (b,), generator=g), "per_row"),
    "per_row_2d_b1_next_n1": (6, 1, lambda g, b, w: torch.randint(-5, w + 6, (b, 1), generator=g), "per_row"),
    "per_row_2d_bn_next_n2": (3, 2, lambda g, b, w: torch.randint(-5, w + 6, (b, 2), generator=g), "per_row"),
    "per_row_2d_bn_next_n4": (3, 4, lambda g, b, w: torch.randint(-5, w + 6, (b, 4), generator=g), "per_row"),
    "per_request_next_n1": (6, 1, lambda g, b, w: torch.randint(-5, w + 6, (b,), generator=g), "per_row"),
    # Per request: lengths 1 and 2 make the earlier draft rows negative (clamped to 0), w + 3
    # makes the last rows exceed W (clamped to W).
    "per_request_next_n2": (4, 2, lambda g, b, w: torch.tensor([1, 2, 100, w + 3]), "per_request"),
    "per_request_next_n4": (5, 4, lambda g, b, w: torch.tensor([1, 3, 70, w, w + 3]), "per_request"),
}


@pytest.mark.parametrize("stable", [True, False], ids=["stable", "unstable"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_decode_lengths_layouts(gen, layout, stable):
    batch, next_n, build, oracle_layout = LAYOUTS[layout]
    width, k = 120, 32
    lengths = build(gen, batch, width).to(torch.int32)
    rows = batch * next_n if oracle_layout == "per_request" else lengths.numel()
    x = data.logits(gen, rows, width, "ties")
    got = dsa_ops.topk_decode(x, lengths, k, next_n, stable=stable)
    per_row = oracle.decode_lengths(lengths, rows, next_n, oracle_layout, width)
    _check(got, x, [(0, n) for n in per_row], k, stable)
    # The same lengths written per row (1-D) give the same answer.
    assert torch.equal(got, dsa_ops.topk_decode(x, data.i32(per_row), k, stable=stable))


@pytest.mark.parametrize("next_n", [2, 4])
def test_decode_ambiguous_b1_layout_rejected(next_n):
    x = torch.randn(3 * next_n, 50)
    with pytest.raises(ValueError, match="^lengths: .*ambiguous"):
        dsa_ops.topk_decode(x, torch.full((3, 1), 20, dtype=torch.int32), 8, next_n)


# --- buffers: poisoned out, poisoned tail, sliced rows, empty shapes ------------------


def test_decode_poisoned_out_every_slot(gen):
    width, k = 400, 128
    lengths = data.i32([0, 1, 5, 127, 128, 129, 400, 250])
    x = data.logits(gen, len(lengths), width, "specials")
    out = data.poisoned_out(len(lengths), k)
    res = dsa_ops.topk_decode(x, lengths, k, out=out, stable=True)
    assert res is out
    assert torch.equal(out, oracle.topk_decode(x, lengths, k))  # every slot, -1 tail included
    assert not (out == data.POISON).any()


def test_prefill_poisoned_out_every_slot(gen):
    width, k = 400, 64
    starts = data.i32([0, 10, 50, 399, 200, 7])
    ends = data.i32([0, 10, 300, 400, 120, 71])
    x = data.logits(gen, len(starts), width, "ties")
    out = data.poisoned_out(len(starts), k)
    res = dsa_ops.topk_prefill(x, starts, ends, k, out=out, stable=True)
    assert res is out
    assert torch.equal(out, oracle.topk_prefill(x, starts, ends, k))


@pytest.mark.parametrize("poison", ["+nan", "+nan_max", "+inf", "+max"])
def test_decode_poisoned_tail_is_ignored(gen, poison):
    """Values at or past L (better than anything in the window) must not change the result."""
    width, k = 500, 64
    lengths = data.i32([0, 1, 63, 64, 65, 300, 499, 500])
    clean = data.logits(gen, len(lengths), width, "ties")
    dirty = clean.clone()
    for r, n in enumerate(lengths.tolist()):
        dirty[r, n:] = data.from_bits([data.SPECIAL_BITS[poison]])
    got = dsa_ops.topk_decode(dirty, lengths, k, stable=True)
    assert torch.equal(got, dsa_ops.topk_decode(clean, lengths, k, stable=True))
    assert torch.equal(got, oracle.topk_decode(clean, lengths, k))


@pytest.mark.parametrize("poison", ["+nan", "+inf"])
def test_prefill_poisoned_outside_window_is_ignored(gen, poison):
    width, k = 500, 64
    starts = data.i32([0, 5, 100, 400, 450])
    ends = data.i32([60, 70, 401, 500, 451])
    clean = data.logits(gen, len(starts), width, "randn")
    dirty = clean.clone()
    p = data.from_bits([data.SPECIAL_BITS[poison]])
    for r, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())):
        dirty[r, :s] = p
        dirty[r, e:] = p
    got = dsa_ops.topk_prefill(dirty, starts, ends, k, stable=True)
    assert torch.equal(got, oracle.topk_prefill(clean, starts, ends, k))


def test_sliced_rows_match_contiguous(gen):
    """A view with row pitch > W (the gap full of NaN) reads only its own columns."""
    width, k = 300, 50
    x = data.logits(gen, 7, width, "specials")
    view = data.sliced(x, extra=41)
    lengths = data.i32([0, 1, 49, 50, 51, 300, 200])
    assert torch.equal(dsa_ops.topk_decode(view, lengths, k), oracle.topk_decode(x, lengths, k))
    starts = data.i32([0, 3, 60, 299, 0, 100, 250])
    assert torch.equal(
        dsa_ops.topk_prefill(view, starts, lengths, k), oracle.topk_prefill(x, starts, lengths, k)
    )


def test_zero_rows_and_zero_width():
    empty = dsa_ops.topk_decode(torch.empty(0, 100), data.i32([]), 16)
    assert empty.shape == (0, 16) and empty.dtype == torch.int32
    out = torch.empty(0, 16, dtype=torch.int32)
    assert dsa_ops.topk_prefill(torch.empty(0, 100), data.i32([]), data.i32([]), 16, out=out) is out
    # W = 0: every window is empty whatever the lengths say.
    got = dsa_ops.topk_decode(torch.empty(3, 0), data.i32([0, 5, -1]), 4)
    assert torch.equal(got, torch.full((3, 4), -1, dtype=torch.int32))


@pytest.mark.parametrize("k", [1, 4096])
def test_k_extremes(gen, k):
    width = 5000
    lengths = data.i32([0, 1, 4095, 4096, 4097, 5000])
    x = data.logits(gen, len(lengths), width, "ties")
    assert torch.equal(dsa_ops.topk_decode(x, lengths, k, stable=True), oracle.topk_decode(x, lengths, k))


# --- prefill ----------------------------------------------------------------------------


@pytest.mark.parametrize("stable", [True, False], ids=["stable", "unstable"])
@pytest.mark.parametrize("kind", KINDS)
def test_prefill_windows(gen, kind, stable):
    """Nonzero starts, empty and inverted windows, starts < 0 and ends > W (both clamped)."""
    width, k = 700, 64
    windows = [
        (0, 0), (5, 5), (10, 74), (10, 75), (10, 73), (300, 301),  # empty, L = k, k+1, k-1, 1
        (90, 40), (700, 700), (650, 900), (-20, 30), (-50, -10),  # inverted, at W, clamps
        (0, 700), (123, 700), (699, 700), (-1, 701),
    ]
    starts, ends = data.i32([s for s, _ in windows]), data.i32([e for _, e in windows])
    x = data.logits(gen, len(windows), width, kind)
    got = dsa_ops.topk_prefill(x, starts, ends, k, stable=stable)
    _check(got, x, oracle.prefill_windows(starts, ends, width), k, stable)


def test_prefill_random_chunk(gen):
    """A vLLM-like chunk: requests of random sizes gathered side by side, causal ends."""
    rng = random.Random(int(torch.randint(0, 2**31, (1,), generator=gen)))
    k, starts, ends, offset = 128, [], [], 0
    for _ in range(4):
        seq = rng.randint(1, 600)
        for pos in sorted(rng.sample(range(seq), min(seq, 5))):  # query tokens of this request
            starts.append(offset)
            ends.append(offset + pos + 1)
        offset += seq
    x = data.logits(gen, len(starts), offset, "randn")
    s, e = data.i32(starts), data.i32(ends)
    assert torch.equal(dsa_ops.topk_prefill(x, s, e, k, stable=True), oracle.topk_prefill(x, s, e, k))


def test_prefill_1m_columns(gen):
    rows, width, k = 4, 1 << 20, 2048
    x = torch.randint(0, 1000, (rows, width), generator=gen).float()
    starts = data.i32([0, 1000, 500_000, width - 3000])
    ends = data.i32([width, 1000 + k + 1, 500_000 + k - 1, width + 50])
    got = dsa_ops.topk_prefill(x, starts, ends, k, stable=True)
    assert torch.equal(got, oracle.topk_prefill(x, starts, ends, k))
