"""Backend ``triton`` against the contract: in Triton's interpreter on CPU, and on a GPU.

The interpreter is chosen when ``triton.jit`` decorates the kernels, i.e. from the
environment of the process that first imports ``dsa_ops.backends.triton.kernels``. So the
CPU cases run in a child pytest with ``TRITON_INTERPRET=1`` (``test_interpreter_suite``),
which leaves every other test module of this session untouched; in that child the cases
below run directly. GPU cases (``-m gpu``) use the compiled kernel at real shapes.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dsa_ops
from dsa_ops.testing import assert_decode_equivalent, assert_prefill_equivalent
from tests import oracle
from tests.data import POISON, from_bits, logits, poison_tail, poisoned_out, sliced
from tests.test_properties import assert_topk_properties, decode_case, prefill_case

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
HAS_TRITON = True
try:
    import triton  # noqa: F401  (import only: the kernels module is what picks the mode)
except Exception:  # pragma: no cover - CI installs triton
    HAS_TRITON = False

interp = pytest.mark.skipif(not INTERP, reason="runs in the TRITON_INTERPRET=1 child of test_interpreter_suite")


def test_interpreter_suite():
    """Run this file's interpreter cases in a child process with TRITON_INTERPRET=1."""
    if INTERP:
        pytest.skip("already the interpreter child")
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "TRITON_INTERPRET": "1", "DSA_OPS_TRITON_FAKE_SMS": "8"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not gpu", __file__]
    res = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, (res.stdout + res.stderr)[-6000:]
    assert " passed" in res.stdout and "failed" not in res.stdout, res.stdout[-2000:]


# --- interpreter cases (CPU) ------------------------------------------------------------


@interp
@pytest.mark.parametrize("k", [16, 64, 2048])
@pytest.mark.parametrize("stable", [False, True])
def test_decode_lengths_edges(gen, k, stable):
    width = k + 900
    lens = [0, 1, k - 1, k, k + 1, width, 5000, -3]  # clamped to [0, W]
    x = logits(gen, len(lens), width)
    lt = torch.tensor(lens, dtype=torch.int32)
    got = [dsa_ops.topk_decode(poison_tail(x, lens, v), lt, k, backend="triton", stable=stable,
                               out=poisoned_out(len(lens), k)) for v in (float("nan"), float("inf"))]
    assert_decode_equivalent(got[0], x, lt, k, stable=stable)
    if stable:
        assert torch.equal(got[0], got[1])  # what lies past L never matters
    else:
        assert_decode_equivalent(got[1], x, lt, k)


@interp
@pytest.mark.parametrize("kind", ["ties", "equal", "specials"])
@pytest.mark.parametrize("k", [16, 2048])
def test_decode_adversarial(gen, kind, k):
    width = 3000
    x = logits(gen, 4, width, kind)
    lt = torch.tensor([width, k + 1, 2500, 0], dtype=torch.int32)
    for stable in (False, True):
        got = dsa_ops.topk_decode(x, lt, k, backend="triton", stable=stable)
        assert_decode_equivalent(got, x, lt, k, stable=stable)


@interp
@pytest.mark.parametrize("next_n", [1, 2, 4])
def test_decode_per_request_layout(gen, next_n):
    k, width, batch = 64, 1500, 3
    x = logits(gen, batch * next_n, width)
    per_req = torch.tensor([1500, 70, 2], dtype=torch.int32)
    per_row = torch.stack([per_req - next_n + 1 + j for j in range(next_n)], dim=1)  # (B, n) flat
    a = dsa_ops.topk_decode(x, per_req, k, next_n, backend="triton", stable=True)
    b = dsa_ops.topk_decode(x, per_row.contiguous(), k, next_n, backend="triton", stable=True)
    assert_decode_equivalent(a, x, per_req, k, next_n, stable=True)
    assert torch.equal(a, b)


@interp
@pytest.mark.parametrize("next_n", [2, 4])
@pytest.mark.parametrize("stable", [False, True])
def test_decode_per_request_lengths_near_int_min(gen, next_n, stable):
    """A request length near INT_MIN minus the draft offset must clamp to 0 (all -1), not wrap
    to ~2^31 in int32 and clamp to W (issue #25: 8 indices in row 0 at -2^31, next_n = 2)."""
    k, width = 8, 300
    per_req = torch.tensor([-2**31, -2**31 + 1, 2**31 - 1, 5], dtype=torch.int32)
    x = logits(gen, 4 * next_n, width)
    got = dsa_ops.topk_decode(x, per_req, k, next_n, backend="triton", stable=stable, out=poisoned_out(4 * next_n, k))
    assert (got[: 2 * next_n] == -1).all(), got[: 2 * next_n]
    assert_decode_equivalent(got, x, per_req, k, next_n, stable=stable)


@interp
@pytest.mark.parametrize("slices, cap", [(1, None), (3, None), (16, None), (2, 64), (1, 64)])
@pytest.mark.parametrize("kind", ["randn", "ties"])
def test_launch_modes(gen, slices, cap, kind):
    """Row mode (1), split without / with bucket counting (3 / 16), and a mid buffer too
    small for the candidates (cap = k): every case must reach the same exact answer."""
    from dsa_ops.backends.triton import launch

    k, width = 64, 4000
    x = logits(gen, 3, width, kind)
    lt = torch.tensor([4000, 3333, 65], dtype=torch.int32)
    for stable in (False, True):
        out = poisoned_out(3, k)
        launch.launch(x, lt, lt, lt, k, 1, False, stable, out, slices=slices, cap=cap)
        assert_decode_equivalent(out, x, lt, k, stable=stable)


@interp
@pytest.mark.parametrize("budget, hist_mask, dbits, sparse", [
    (0, True, 12, 0), (1 << 18, True, 12, 0), (1 << 40, True, 12, 0), (0, False, 12, 0), (0, True, 8, 0),
    (1 << 18, False, 8, 0), (0, True, 8, 1 << 30), (1 << 18, True, 8, 1 << 30), (0, True, 5, 1 << 30),
    (0, True, 8, -(1 << 30))])
@pytest.mark.parametrize("kind", ["randn", "ties", "specials"])
def test_radix_paths(gen, budget, hist_mask, dbits, kind, sparse):
    """The radix kernel's exits without the bracket (its fallback): four full passes
    (budget 0), the candidate rank after an early pass (large budget), and the default;
    every one reaches the exact answer, with
    and without ``tl.histogram``'s mask (older Tritons take the spare-bin form), with
    12-bit (three passes) and 8-bit (four passes) digits, and with every pass after the
    first counted by per-key atomics (sparse) or by ``tl.histogram`` (dense)."""
    from dsa_ops.backends.triton import radix_launch

    k, width = 64, 5000
    x = logits(gen, 3, width, kind)
    lt = torch.tensor([5000, 3333, 65], dtype=torch.int32)
    for stable in (False, True):
        out = poisoned_out(3, k)
        radix_launch.launch(x, lt, lt, lt, k, 1, False, stable, out, rank_budget=budget, block=1024,
                            hist_mask=hist_mask, dbits=dbits, sparse_max=abs(sparse), fuse=sparse >= 0,
                            bracket=False)
        assert_decode_equivalent(out, x, lt, k, stable=stable)


@interp
def test_radix_bin_equals_kth(gen):
    """The k largest share one top digit and everything else lies in other bins: the chosen
    bin holds exactly the keys still needed (taken whole, no rank, no further pass)."""
    from dsa_ops.backends.triton import radix_launch

    k, width = 128, 3000
    x = -torch.rand(2, width, generator=gen)  # in (-1, 0]
    top = torch.randperm(width, generator=gen)[:k]
    x[:, top] = 64.0 + 63.0 * torch.rand(2, k, generator=gen)  # one exponent: one top digit
    lt = torch.tensor([width, width], dtype=torch.int32)
    for stable, bracket in ((False, False), (False, True), (True, False)):
        out = poisoned_out(2, k)
        radix_launch.launch(x, lt, lt, lt, k, 1, False, stable, out, bracket=bracket)
        assert_decode_equivalent(out, x, lt, k, stable=stable)
        assert set(out[0].tolist()) == set(top.tolist())


@interp
@pytest.mark.parametrize("budget", [0, 4096, None])
@pytest.mark.parametrize("fuse", [True, False])
def test_radix_gathered_bin(gen, budget, fuse):
    """Pass 1's bin holds ~500 keys around the k-th (one exponent): too many to rank at
    budget 4096, few enough to gather. With fuse the next read writes the winners and
    gathers the bin into the buffer, and every later pass, the rank (budget 4096) or the
    take-whole (budget 0) works on the gathered keys; without fuse the row is re-read."""
    from dsa_ops.backends.triton import radix_launch

    k, width = 200, 5000
    x = -torch.rand(3, width, generator=gen)
    for r, n in enumerate((500, 900, 260)):
        cols = torch.randperm(width, generator=gen)[:n]
        x[r, cols] = 64.0 + 63.0 * torch.rand(n, generator=gen)  # one exponent: one top digit
    x[2, :40] = x[2, 40:80]  # ties inside the bin
    lt = torch.tensor([width, width, 4321], dtype=torch.int32)
    for stable in (False, True):
        out = poisoned_out(3, k)
        radix_launch.launch(x, lt, lt, lt, k, 1, False, stable, out, rank_budget=budget, sparse_max=1 << 30,
                            fuse=fuse, bracket=False)
        assert_decode_equivalent(out, x, lt, k, stable=stable)


def _bracket_rows(gen, width, k, st):
    """Rows that drive the bracket (``samp`` 256, samples at columns i * st + st // 2) down
    each of its paths: 1 sampled window (randn), 2 the k-th below the bins' base (k + 40
    huge values off the sample columns), 3 missed (the samples are the row's best keys, so
    fewer than k keys reach the window's top), 3 window overflow (80 % of the row ties the best;
    without room for lane regions)."""
    x = torch.randn(4, width, generator=gen)
    off = torch.ones(width, dtype=torch.bool)
    off[st // 2::st] = False  # not a sample column
    cols = torch.nonzero(off).flatten()
    x[1, cols[torch.randperm(cols.numel(), generator=gen)[:k + 40]]] = 1e30
    x[2] = -torch.rand(width, generator=gen)
    x[2, st // 2::st] = 1e3 + torch.rand(width // st + (width % st > st // 2), generator=gen)
    x[3] = (torch.rand(width, generator=gen) < 0.8).float()  # 80 % tie for the best key
    return x


@interp
@pytest.mark.parametrize("width, k, pipe, lanes", [(6000, 512, False, None), (5000, 64, True, False),
                                                   (6000, 512, False, False)])
def test_radix_bracket_paths(gen, width, k, pipe, lanes):
    """Every way out of the bracket, checked by the kernel's path stats, reaches the exact
    answer; stable rows and rows under 4 x samp columns never take the bracket. Row mode
    (every CPU plan) gathers into lane regions unless told not to (``lanes=False``: the
    slot-counter regions)."""
    from dsa_ops.backends.triton import radix_launch

    st = width // 256
    x = _bracket_rows(gen, width, k, st)
    lt = torch.full((4,), width, dtype=torch.int32)
    stats = torch.full((4, 2), -1, dtype=torch.int32)
    out = poisoned_out(4, k)
    radix_launch.launch(x, lt, lt, lt, k, 1, False, False, out, stats=stats, pipe=pipe, samp=256,
                        prefetch=2 if pipe else 1, lanes=lanes)
    assert_decode_equivalent(out, x, lt, k)
    # lane regions come with room for the lanes' spread: the tied row fits, and its one bin
    # of ties takes digit passes over the lane regions
    assert stats[:, 0].tolist() == [1, 2, 3, 3 if lanes is False else 1], stats
    assert stats[0, 1] >= k and stats[1, 1] >= k and stats[2, 1] < k
    assert stats[3, 1] >= 1 << 24 if lanes is False else k < stats[3, 1] < width
    short = torch.tensor([1023, width, 1500, 2047], dtype=torch.int32)  # rows 1..3: >= 4 x 256
    for stable in (False, True):
        stats.fill_(-1)
        out = poisoned_out(4, k)
        radix_launch.launch(x, short, short, short, k, 1, False, stable, out, stats=stats, samp=256, lanes=lanes)
        assert_decode_equivalent(out, x, short, k, stable=stable)
        assert stats[0].tolist() == [-1, -1] and (stats[1:, 0] >= 1).all() != stable, stats
    stats.fill_(-1)  # no window bins: rows 0 and 1 radix their gathered keys from the top digit
    out = poisoned_out(4, k)
    radix_launch.launch(x, lt, lt, lt, k, 1, False, False, out, stats=stats, samp=256, bins=False, lanes=lanes)
    assert_decode_equivalent(out, x, lt, k)
    assert stats[:, 0].tolist() == [2, 2, 3, 3 if lanes is False else 2], stats


@interp
def test_radix_bracket_read_worst_key_rows(gen):
    """The bracket's read (lane regions, and the slot-counter regions: per-key atomics, one
    or two blocks in flight, pipelined stores, a block scan) pads past a row's window with
    the bits of the worst key (the NaN 0xFFFFFFFF, order key INT_MAX) and clamps the
    window's top below it. Rows made mostly of that key (the k-th key is INT_MAX: the
    bracket must fall back, exactly), rows with it sprinkled in, and windows that end
    mid-step or start off the block grid, at lane read steps of 1, 2 and 4 blocks with and
    without the next step in flight; no window counts padding."""
    from dsa_ops.backends.triton import radix_launch

    width, k = 9000, 1024
    x = logits(gen, 6, width)
    worst = from_bits(torch.full((width,), 0xFFFF_FFFF))
    x[0] = worst
    x[0, ::7] = torch.randn(len(range(0, width, 7)), generator=gen)  # ~1286 ordinary keys, then INT_MAX ties
    x[1] = worst
    x[1, :k - 1] = 1.0  # one ordinary key short of k: the k-th is INT_MAX
    x[2, ::3] = worst[::3]
    x[5] = worst
    x[5, :100] = 1.0  # the k-th is INT_MAX (falls back), and its last step is mostly padding
    s = torch.tensor([0, 0, 5, 1, 333, 0], dtype=torch.int32)
    e = torch.tensor([width, width, width - 100, 7777, width - 1, 2500], dtype=torch.int32)
    for step, prefetch in ((1, True), (2, False), (4, True), (4, False)):
        for stable in (False, True):
            out = poisoned_out(6, k)
            stats = torch.full((6, 2), -1, dtype=torch.int32)
            radix_launch.launch(x, s, s, e, k, 1, True, stable, out, block=1024, num_warps=4, lanes=not stable or None,
                                lane_step=step if not stable else None, lane_prefetch=prefetch or stable, stats=stats)
            assert_prefill_equivalent(out, x, s, e, k, stable=stable)
            if not stable:  # no padding in any window; the INT_MAX rows fall back
                assert stats[:, 0].tolist() == [1, 3, 1, 1, 1, 3] and (stats[:, 1] <= e - s).all(), (step, stats)
    for kw in (dict(), dict(prefetch=2), dict(pipe=True), dict(catom=False)):
        out = poisoned_out(6, k)
        stats = torch.full((6, 2), -1, dtype=torch.int32)
        radix_launch.launch(x, s, s, e, k, 1, True, False, out, block=1024, num_warps=4, lanes=False, stats=stats, **kw)
        assert_prefill_equivalent(out, x, s, e, k)
        assert stats[:, 0].tolist() == [1, 3, 1, 1, 1, 3] and (stats[:, 1] <= e - s).all(), (kw, stats)


@interp
def test_radix_lane_regions_overflow(gen):
    """Lane regions: a lane that gets more window keys than its rows (here every 128th
    column is among the best, so lane 0 of 128 gets all of them) sends its row to the exact
    fallback (path 3, the region poisoned); the other rows keep the bracket, and padded rows
    (live length past the last full block, and a window that starts mid-block) stay exact;
    the same with the window bins counted after the read (``postbins``), and with read steps
    of several blocks (``lane_step``, with and without the next step in flight)."""
    from dsa_ops.backends.triton import radix_launch

    width, k, lanes = 16384, 2048, 128
    p, _ = radix_launch.launch_plan(4, width, torch.device("cpu"), block=1024, num_warps=4, k=k, lanes=True)
    lcap = p.cand_cap // 2 // lanes - 1  # rows of a lane's region
    assert 16 + width // 4 // lanes < lcap < width // lanes, lcap  # (a window: about a fifth of a 16K row)
    x = logits(gen, 4, width)
    x[0, ::lanes] = 1e3 + torch.rand(width // lanes, generator=gen)  # lane 0: a key a row of it, too many
    x[1, 5::lanes] = 1e3 + torch.rand(width // lanes, generator=gen)  # lane 5: the same
    x[2, ::lanes * 8] = 1e3 + torch.rand(width // lanes // 8, generator=gen)  # 16 more in lane 0: fits
    s = torch.tensor([0, 0, 0, 77], dtype=torch.int32)
    e = torch.tensor([width, width, width - 333, width - 5], dtype=torch.int32)
    # window bins counted in the read, or after it from the regions; blocks a read step, prefetch
    for postbins, step, prefetch in ((False, 1, True), (True, 1, True), (True, 4, True), (True, 2, False)):
        stats = torch.full((4, 2), -1, dtype=torch.int32)
        out = poisoned_out(4, k)
        radix_launch.launch(x, s, s, e, k, 1, True, False, out, stats=stats, block=1024, num_warps=4, lanes=True,
                            postbins=postbins, lane_step=step, lane_prefetch=prefetch)
        assert_prefill_equivalent(out, x, s, e, k)
        assert stats[:2].tolist() == [[3, 1 << 24]] * 2 and stats[2:, 0].tolist() == [1, 1], stats


@interp
def test_radix_workspace_shared_by_launch_shapes(gen):
    """Launches of one (rows, width, k) share a workspace whatever their warps or window bins;
    one with fewer window bins (NBW = 256 x num_warps, or ``nbw``) must not leave keys where
    a later launch with more bins counts them (the candidate buffer once started right after
    the launch's own bins)."""
    from dsa_ops.backends.triton import radix_launch

    width, k = 6000, 512
    lt = torch.tensor([width, width - 7, 3000], dtype=torch.int32)
    for kw in (dict(num_warps=4, block=1024), dict(nbw=256), dict(), dict(nbw=512), dict(num_warps=4, block=1024),
               dict()):
        x = logits(gen, 3, width)
        out = poisoned_out(3, k)
        radix_launch.launch(x, lt, lt, lt, k, 1, False, False, out, **kw)
        assert_decode_equivalent(out, x, lt, k)


@interp
@pytest.mark.parametrize("k", [512, 64])
def test_radix_bracket_finisher(gen, monkeypatch, k):
    """Split rows (16 programs) with the finisher: no barrier, the last program to arrive
    finishes the row alone (one pass over every region, then rank, passes or the whole row;
    the last row's bin is a dense cluster that needs passes after the region pass wrote
    the clear winners).
    Programs never wait on one another on this path, so the interpreter can run a split
    plan; every bracket path must reach the exact answer (and with the finisher off, the
    same rows take the barrier path, which the interpreter cannot run)."""
    from dsa_ops.backends.triton import radix_launch

    width = 6000
    real_plan = radix_launch.plan
    monkeypatch.setattr(radix_launch, "plan", lambda rows, w, dev, *a, **kw: radix_launch.RadixPlan(
        grid0=rows, slices=16, cand_cap=real_plan(rows, w, dev, *a, **kw).cand_cap, rank_budget=4096))
    x = _bracket_rows(gen, width, k, width // 256)
    tie = torch.round(torch.randn(1, width, generator=gen) * 3)  # ties across regions
    dense = torch.randn(1, width, generator=gen) * 0.01  # k // 2 clear winners, then a dense cluster
    cols = torch.randperm(width, generator=gen)
    dense[0, cols[:k // 2]] = 100.0 + torch.rand(k // 2, generator=gen) * 200.0
    dense[0, cols[k // 2:3 * k]] = 0.3 + torch.rand(3 * k - k // 2, generator=gen) * 1e-4
    x = torch.cat([x, tie, dense])
    lt = torch.full((6,), width, dtype=torch.int32)
    stats = torch.full((6, 2), -1, dtype=torch.int32)
    out = poisoned_out(6, k)
    radix_launch.launch(x, lt, lt, lt, k, 1, False, False, out, stats=stats, block=128, min_slice=128,
                        bracket=True, finisher=True, samp=256)
    assert_decode_equivalent(out, x, lt, k)
    assert stats[:4, 0].tolist() == [1, 2, 3, 3] and stats[4, 0] in (1, 2) and stats[5, 0] == 1, stats


@interp
def test_radix_launch_refuses_bad_knobs():
    from dsa_ops.backends.triton import radix_launch

    x = torch.randn(2, 3000)
    lt = torch.full((2,), 3000, dtype=torch.int32)
    out = poisoned_out(2, 64)
    for kw, msg in ((dict(samp=300), "samp"), (dict(nbw=100), "nbw"), (dict(prefetch=3), "prefetch"),
                    (dict(rb=100), "rb"), (dict(maxnreg=100), "maxnreg"),
                    (dict(stats=torch.zeros(2, 3, dtype=torch.int32)), "stats"),
                    (dict(stats=torch.zeros(2, 2, dtype=torch.int64)), "stats"),
                    (dict(bracket=1000), "bracket"), (dict(bracket=2.5e4), "bracket"),
                    (dict(wagg=True), "wagg"), (dict(wagg_max=-1), "wagg_max"), (dict(wagg_max=1.5), "wagg_max"),
                    (dict(lanes=True, pack=False), "lanes"), (dict(lanes=True, block=64), "lanes"),
                    (dict(lanes=False, postbins=True), "postbins"), (dict(bins=False, postbins=True), "postbins"),
                    (dict(lanes=True, lane_step=3), "lane_step"), (dict(lanes=False, lane_step=2), "lane_step"),
                    (dict(lanes=False, lane_prefetch=False), "lane_prefetch")):
        # (wagg=True: inline PTX, never on the CPU / interpreter)
        with pytest.raises(ValueError, match=msg):
            radix_launch.launch(x, lt, lt, lt, 64, 1, False, False, out, **kw)
    assert (out == POISON).all()


@interp
@pytest.mark.parametrize("stable", [False, True])
def test_radix_prefill_windows_and_million_columns(gen, stable):
    """Windows with a start offset (prefill form of the kernel), and one 1M-column row."""
    from dsa_ops.backends.triton import radix_launch

    k, width = 64, 2500
    x = logits(gen, 4, width)
    s = torch.tensor([0, 10, 500, 2490], dtype=torch.int32)
    e = torch.tensor([2500, 10, 2000, 2600], dtype=torch.int32)
    out = poisoned_out(4, k)
    radix_launch.launch(x, s, s, e, k, 1, True, stable, out)
    assert_prefill_equivalent(out, x, s, e, k, stable=stable)
    big = logits(gen, 1, 1 << 20)
    lt = torch.tensor([(1 << 20) - 3], dtype=torch.int32)
    got = dsa_ops.topk_decode(big, lt, 2048, backend="triton", stable=stable)
    assert_decode_equivalent(got, big, lt, 2048, stable=stable)


@interp
@settings(max_examples=40)
@given(st.data())
def test_radix_properties(draws):
    """Hypothesis cases of tests/test_properties.py (any fp32 bits, ties, sliced rows, every
    length layout) through the radix kernel with random knobs: small blocks (multi-block
    slices), 4..8-bit digits, no / default / unbounded early exit, dense or sparse later
    passes, with or without the bracket (rows of at least 4 x samp columns), its slot
    atomics plain / pipelined or a block scan, with or without window bins, window keys
    stored packed (int64) or as two arrays (packed: in lane regions where the block
    allows, or not), one or two
    blocks of loads in flight, the gathered keys emitted solo or with atomics, in steps of
    128 or 512."""
    from dsa_ops.backends.triton import radix_launch

    x, lengths, next_n, k, windows = draws.draw(decode_case(exact=True))
    if x.shape[0] == 0:
        return
    k = draws.draw(st.integers(1, max(1, x.shape[1] // 2)))  # mostly L > k: the selection paths
    knobs = dict(block=draws.draw(st.sampled_from([16, 64, 1024])), dbits=draws.draw(st.sampled_from([4, 5, 8])),
                 rank_budget=draws.draw(st.sampled_from([0, None, 1 << 40])),
                 sparse_max=draws.draw(st.sampled_from([0, 64, 1 << 30])), fuse=draws.draw(st.booleans()),
                 bracket=draws.draw(st.booleans()), samp=draws.draw(st.sampled_from([None, 128, 256])),
                 catom=draws.draw(st.booleans()), pipe=draws.draw(st.booleans()), solo_emit=draws.draw(st.booleans()),
                 prefetch=draws.draw(st.sampled_from([None, 1, 2])), rb=draws.draw(st.sampled_from([128, 512])),
                 bins=draws.draw(st.booleans()), pack=draws.draw(st.booleans()),
                 lanes=draws.draw(st.sampled_from([None, False])))
    lanes_on = knobs["lanes"] is None and radix_launch.launch_plan(  # the launch's own resolution of lanes=None
        x.shape[0], x.shape[1], x.device, block=knobs["block"], k=k, lanes=None,
        packed=knobs["pack"] and knobs["catom"])[1]["lanes"]
    knobs["postbins"] = draws.draw(st.booleans()) and knobs["bins"] and lanes_on
    if lanes_on:  # the lane read's step and prefetch (the rule takes 4 blocks a step only on CUDA)
        knobs.update(lane_step=draws.draw(st.sampled_from([None, 1, 2, 4])), lane_prefetch=draws.draw(st.booleans()))
    flat = lengths.reshape(-1)
    nn = 1 if flat.numel() == x.shape[0] else next_n
    for stable in (False, True):
        out = poisoned_out(x.shape[0], k)
        radix_launch.launch(x, flat, flat, flat, k, nn, False, stable, out, **knobs)
        if stable:
            assert torch.equal(out, oracle.topk_windows(x, windows, k)), knobs
        else:
            assert_topk_properties(out, x, windows, k)


@interp
@settings(max_examples=30)
@given(st.data())
def test_pivot_prefill_properties(draws):
    """Hypothesis prefill windows (empty, inverted, past W) through the sample-pivot kernel in
    row mode and in split mode, with a mid buffer that may be too small (exact fallback)."""
    from dsa_ops.backends.triton import launch

    x, starts, ends, k, windows = draws.draw(prefill_case(exact=True))
    if x.shape[0] == 0:
        return
    k = draws.draw(st.integers(1, max(1, x.shape[1] // 2)))
    knobs = dict(slices=draws.draw(st.sampled_from([1, 3])), cap=draws.draw(st.sampled_from([None, k])))
    for stable in (False, True):
        out = poisoned_out(x.shape[0], k)
        launch.launch(x, starts, starts, ends, k, 1, True, stable, out, **knobs)
        if stable:
            assert torch.equal(out, oracle.topk_windows(x, windows, k)), knobs
        else:
            assert_topk_properties(out, x, windows, k)


def test_radix_plan_split_and_its_off_switch(monkeypatch):
    """On a (faked) 132-SM GPU a single long row is split over at most 32 programs, 64 rows
    over 4 each (8 with launch's many-rows tuning: 4-warp programs, 4 per SM);
    DSA_OPS_TRITON_SPLIT=0 gives one program per row; bad knobs are refused."""
    from dsa_ops.backends.triton import radix_launch as rl

    monkeypatch.setattr(rl, "num_sms", lambda kind, index: 132)
    monkeypatch.setattr(rl.torch.version, "hip", None, raising=False)
    dev = torch.device("cuda", 0)
    assert rl.plan(1, 133120, dev).slices == 32
    assert rl.plan(64, 133120, dev).slices == 4
    assert rl.plan(300, 133120, dev).slices == 1
    for rows, warps, slices in ((1, 8, 32), (15, 8, 17), (16, 4, 32), (64, 4, 8)):  # launch's tuning by rows
        t = rl.tuning(rows)
        p = rl.plan(rows, 133120, dev, block=t["block"], num_warps=t["num_warps"], per_sm=t["per_sm"])
        assert (t["num_warps"], p.slices) == (warps, slices) and rows * p.slices <= 132 * t["per_sm"]
    with pytest.raises(ValueError, match="per_sm"):
        rl.plan(1, 133120, dev, per_sm=3)
    # launch's shape: row mode (many rows) trades registers for programs unless told otherwise
    p, sh = rl.launch_plan(16384, 131072, dev)
    assert (p.slices, p.grid0, sh["maxnreg"]) == (1, 132 * rl.ROW_PER_SM, rl.ROW_MAXNREG)
    assert rl.ROW_PER_SM * sh["num_warps"] * 32 * rl.ROW_MAXNREG <= 65536
    p, sh = rl.launch_plan(16384, 131072, dev, maxnreg=128, per_sm=4)
    assert (p.grid0, sh["maxnreg"]) == (528, 128)
    p, sh = rl.launch_plan(64, 133120, dev)  # split mode keeps the co-residency caps
    assert (p.slices, sh["maxnreg"]) == (8, rl.MAXNREG)
    assert rl.launch_plan(16384, 131072, torch.device("cpu"))[1]["maxnreg"] == rl.MAXNREG
    # lane regions by the measured rule: rows of one program each, or a wide prefill chunk
    # (there with LANE_ROW_SHAPE and the bins after the read); the candidate buffer grows to hold them
    p, sh = rl.launch_plan(16384, 131072, dev, lanes=None)
    assert (sh["lanes"], sh["postbins"], sh["maxnreg"], p.grid0, sh["lane_step"]) == (True, True, 128, 132 * 4, 4), sh
    assert p.cand_cap // 2 // 128 - 1 >= 64  # lane rows: ~42 keys a lane at 128K, samp 512
    p, sh = rl.launch_plan(16384, rl.LANES_WIDE, dev, lanes=None)  # from 64K columns (runs 54-55)
    assert (sh["lanes"], sh["postbins"], sh["maxnreg"], sh["lane_step"]) == (True, True, 128, 4), sh
    p, sh = rl.launch_plan(16384, rl.LANES_WIDE - 1, dev, lanes=None)  # narrower chunks: the slot counters
    assert (sh["lanes"], sh["postbins"], sh["maxnreg"]) == (False, False, rl.ROW_MAXNREG), sh
    assert rl.LANES_WIDE == 65536
    p, sh = rl.launch_plan(512, 133120, dev, lanes=None)  # row-mode decode, 512 programs
    assert (p.slices, sh["lanes"], sh["postbins"], sh["maxnreg"], sh["lane_step"]) == (1, True, False, rl.ROW_MAXNREG,
                                                                                     1), sh
    assert not rl.launch_plan(64, 133120, dev, lanes=None)[1]["lanes"]  # split mode: not measured to gain
    assert not rl.launch_plan(512, 133120, dev, lanes=None, packed=False)[1]["lanes"]
    with pytest.raises(ValueError, match="lanes"):
        rl.launch_plan(512, 133120, dev, lanes=True, packed=False)
    p, sh = rl.launch_plan(64, 133120, dev, lanes=True)  # split-mode lanes: room for 8 programs' lanes
    assert sh["lanes"] and p.cand_cap // 2 // p.slices // 128 - 1 >= 24, p
    with pytest.raises(ValueError, match="maxnreg"):
        rl.launch_plan(1, 133120, dev, maxnreg=100)
    # warp-aggregated slot atomics: CUDA, compiled, 4 keys a thread in every group of a block
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert rl.wagg_ok(dev, 1024, 4) and rl.wagg_ok(dev, 2048, 8) and not rl.wagg_ok(dev, 512, 8)
    assert not rl.wagg_ok(torch.device("cpu"), 1024, 4)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not rl.wagg_ok(dev, 1024, 4)
    monkeypatch.setenv("DSA_OPS_TRITON_SPLIT", "0")
    assert rl.plan(1, 133120, dev).slices == 1
    with pytest.raises(ValueError, match="dbits"):
        rl.launch(torch.zeros(1, 8), *(torch.zeros(1, dtype=torch.int32),) * 3, 4, 1, False, False,
                  torch.zeros(1, 4, dtype=torch.int32), dbits=13)


@interp
def test_grown_workspace_serves_every_later_shape(gen, monkeypatch):
    """One grown workspace serves launches of any rows and width in any order (a larger buffer
    than the plan asks for, cut to its slots), for both kernels, and stays one buffer a kernel."""
    from dsa_ops.backends.triton import workspace

    monkeypatch.setattr(workspace, "_WORKSPACES", {})
    monkeypatch.setattr(workspace, "_RETIRED", [])
    for rows, width, k in ((1, 6000, 512), (3, 300, 16), (2, 5000, 64), (5, 800, 512), (9, 2100, 64), (1, 300, 8)):
        x = logits(gen, rows, width, "ties" if rows % 2 else "randn")
        lt = torch.randint(0, width + 20, (rows,), generator=gen, dtype=torch.int32)
        got = dsa_ops.topk_decode(x, lt, k, backend="triton", out=poisoned_out(rows, k))
        assert_decode_equivalent(got, x, lt, k)
        s = torch.randint(0, width // 2, (rows,), generator=gen, dtype=torch.int32)
        got = dsa_ops.topk_prefill(x, s, lt, k, backend="triton", stable=True, out=poisoned_out(rows, k))
        assert_prefill_equivalent(got, x, s, lt, k, stable=True)
    assert sorted(key[-1] for key in workspace._WORKSPACES) == ["pivot", "radix"]


def _sweep_bytes(monkeypatch, rows_list, width: int) -> tuple[int, int]:
    """(bytes the cache holds, bytes of the largest single request) after asking for the radix
    workspace of every row count's plan on a simulated 132-multiprocessor CUDA device."""
    from dsa_ops.backends.triton import radix_launch, workspace

    monkeypatch.setattr(workspace, "_WORKSPACES", {})
    monkeypatch.setattr(workspace, "_RETIRED", [])
    monkeypatch.setattr(radix_launch, "num_sms", lambda device_type, index: 132)
    monkeypatch.setattr(radix_launch.torch.version, "hip", None)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    largest = slots = stride = 0
    for rows in rows_list:
        p, _ = radix_launch.launch_plan(rows, width, cuda, lanes=None)
        ws = radix_launch.workspace(cpu, p.grid0, p.ws_stride)
        assert ws.shape[0] == p.grid0 and ws.stride(0) >= p.ws_stride
        largest = max(largest, 4 * p.grid0 * p.ws_stride)
        slots, stride = max(slots, p.grid0), max(stride, p.ws_stride)
    assert len(workspace._WORKSPACES) == 1 and (ws == 0).all()
    return workspace.workspace_bytes(), 4 * slots * stride


@pytest.mark.parametrize("rows_list, width, bound_mib", [
    (range(1, 1056), 131072, 360),  # prefill chunks of every row count (was ~167 GiB projected)
    (range(1, 513), 163840, 360),  # decode batches of every size (was ~48 GiB projected)
    (list(range(512, 0, -1)) + list(range(1, 41)), 133120, 360),  # shrinking, then growing again
])
def test_workspace_memory_bounded_over_row_counts(monkeypatch, rows_list, width, bound_mib):
    """Issue #25: the workspace cache keyed every (slots, stride), so a serving process that sees
    every row count kept one workspace each. Now one buffer a kernel and stream, at most 1/8
    over the largest slots x the largest stride asked for."""
    held, largest = _sweep_bytes(monkeypatch, rows_list, width)
    assert held <= largest * 9 // 8 and held <= bound_mib << 20, (held / 2**20, largest / 2**20)


def test_workspaces_are_cached_per_kernel_and_size(monkeypatch):
    """Both kernels' workspaces come from one cache: a request the cached buffer holds gets the
    same memory, the radix one zeroed, the two kernels never share an entry; a larger request
    grows the buffer (rows rounded up), a smaller one is served from it, cut to its rows."""
    from dsa_ops.backends.triton import launch, radix_launch, workspace

    monkeypatch.setattr(workspace, "_WORKSPACES", {})
    monkeypatch.setattr(workspace, "_RETIRED", [])
    cpu = torch.device("cpu")
    ws, cnt = launch.workspace(cpu, 2, 64)
    again = launch.workspace(cpu, 2, 64)
    assert again[0].data_ptr() == ws.data_ptr() and again[1].data_ptr() == cnt.data_ptr() and (cnt == 0).all()
    rw = radix_launch.workspace(cpu, 2, 64)
    assert rw.data_ptr() == radix_launch.workspace(cpu, 2, 64).data_ptr() != ws.data_ptr() and (rw == 0).all()
    grown = radix_launch.workspace(cpu, 3, 64)
    assert grown.shape == (3, 64) and grown.data_ptr() != rw.data_ptr()
    small = radix_launch.workspace(cpu, 1, 40)
    assert small.shape == (1, 64) and small.data_ptr() == grown.data_ptr()
    assert workspace.workspace_bytes() == 4 * 2 * 64 + 8 * 2 * launch.CNT_STRIDE + 4 * 3 * 64


def test_radix_bracket_switch(monkeypatch):
    """DSA_OPS_TRITON_BRACKET forces the bracket on or off; a bad value is refused by name;
    auto brackets every row-mode row of >= 4 x samp and split rows from a length that never
    falls under that floor; the candidate buffer holds the window the bracket expects."""
    from dsa_ops.backends.triton import radix_launch as rl

    cpu = torch.device("cpu")
    p = rl.plan(1, 133120, cpu)
    assert p.cand_cap // 2 >= rl.window_bound(133120, 2048) > 2048
    split = [rl.RadixPlan(grid0=r, slices=8, cand_cap=p.cand_cap, rank_budget=4096) for r in (1, 2, 8, 31, 32, 64, 4096)]
    monkeypatch.setenv("DSA_OPS_TRITON_BRACKET", "0")
    assert rl.bracket_min_len(p, 1) == 0 and all(rl.bracket_min_len(q, q.grid0) == 0 for q in split)
    monkeypatch.setenv("DSA_OPS_TRITON_BRACKET", "1")
    assert rl.bracket_min_len(p, 1) == 1024 and rl.bracket_min_len(p, 1, samp=128) == 512
    assert all(rl.bracket_min_len(q, q.grid0) == 1024 for q in split)
    monkeypatch.setenv("DSA_OPS_TRITON_BRACKET", "auto")
    assert rl.bracket_min_len(p, 1) == 1024
    auto = [rl.bracket_min_len(q, q.grid0) for q in split]
    assert all(isinstance(v, int) and (v == 0 or v >= 1024) for v in auto), auto
    assert auto[0] > 0 and auto[2] == 0 and auto[-1] > 0, auto  # one row, 8 rows, many rows (measured rule)
    monkeypatch.setenv("DSA_OPS_TRITON_BRACKET", "yes")
    with pytest.raises(ValueError, match="DSA_OPS_TRITON_BRACKET"):
        rl.bracket_min_len(p, 1)


def test_radix_plan_bounds():
    """Split plans never exceed the co-resident programs; CPU plans are one program per row."""
    from dsa_ops.backends.triton import radix_launch as rl

    cpu = torch.device("cpu")
    assert rl.plan(4, 1 << 20, cpu).slices == 1
    if torch.cuda.is_available() and not INTERP:
        dev = torch.device("cuda")
        for rows in (1, 3, 16, 64, 200, 5000):
            p = rl.plan(rows, 1 << 20, dev)
            assert p.slices == 1 or rows * p.slices <= rl.num_sms("cuda", 0) * rl.PER_SM
        with pytest.raises(ValueError, match="slices"):
            rl.plan(64, 1 << 20, dev, slices=64)


@interp
@pytest.mark.parametrize("stable", [False, True])
def test_prefill_windows(gen, stable):
    k, width = 64, 2500
    x = logits(gen, 6, width)
    s = torch.tensor([0, 10, 500, 2490, 40, 700], dtype=torch.int32)
    e = torch.tensor([2500, 10, 2000, 2600, 30, 700 + k + 1], dtype=torch.int32)  # empty, inverted, past W
    got = dsa_ops.topk_prefill(x, s, e, k, backend="triton", stable=stable, out=poisoned_out(6, k))
    assert_prefill_equivalent(got, x, s, e, k, stable=stable)
    assert (got[1] == -1).all() and (got[4] == -1).all()


@interp
def test_prefill_causal_chunk(gen):
    k, rows, chunk = 2048, 24, 2600
    x = logits(gen, rows, chunk)
    s = torch.zeros(rows, dtype=torch.int32)
    e = torch.arange(rows, dtype=torch.int32) + (chunk - rows + 1)
    got = dsa_ops.topk_prefill(x, s, e, k, backend="triton")
    assert_prefill_equivalent(got, x, s, e, k)


@interp
def test_sliced_rows_and_specials_bits(gen):
    """Row pitch > W (the gap holds NaN) and keys from raw bit patterns, stable bytes."""
    k, width = 16, 700
    x = sliced(logits(gen, 3, width, "specials"), extra=33)
    x[0, :5] = from_bits([0x7FFF_FFFF, 0x7F80_0000, 0x8000_0000, 0x0000_0000, 0xFFFF_FFFF])
    lt = torch.tensor([width, 300, 17], dtype=torch.int32)
    got = dsa_ops.topk_decode(x, lt, k, backend="triton", stable=True)
    assert_decode_equivalent(got, x.contiguous(), lt, k, stable=True)


# --- GPU cases ----------------------------------------------------------------------------


def _rows(n: int, keep: int = 8) -> torch.Tensor:
    return torch.unique(torch.linspace(0, n - 1, steps=min(n, keep)).round().long())


@pytest.mark.gpu
@pytest.mark.parametrize("rows, width", [(1, 133120), (16, 133120), (64, 133120), (8, 1048576), (64, 1048576)])
@pytest.mark.parametrize("stable", [False, True])
def test_gpu_real_shapes(rows, width, stable):
    g = torch.Generator(device="cuda").manual_seed(rows + width)
    x = torch.randn(rows, width, device="cuda", generator=g)
    for lens in ([4096] * rows, [32768] * rows, [131072] * rows,
                 torch.randint(0, 140000, (rows,), generator=torch.Generator().manual_seed(1)).tolist()):
        lt = torch.tensor(lens, dtype=torch.int32, device="cuda")
        got = dsa_ops.topk_decode(x, lt, 2048, backend="triton", stable=stable)
        idx = _rows(rows).cuda()
        assert_decode_equivalent(got[idx], x[idx], lt[idx], 2048, stable=stable)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ties", "equal", "specials"])
def test_gpu_adversarial(kind):
    gen = torch.Generator().manual_seed(3)
    x = logits(gen, 4, 200_000, kind).cuda()
    lt = torch.tensor([200_000, 150_000, 2049, 70_000], dtype=torch.int32, device="cuda")
    for stable in (False, True):
        got = dsa_ops.topk_decode(x, lt, 2048, backend="triton", stable=stable)
        assert_decode_equivalent(got, x, lt, 2048, stable=stable)


@pytest.mark.gpu
def test_gpu_workspace_memory_bounded_over_row_counts():
    """Issue #25 on the device: decode at every batch size 1..256 (W 163840) and prefill chunks
    of 1..1055 rows (W 131072, every 16th count) leave one workspace buffer of the largest slots
    x the largest stride, and the allocator grows by no more than that (outgrown buffers are
    freed), not by a workspace per shape seen."""
    from dsa_ops.backends.triton import workspace

    workspace._WORKSPACES.clear()
    workspace._RETIRED.clear()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    x = torch.randn(1055, 163840, device="cuda")
    held = []
    for rows in range(1, 257):
        lt = torch.full((rows,), 131072, dtype=torch.int32, device="cuda")
        dsa_ops.topk_decode(x[:rows], lt, 2048, backend="triton")
        held.append(workspace.workspace_bytes())
    xp = x[:, :131072]
    for rows in list(range(1, 1056, 16)) + [1055]:
        s = torch.zeros(rows, dtype=torch.int32, device="cuda")
        e = torch.full((rows,), 131072, dtype=torch.int32, device="cuda")
        got = dsa_ops.topk_prefill(xp[:rows], s, e, 2048, backend="triton")
        held.append(workspace.workspace_bytes())
    assert_prefill_equivalent(got[-4:], xp[rows - 4:rows], s[-4:], e[-4:], 2048)
    torch.cuda.synchronize()
    grown = torch.cuda.memory_allocated() - base - x.numel() * 4
    print(f"workspace bytes after decode sweep {held[255] / 2**20:.1f} MiB, after prefill sweep "
          f"{held[-1] / 2**20:.1f} MiB; allocator growth {grown / 2**20:.1f} MiB")
    # One buffer of the largest slots (prefill, 1056 on an H200) x the largest stride (decode at
    # W 163840): 641 MiB measured (run of 2026-12-04), against ~215 GiB projected before.
    assert held[-1] <= 768 << 20 and grown <= held[-1] + (64 << 20), (held[-1], grown)


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_with_new_lengths():
    rows, width, k = 16, 133120, 2048
    x = torch.randn(rows, width, device="cuda")
    lt = torch.full((rows,), 4096, dtype=torch.int32, device="cuda")
    out = torch.empty(rows, k, dtype=torch.int32, device="cuda")
    call = lambda: dsa_ops.topk_decode(x, lt, k, backend="triton", out=out)  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    gen = torch.Generator().manual_seed(0)
    for step in range(6):
        lt.copy_(torch.randint(0, width + 50, (rows,), generator=gen, dtype=torch.int32))
        x.normal_()
        x[:, -1000:] = float("nan")  # poison: a last-column-sized tail no row may read past L
        out.fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        assert_decode_equivalent(out, x, lt, k)


@pytest.mark.gpu
@pytest.mark.parametrize("stable", [False, True])
def test_gpu_prefill_causal_chunk(stable):
    rows, chunk, k = 2048, 40000, 2048
    x = torch.randn(rows, chunk, device="cuda")
    s = torch.zeros(rows, dtype=torch.int32, device="cuda")
    e = torch.arange(rows, dtype=torch.int32, device="cuda") + (chunk - rows + 1)
    got = dsa_ops.topk_prefill(x, s, e, k, backend="triton", stable=stable)
    idx = _rows(rows, 16).cuda()
    assert_prefill_equivalent(got[idx], x[idx], s[idx], e[idx], k, stable=stable)


@pytest.mark.gpu
def test_gpu_prefill_wide_chunk_lane_steps():
    """A chunk wider than LANES_WIDE with more rows than row-mode programs: the rule's lane
    read of four blocks a step (checked against launch_plan), with window starts off the
    step grid, ends mid-step, a row shorter than k, an empty row and tied rows."""
    from dsa_ops.backends.triton import radix_launch as rl

    rows, width, k = 1200, 100_000, 2048
    x = logits(torch.Generator().manual_seed(9), rows, width, "randn").cuda()
    x[7] = 0.25
    x[8, ::3] = 1.0
    g = torch.Generator().manual_seed(10)
    s = torch.randint(0, 3000, (rows,), generator=g, dtype=torch.int32)
    e = torch.clamp(s + torch.randint(90_000, width + 1, (rows,), generator=g, dtype=torch.int32), max=width)
    s[5], e[5] = 100, 100 + k - 1
    s[6], e[6] = 40, 40
    s, e = s.cuda(), e.cuda()
    p, sh = rl.launch_plan(rows, width, x.device, lanes=None)
    assert rows > p.grid0 and (sh["lanes"], sh["lane_step"]) == (True, rl.LANE_ROW_STEP), (p, sh)
    got = dsa_ops.topk_prefill(x, s, e, k, backend="triton")
    idx = torch.unique(torch.cat([_rows(rows, 16), torch.tensor([5, 6, 7, 8])])).cuda()
    assert_prefill_equivalent(got[idx], x[idx], s[idx], e[idx], k)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["randn", "ties", "specials"])
def test_gpu_prefill_few_rows_split(kind):
    """A few long prefill windows (offset starts, one shorter than k, one empty): the radix
    kernel splits each row over many programs, as in decode."""
    width, k = 133120, 2048
    x = logits(torch.Generator().manual_seed(5), 4, width, kind).cuda()
    s = torch.tensor([0, 5000, 100, 70], dtype=torch.int32, device="cuda")
    e = torch.tensor([width, 90000, 1500, 70], dtype=torch.int32, device="cuda")
    for stable in (False, True):
        got = dsa_ops.topk_prefill(x, s, e, k, backend="triton", stable=stable)
        assert_prefill_equivalent(got, x, s, e, k, stable=stable)
