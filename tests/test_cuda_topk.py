"""Backend ``cuda`` (dsa_ops/backends/cuda/topk.cu): the launch plan on CPU; on an NVIDIA
GPU of sm_90+, every path of the kernel against the contract.

With ``stable=True`` the output must equal the stable reference byte for byte (contract
§1.1): those GPU cases compare with ``backend="reference", stable=True`` (and small cases
with the independent oracle too). With ``stable=False`` the solo and split kernels emit in
any order (the cluster kernel stays ordered): those cases use the contract's tie-tolerant
check (``dsa_ops.testing``), and both modes run on the same data.
Paths are forced through the plan: cluster sizes 1-16, the shared stage, the candidate
buffer and the four-read fallback (``stage_keys`` small enough that neither fits).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import dsa_ops
import dsa_ops.backends.cuda as cuda_api
from dsa_ops.backends.cuda import topk
from dsa_ops.backends.cuda.topk import Plan, SoloPlan, SplitPlan, make_plan, solo_plan, split_plan
from dsa_ops.testing import assert_decode_equivalent, assert_prefill_equivalent
from tests import oracle
from tests.data import from_bits, logits as make_logits, poisoned_out, sliced

H200 = dict(sms=132, smem_max=232448)
H200_SM = 233472  # shared memory a multiprocessor
H200_FACTS = topk.DeviceFacts(H200["sms"], H200["smem_max"], H200_SM)


# ---------------------------------------------------------------- plan (CPU)

@pytest.mark.parametrize("rows, width, want", [
    (1, 133120, (16, 10240)),  # 16 CTAs a row, each slice staged
    (8, 133120, (8, 18432)),
    (16, 133120, (4, 34816)),
    (64, 133120, (2, 43264)),  # the slice outgrows shared memory: 128K rows are read again
    (1, 4096, (1, 6144)),  # no slice below MIN_SLICE columns
    (16384, 16384, (1, 18432)),  # prefill chunks: two CTAs a multiprocessor, every row staged
    (16384, 131072, (8, 18432)),
    (16384, 1048576, (16, 18432)),
])
def test_plan_shapes(rows, width, want):
    p = make_plan(rows, width, **H200)
    assert (p.cluster, p.stage_keys) == want
    assert p.stage_keys % 4 == 0 and p.shared + topk.STATIC_BYTES <= H200["smem_max"]
    assert rows > H200["sms"] or rows * p.cluster <= H200["sms"]
    if rows > H200["sms"]:  # two CTAs a multiprocessor (228 KiB, 1 KiB of it reserved a CTA)
        assert 2 * (p.shared + topk.STATIC_BYTES + 1024) <= 233472


@pytest.mark.parametrize("columns", [1, 2048, 2049, 8320, 16384, 16385, 66560])
def test_stage_fits_the_slice_with_odd_shares(columns):
    keys = topk.stage_for(columns)
    share = keys // (4 * topk.THREADS)
    assert keys >= columns and share % 2 == 1 and (share - 2) * 4 * topk.THREADS < columns


def test_plan_overrides_and_refusals():
    assert make_plan(3, 1000, cluster=8, stage_keys=6, cand_keys=0, solo_max=0, **H200) == Plan(8, 4, 0)
    assert make_plan(3, 133120, **H200).solo_max == topk.SOLO_SHORT  # short rows: CTA 0 alone
    assert make_plan(3, 1000, cluster=8, stage_keys=6, cand_keys=0, **H200).solo_max < 4096  # what fits
    with pytest.raises(ValueError, match="solo_max"):
        make_plan(3, 1000, cluster=8, stage_keys=6, solo_max=10**6, **H200)
    assert make_plan(3, 1000, stage_keys=10**9, **H200).stage_keys < 10**9  # bounded by shared memory
    for bad in (0, 3, 32):
        with pytest.raises(ValueError, match="cluster"):
            make_plan(3, 1000, cluster=bad, **H200)
    with pytest.raises(ValueError, match="cand_keys"):
        make_plan(3, 1000, cand_keys=-1, **H200)


@pytest.mark.parametrize("width, want", [
    (16384, (23296, 512)),  # short chunks: every row kept whole
    (133120, (16000, 4160)),
    (163840, (14080, 5120)),
    (250000, (8688, 7816)),
    (262144, None),  # the bitmaps leave less than SOLO_BUF_MIN words: the cluster plan serves
    (1 << 20, None),
])
def test_solo_plan_fits_two_ctas_a_multiprocessor(width, want):
    p = solo_plan(width, H200_SM)
    assert (None if p is None else (p.buf, p.words)) == want
    if p is not None:
        assert p.words * 32 >= width and p.words % 4 == 0 and p.buf % 8 == 0
        assert 2 * (p.shared + topk.STATIC_BYTES + topk.SHARED_RESERVED) <= H200_SM
    # stable=False: no bitmaps, so one plan for every width, with the room they took as buffer
    assert solo_plan(width, H200_SM, ordered=False) == SoloPlan(16384 if width <= 262144 else 24320, 0)
    assert solo_plan(5000, H200_SM, buf=64) == SoloPlan(64, 160)
    with pytest.raises(ValueError, match="buf"):
        solo_plan(5000, H200_SM, buf=10**6)


@pytest.mark.parametrize("rows, width, want", [
    (1, 133120, SplitPlan(16, 16384, 4160, 12288)),  # one CTA a multiprocessor
    (8, 133120, SplitPlan(8, 16384, 4160, 12288)),
    (16, 133120, SplitPlan(4, 16384, 4160, 12288)),
    (64, 133120, SplitPlan(2, 16384, 4160, 12288)),
    (1, 4096, SplitPlan(1, 16384, 128, 12288)),  # no slice below MIN_SLICE columns
    (1, 524288, SplitPlan(16, 16384, 16384, 12288)),
    (1, 1 << 20, None),  # the leader's bitmaps leave too little buffer: the cluster plan serves
])
def test_split_plan_shapes(rows, width, want):
    p = split_plan(rows, width, H200["sms"], H200_SM)
    assert p == want
    any_order = split_plan(rows, width, H200["sms"], H200_SM, ordered=False)  # stable=False: no bitmaps
    # one CTA a multiprocessor: a stage for the bulk copy, half of the unordered buffer up to
    # W = SAMPLE_LONG, after the whole buffer beyond; 9-16 rows: 8 CTAs a row, unstaged, with
    # smaller buffers (two CTAs a multiprocessor)
    narrow = width <= topk.SAMPLE_LONG
    paired = width <= topk.PAIR_WIDTH and 8 < rows <= 16
    assert any_order.words == 0
    if paired:
        buf = topk.SPLIT_BUF_ANY - topk.SPLIT_STAGE if narrow else topk.PAIR_BUF_LONG
        assert any_order == SplitPlan(8, buf, 0, 12288, 0)
    else:
        assert any_order.buf == topk.SPLIT_BUF_ANY - (topk.SPLIT_STAGE if narrow else 0)
        assert any_order.stage == topk.SPLIT_STAGE
        assert any_order.cluster == (p.cluster if p is not None else 16)
    assert p is None or p.stage == 0  # the ordered plans stage nothing
    if p is not None:
        assert p.words * 32 >= width and p.buf % 8 == 0 and p.solo_max <= p.buf
        per_sm = 1 if rows * p.cluster <= H200["sms"] else 2
        assert per_sm * (p.shared + topk.STATIC_BYTES + topk.SHARED_RESERVED) <= H200_SM


@pytest.mark.parametrize("rows, width, ordered, kind", [
    (1, 133120, True, SplitPlan), (64, 133120, True, SplitPlan),  # up to SPLIT_ROWS rows: topk_split
    (1, 1 << 20, True, Plan),  # the split's bitmaps do not fit: the cluster plan
    (65, 133120, True, SoloPlan),  # more than SOLO_ROWS rows: one CTA a row
    (4096, 1 << 20, True, Plan),  # solo's bitmaps do not fit either
    (1, 133120, False, SplitPlan), (64, 1 << 20, False, SplitPlan),  # stable=False: no bitmaps, so
    (65, 1 << 20, False, SoloPlan), (4096, 1 << 20, False, SoloPlan),  # the width never picks the kernel
])
def test_default_plan_choice(rows, width, ordered, kind):
    launch = cuda_api.plan(rows, width, stable=ordered, facts=H200_FACTS)  # the public plan API
    p = launch.shape
    assert type(p) is kind
    assert launch.kernel == {Plan: "topk_rows", SoloPlan: "topk_solo", SplitPlan: "topk_split"}[kind] + (
        "_many" if kind is Plan and rows * p.cluster > H200["sms"] else "")
    assert (launch.rows, launch.width, launch.ordered, launch.grid, launch.shared) == (
        rows, width, ordered, rows * p.cluster, p.shared)
    assert launch.cluster == (None if kind is SoloPlan else (p.cluster, 1, 1))
    if kind is SplitPlan:
        assert p == split_plan(rows, width, H200["sms"], H200_SM, ordered=ordered)
    if kind is not Plan:
        assert (p.words == 0) == (not ordered)


def test_ordered_launch_refuses_a_plan_without_bitmaps():
    """The ordered emission marks winners in column bitmaps: a plan without room for them
    (an unordered plan) is refused before any launch, never run over the buffer."""
    x = torch.zeros(2, 5000)
    lens = torch.full((2,), 5000, dtype=torch.int32)
    out = torch.empty(2, 16, dtype=torch.int32)
    for plan in (SoloPlan(8192, 0), SplitPlan(2, 8192, 0, 0), SplitPlan(2, 8192, 152, 0)):
        with pytest.raises(ValueError, match="bitmaps of 157 words"):
            topk.launch(x, lens, lens, lens, 0, 1, 16, out, plan=plan, ordered=True)


@pytest.mark.parametrize("rows, width, want", [
    (8, 133120, SplitPlan(8, 16384, 0, 12288, 16384)),  # 8 rows: staged, one CTA a multiprocessor
    (9, 133120, SplitPlan(8, 16384, 0, 12288, 0)),  # 9-16 rows: 8 CTAs, unstaged, two fit an SM
    (12, 4096 * 8, SplitPlan(8, 16384, 0, 12288, 0)),
    (12, 28000, SplitPlan(4, 16384, 0, 12288, 0)),  # slices below MIN_SLICE: fewer CTAs
    (16, 262144, SplitPlan(8, 16384, 0, 12288, 0)),
    (16, 262145, SplitPlan(8, 20480, 0, 12288, 0)),  # past SAMPLE_LONG: room for ~5K kept keys + 4.5 sd
    (12, 1 << 20, SplitPlan(8, 20480, 0, 12288, 0)),  # PAIR_WIDTH: rows up to L = 1M
    (16, (1 << 20) + 8, SplitPlan(4, 32768, 0, 12288, 16384)),  # wider: FEW_ROWS, staged after the buffer
    (17, 133120, SplitPlan(2, 16384, 0, 12288, 16384)),
    (64, 1 << 20, SplitPlan(2, 32768, 0, 12288, 16384)),  # W 1M, one CTA a multiprocessor: staged (run 23)
])
def test_split_plan_pairs_9_to_16_rows(rows, width, want):
    """Unordered plans of 9-16 rows up to W = PAIR_WIDTH (1M): 8 CTAs a row with buffers
    small enough for two CTAs a multiprocessor (H100 runs 20, 21, 23), unless a cluster,
    buffer or stage is given or the plan is ordered."""
    assert split_plan(rows, width, H200["sms"], H200_SM, ordered=False) == want
    assert split_plan(rows, width, H200["sms"], H200_SM, cluster=4, ordered=False).cluster == 4
    given_stage = split_plan(rows, width, H200["sms"], H200_SM, ordered=False, stage=0)
    if 8 < rows <= 16 and width >= 4 * topk.MIN_SLICE:  # a given stage keeps FEW_ROWS' 4 CTAs a row
        assert given_stage.cluster == 4
    ordered = split_plan(rows, width, H200["sms"], H200_SM, ordered=True)  # None: its bitmaps do not fit
    assert ordered is None or ordered.cluster == given_stage.cluster
    if want.cluster == 8 and want.stage == 0:  # two CTAs fit a multiprocessor
        assert 2 * (want.shared + topk.STATIC_BYTES + topk.SHARED_RESERVED) <= H200_SM


@pytest.mark.parametrize("length, keys", [
    (1, 1024), (262144, 1024), (262145, 2048), (524288, 2048), (524289, 4096), (1 << 20, 4096), ((1 << 31) - 1, 4096),
])
def test_sample_grows_with_the_row(length, keys):
    """solo.cu's sample: a sample key stands for at most 256 columns up to L = 1M, so the
    kept keys (about 20 sample keys' worth at the bound: ~5K) fit the 9-16-row plan's
    PAIR_BUF_LONG / 2 = 10240 kept keys with 4.4 standard deviations to spare."""
    assert topk.sample_keys(length) == keys
    if length <= topk.PAIR_WIDTH:
        assert length <= keys * 256
    mean = -(-2048 * keys // max(length, 1))
    want = mean + int(3 * mean ** 0.5) + 4  # solo.cu's rank of the bound in the sample
    if length <= topk.PAIR_WIDTH and want < keys:
        kept = want * length / keys
        assert kept + 4.4 * want ** 0.5 * length / keys <= topk.PAIR_BUF_LONG // 2 + 1


def test_split_plan_overrides_and_refusals():
    assert split_plan(64, 133120, 132, H200_SM, cluster=4) == SplitPlan(4, 16000, 4160, 12288)  # two an SM
    assert split_plan(3, 5000, 132, H200_SM, cluster=2, buf=64, solo_max=0) == SplitPlan(2, 64, 160, 0)
    for bad in (0, 3, 32):
        with pytest.raises(ValueError, match="cluster"):
            split_plan(3, 5000, 132, H200_SM, cluster=bad)
    with pytest.raises(ValueError, match="buf"):
        split_plan(3, 5000, 132, H200_SM, buf=10**6)
    with pytest.raises(ValueError, match="solo_max"):
        split_plan(3, 5000, 132, H200_SM, buf=64, solo_max=65)
    staged = split_plan(3, 5000, 132, H200_SM, cluster=2, buf=64, solo_max=0, stage=1024)
    assert staged == SplitPlan(2, 64, 160, 0, 1024) and staged.shared == 4 * (2 * 2048 + 2 * 160 + 64 + 1024)
    for bad in (-8, 3, 12):
        with pytest.raises(ValueError, match="stage: expected a multiple of 8"):
            split_plan(3, 5000, 132, H200_SM, stage=bad)
    with pytest.raises(ValueError, match="stage: 60000 words leave less than"):
        split_plan(3, 5000, 132, H200_SM, stage=60000)
    # two CTAs a multiprocessor leave no room for a stage: none by default
    assert split_plan(64, 133120, 132, H200_SM, cluster=4, ordered=False).stage == 0


def test_backend_is_registered_and_explains_itself():
    b = dsa_ops.backends()["cuda"]
    assert b.exact and b.decode and b.prefill
    sup = b.availability()
    if not torch.cuda.is_available():
        assert not sup and ("CUDA" in sup.reason or "cuda" in sup.reason)
    assert "topk.cu" in b.version()


def test_kernel_source_ships_with_the_package():
    import tomllib
    from pathlib import Path

    for name in topk.FILES:  # every file of the program ships, and each source includes what it uses
        assert (topk.FOLDER / name).is_file()
        if name.endswith(".cu"):
            assert '#include "common.cuh"' in (topk.FOLDER / name).read_text()
    for kernel in ("topk_rows", "topk_rows_many", "topk_solo", "topk_split"):
        assert kernel in "".join(cuda_api.program().headers.values())
    cfg = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    data = cfg["tool"]["setuptools"]["package-data"]["dsa_ops.backends.cuda"]
    assert "*.cu" in data and "*.cuh" in data


# ---------------------------------------------------------------- GPU

def _ready() -> str:
    """The cuda backend's requirements beyond a device (the gpu mark's ``needs``)."""
    if torch.version.cuda is None:
        return "needs an NVIDIA GPU"
    if torch.cuda.get_device_capability() < (9, 0):
        return "needs sm_90+ (thread-block clusters)"
    sup = dsa_ops.backends()["cuda"].availability()
    return "" if sup else sup.reason


def _ref_decode(x, lens, k, next_n=1):
    return dsa_ops.topk_decode(x, lens, k, next_n=next_n, backend="reference", stable=True)


def _run_decode(x, lens, k, next_n=1, plan=None, out=None, stable=True):
    """stable=False runs a solo / split plan with the unordered plans' layout (no bitmaps),
    as the default plans of stable=False do."""
    out = poisoned_out(x.shape[0], k, x.device) if out is None else out
    if not stable and isinstance(plan, (SoloPlan, SplitPlan)):
        plan = dataclasses.replace(plan, words=0)
    if plan is None:
        dsa_ops.topk_decode(x, lens, k, next_n=next_n, backend="cuda", out=out, stable=stable)
    else:
        flat = lens.reshape(-1)
        per_row = flat.numel() == x.shape[0]
        topk.launch(x, flat, flat, flat, 0 if per_row else 1, 1 if per_row else next_n, k, out, plan=plan,
                    ordered=stable)
    return out


def _check_decode(got, x, lens, k, stable, what, next_n=1):
    """stable: the reference's bytes; else the contract's tie-tolerant check (any order)."""
    if stable:
        _assert_same(got, _ref_decode(x, lens, k, next_n), what)
    else:
        try:
            assert_decode_equivalent(got, x, lens, k, next_n)
        except AssertionError as e:
            raise AssertionError(f"{what} (stable=False): {e}") from None


def _assert_same(got, want, what):
    if not torch.equal(got, want):
        bad = (got != want).any(1).nonzero().flatten()
        r = int(bad[0])
        cols = (got[r] != want[r]).nonzero().flatten()[:8].tolist()
        raise AssertionError(f"{what}: {len(bad)} rows differ, first row {r} at slots {cols}: "
                             f"got {got[r, cols].tolist()} want {want[r, cols].tolist()}")


def _lengths_for(width, k, rows, gen):
    edge = [0, 1, k - 1, k, k + 1, width, width - 1, -5, width + 9, 2 * k + 3]
    lens = [edge[i % len(edge)] if i < len(edge) else int(torch.randint(0, width + 1, (1,), generator=gen))
            for i in range(rows)]
    return torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize("kind", ["randn", "ties", "equal", "specials"])
@pytest.mark.parametrize("width, k", [(100, 16), (5000, 2048), (40000, 2048), (133120, 2048), (70000, 512)])
@pytest.mark.parametrize("cluster", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("path", ["leader", "runs", "stage", "collect", "reread", "short"])
@pytest.mark.gpu(needs=_ready)
def test_every_path_equals_the_stable_reference(gen, kind, width, k, cluster, path):
    rows = 12
    x = make_logits(gen, rows, width, kind).cuda()
    lens = _lengths_for(width, k, rows, gen).cuda()
    slice_keys = -(-width // cluster) + 4
    # collect: just too small for a full-length slice, so long rows use the candidate buffer
    # (half the stage); reread: a 2-entry buffer, so every long row reads four times
    # leader: staged, candidates gathered to CTA 0; runs: not staged, candidates gathered,
    # warp runs read the row again to emit; stage: staged, no candidate buffer, so every
    # pass runs over the cluster
    stage = {"leader": topk.stage_for(slice_keys), "stage": topk.stage_for(slice_keys),
             "runs": max(8, slice_keys - 8), "collect": max(8, slice_keys - 8), "reread": 4, "short": 0}[path]
    if path == "short":
        plan = make_plan(rows, width, 132, 232448, cluster=cluster)
        assert plan.solo_max > 0
    else:
        plan = make_plan(rows, width, 132, 232448, cluster=cluster, stage_keys=stage,
                         cand_keys=4096 if path in ("leader", "runs") else 0, solo_max=0)
    got = _run_decode(x, lens, k, plan=plan)
    _assert_same(got, _ref_decode(x, lens, k), f"{kind} W={width} k={k} {plan} {path}")


def _solo(width, buf=None):
    return solo_plan(width, H200_SM, buf)


@pytest.mark.parametrize("kind", ["randn", "ties", "equal", "specials", "rounded"])
@pytest.mark.parametrize("width, k", [(100, 16), (5000, 2048), (40000, 2048), (133120, 2048), (70000, 512)])
@pytest.mark.parametrize("buf", ["auto", "small", "tiny"])
@pytest.mark.parametrize("stable", [True, False])
@pytest.mark.gpu(needs=_ready)
def test_solo_equals_the_stable_reference(gen, kind, width, k, buf, stable):
    """topk_solo, one CTA a row: rows kept whole (direct), rows kept under the sampled bound
    (the buffer holds half as many keys with their columns), and the digit passes over the
    row when the sample misses (`tiny`: a 32-key buffer, so every long row falls back).
    stable=False: the unordered emission, checked against the contract."""
    rows = 12
    if kind == "rounded":  # many distinct values with ties near any cut
        x = torch.randn(rows, width, generator=gen).mul(100).round().div(100).cuda()
    else:
        x = make_logits(gen, rows, width, kind).cuda()
    lens = _lengths_for(width, k, rows, gen).cuda()
    plan = _solo(width, {"auto": None, "small": 4 * k + 8, "tiny": 64}[buf])
    got = _run_decode(x, lens, k, plan=plan, stable=stable)
    _check_decode(got, x, lens, k, stable, f"{kind} W={width} k={k} {plan}")


@pytest.mark.parametrize("kind", ["randn", "ties", "equal", "specials", "rounded", "sorted"])
@pytest.mark.parametrize("width, k", [(100, 16), (5000, 2048), (40000, 2048), (133120, 2048), (70000, 512)])
@pytest.mark.parametrize("cluster", [2, 4, 16])
@pytest.mark.parametrize("buf", ["auto", "small", "tiny", "short"])
@pytest.mark.parametrize("stable", [True, False])
@pytest.mark.gpu(needs=_ready)
def test_split_equals_the_stable_reference(gen, kind, width, k, cluster, buf, stable):
    """topk_split: every long row over a cluster under the sampled bound (solo_max 0), the
    leader's buffer just big enough (`small`) or too small for any row (`tiny`: every long row
    falls back to the digit passes), and the default short-row bound (`short`). `sorted` rows
    put every kept key in the last CTA's slice. stable=False: the unordered emission, checked
    against the contract."""
    rows = 12
    if kind == "rounded":
        x = torch.randn(rows, width, generator=gen).mul(100).round().div(100)
    elif kind == "sorted":
        x = torch.randn(rows, width, generator=gen).sort(1).values
    else:
        x = make_logits(gen, rows, width, kind)
    x = x.cuda()
    lens = _lengths_for(width, k, rows, gen).cuda()
    size = {"auto": None, "small": 4 * k + 8, "tiny": 64, "short": None}[buf]
    plan = split_plan(rows, width, 132, H200_SM, cluster=cluster, buf=size, solo_max=None if buf == "short" else 0)
    got = _run_decode(x, lens, k, plan=plan, stable=stable)
    _check_decode(got, x, lens, k, stable, f"{kind} W={width} k={k} {plan}")


@pytest.mark.gpu(needs=_ready)
@pytest.mark.parametrize("cluster", [2, 16])
def test_split_sample_that_misses_falls_back(cluster):
    """As for topk_solo: the sampled columns hold the best or the worst keys of the row."""
    width, k = 100000, 2048
    x = torch.randn(4, width)
    for r, L in enumerate((width, width, 77777, 50001)):
        pos = (2 * torch.arange(1024) + 1) * L // 2048  # the kernel's sample positions
        x[r, pos] = 1e3 if r % 2 == 0 else -1e3
    x[2, :] = x[2].round()
    x, lens = x.cuda(), torch.tensor([width, width, 77777, 50001], dtype=torch.int32).cuda()
    plan = split_plan(4, width, 132, H200_SM, cluster=cluster, solo_max=0)
    for stable in (True, False):
        _check_decode(_run_decode(x, lens, k, plan=plan, stable=stable), x, lens, k, stable, f"sample misses {plan}")


@pytest.mark.gpu(needs=_ready)
def test_solo_sample_that_misses_falls_back():
    """Rows whose sampled columns hold the best keys (the bound is too tight: fewer than k
    kept) or the worst (too loose: the buffer overflows) still give the reference's bytes."""
    width, k = 100000, 2048
    x = torch.randn(4, width)
    for r, L in enumerate((width, width, 77777, 50001)):
        pos = (2 * torch.arange(1024) + 1) * L // 2048  # the kernel's sample positions
        x[r, pos] = 1e3 if r % 2 == 0 else -1e3
    x[2, :] = x[2].round()
    x, lens = x.cuda(), torch.tensor([width, width, 77777, 50001], dtype=torch.int32).cuda()
    for stable in (True, False):
        _check_decode(_run_decode(x, lens, k, plan=_solo(width), stable=stable), x, lens, k, stable, "sample misses")


@pytest.mark.gpu(needs=_ready)
def test_solo_prefill_is_the_default_for_chunks_and_replays(gen):
    rows, width = 400, 60000
    assert isinstance(cuda_api.plan(rows, width).shape, SoloPlan)
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(rows, width, device="cuda", generator=g)
    s = torch.zeros(rows, dtype=torch.int32, device="cuda")
    e = torch.arange(rows, dtype=torch.int32, device="cuda") * 150
    out = torch.empty(rows, 2048, dtype=torch.int32, device="cuda")
    dsa_ops.topk_prefill(x, s, e, 2048, backend="cuda", out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dsa_ops.topk_prefill(x, s, e, 2048, backend="cuda", out=out)
    for shift in (0, 7, 3001):
        s.copy_(torch.full((rows,), shift, dtype=torch.int32))
        e.add_(shift)
        x.normal_(generator=g)
        graph.replay()
        assert_prefill_equivalent(out, x, s, e, 2048)  # the policy's stable=False: any order


@pytest.mark.parametrize("rows", [1, 8, 12, 16, 64, 80, 200])
@pytest.mark.parametrize("width", [133120, 1048576])
@pytest.mark.parametrize("stable", [False, True])
@pytest.mark.gpu(needs=_ready)
def test_default_plans_at_serving_shapes(gen, rows, width, stable):
    if width > 200000 and rows > 16 and stable:  # stable: the cluster plan (W 1M is one fixed shape)
        rows = 16
    g = torch.Generator(device="cuda").manual_seed(rows + width)
    x = torch.randn(rows, width, device="cuda", generator=g)
    x[:, ::97] = float("nan") if rows % 2 else float("-inf")
    lens = torch.randint(0, min(width, 140000) + 1, (rows,), device="cuda", generator=g, dtype=torch.int32)
    lens[0] = min(width, 131072)
    out = torch.empty(rows, 2048, dtype=torch.int32, device="cuda")
    dsa_ops.topk_decode(x, lens, 2048, backend="cuda", stable=stable, out=out)
    _check_decode(out, x, lens, 2048, stable, f"rows={rows} W={width}")


@pytest.mark.gpu(needs=_ready)
@pytest.mark.parametrize("rows", [4, 12, 80])
def test_unordered_plans_take_a_million_columns(rows):
    """stable=False plans have no column bitmaps, so W = 1M takes topk_split (up to 64 rows;
    9-16 rows: the paired plan's smaller buffer) or topk_solo (more), not the cluster plan:
    rows up to L = W (twice the sample past SAMPLE_LONG, four times past 2 x SAMPLE_LONG), a
    sample planted to miss either way at those long rows, every key equal (the fallback's
    unordered emission with ties), all against the contract."""
    width, k = 1 << 20, 2048
    plan = cuda_api.plan(rows, width, stable=False).shape
    assert isinstance(plan, SplitPlan if rows <= topk.SPLIT_ROWS else SoloPlan) and plan.words == 0
    g = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, width, device="cuda", generator=g)
    cycle = [width, 999_999, 262_145, 300_001, 262_144, 131_072, 5000, 2048] if rows > 4 else [999_999, width, 300_001, 262_145]
    lens = torch.tensor([cycle[i % len(cycle)] for i in range(rows)], dtype=torch.int32, device="cuda")
    x[1] = 0.25
    for r, big in ((0, 1e3), (2, 1e3), (3, -1e3)):  # the kernel's sample positions (2048 or 4096 of them)
        n, keys = int(lens[r]), topk.sample_keys(int(lens[r]))
        assert keys > 1024
        x[r, (2 * torch.arange(keys, device="cuda") + 1) * n // (2 * keys)] = big
    out = poisoned_out(rows, k, "cuda")
    dsa_ops.topk_decode(x, lens, k, backend="cuda", stable=False, out=out)
    _check_decode(out, x, lens, k, False, f"W 1M rows={rows} {plan}")


@pytest.mark.gpu(needs=_ready)
@pytest.mark.parametrize("kind", ["randn", "ties", "specials"])
@pytest.mark.parametrize("stable", [True, False])
def test_batched_keep_on_both_sides_of_its_threshold(gen, kind, stable):
    """topk_split's keep_slice reads slices of KEEPB_MIN keys or more in batches (one warp
    scan a batch) and shorter ones a 16-byte chunk at a time: two CTAs a row, each CTA's
    slice on either side of the threshold, with 0-3 keys past the last 16-byte chunk, a
    buffer just big enough and one that overflows (slots past the buffer counted, not
    written: the fallback)."""
    t, k, rows = topk.KEEPB_MIN, 2048, 12
    width = 2 * t + 64
    lens = torch.tensor([t - 4, t - 1, t, t + 1, t + 3, 2 * t - 8, 2 * t, 2 * t + 2, 2 * t + 7, width, width - 1, t + 2],
                        dtype=torch.int32).cuda()
    x = make_logits(gen, rows, width, kind).cuda()
    for plan in (split_plan(rows, width, 132, H200_SM, cluster=2, solo_max=0),
                 split_plan(rows, width, 132, H200_SM, cluster=2, buf=4 * k + 8, solo_max=0),
                 split_plan(rows, width, 132, H200_SM, cluster=2, buf=64, solo_max=0)):
        got = _run_decode(x, lens, k, plan=plan, stable=stable)
        _check_decode(got, x, lens, k, stable, f"{kind} around KEEPB_MIN={t} {plan}")


@pytest.mark.gpu(needs=_ready)
@pytest.mark.parametrize("kind", ["randn", "ties", "specials"])
@pytest.mark.parametrize("stable", [True, False])
def test_slices_staged_by_the_bulk_copy(gen, kind, stable):
    """topk_split with a stage: each CTA's slice (its first 4 x (stage / 4) keys) lands in
    shared memory through the bulk copy engine and the rest is read directly. Slices shorter
    than, as long as and longer than the stage, with 0-3 keys past the last 16-byte chunk;
    rows whose slices are not 16-byte aligned (row pitch W + 3: not staged); slices of
    KEEPB_MIN keys or more (read in batches, not staged); a buffer that overflows."""
    k, rows, st = 2048, 12, 1024
    width = 2 * topk.KEEPB_MIN + 64
    lens = torch.tensor([2 * st - 8, 2 * st, 2 * st + 4, 2 * st + 7, 2 * st + 9, 4 * st + 3, 9000, 30001,
                         2 * topk.KEEPB_MIN - 8, 2 * topk.KEEPB_MIN, width, k + 1], dtype=torch.int32).cuda()
    x = make_logits(gen, rows, width, kind).cuda()
    odd = sliced(x, extra=3)  # row pitch W + 3: every other row starts off a 16-byte boundary
    for cluster, buf, stage in ((2, None, st), (4, None, st), (2, None, 16384), (2, 4 * k + 8, 2 * st)):
        plan = split_plan(rows, width, 132, H200_SM, cluster=cluster, buf=buf, solo_max=0, ordered=stable,
                          stage=stage)
        for data in (x, odd):
            got = _run_decode(data, lens, k, plan=plan, stable=stable)
            _check_decode(got, data, lens, k, stable, f"{kind} staged {plan} pitch {data.stride(0)}")


@pytest.mark.gpu(needs=_ready)
@pytest.mark.parametrize("kind", ["randn", "ties", "specials"])
@pytest.mark.parametrize("stable", [True, False])
def test_long_slices_stream_through_the_ring(gen, kind, stable):
    """topk_split with a stage of two or more RING_SLOT slots: a CTA's slice of RING_MIN keys
    or more streams through the stage as a ring (the copy engine refills a slot once the CTA
    is past it). Two CTAs a row; slices just under RING_MIN (staged at once), at and past it
    with 0-3 keys after the last 16-byte chunk and a short last slot; 2, 3 and 4 slots (each
    slot reused: the barriers' phases wrap); rows whose slices are not 16-byte aligned (row
    pitch W + 3: read in batches, not streamed); a buffer that overflows."""
    k, rows, t, slot = 2048, 12, topk.RING_MIN, topk.RING_SLOT
    width = 2 * t + 4 * slot + 64
    lens = torch.tensor([2 * t - 8, 2 * t, 2 * t + 2, 2 * t + 7, 2 * t + slot // 2, 2 * t + 2 * slot + 9,
                         width - 1, width, 2 * t + 3 * slot, 2 * t - 1, t + 5, 2 * t + 12], dtype=torch.int32).cuda()
    x = make_logits(gen, rows, width, kind).cuda()
    odd = sliced(x, extra=3)  # row pitch W + 3: every other row starts off a 16-byte boundary
    assert t > 4 * slot  # a slice of RING_MIN keys reuses slots (phases wrap) even with four
    for buf, stage in ((None, 2 * slot), (None, 3 * slot), (None, 4 * slot), (64, 2 * slot)):
        plan = split_plan(rows, width, 132, H200_SM, cluster=2, buf=buf, solo_max=0, ordered=stable, stage=stage)
        for data in (x, odd):
            got = _run_decode(data, lens, k, plan=plan, stable=stable)
            _check_decode(got, data, lens, k, stable, f"{kind} ring {plan} pitch {data.stride(0)}")


@pytest.mark.gpu(needs=_ready)
@pytest.mark.parametrize("next_n", [2, 4])
def test_per_request_lengths_and_int_min(gen, next_n):
    rows = 8 * next_n
    x = make_logits(gen, rows, 9000, "ties").cuda()
    lens = torch.tensor([0, 1, 2049, 9000, 9003, -(2**31), 2**31 - 1, 4097], dtype=torch.int32).cuda()
    got = _run_decode(x, lens, 2048, next_n=next_n)
    _assert_same(got, _ref_decode(x, lens, 2048, next_n), "per request")
    want = oracle.topk_decode(x.cpu(), lens.cpu(), 2048, next_n, "per_request")
    _assert_same(got.cpu(), want, "per request vs oracle")


@pytest.mark.gpu(needs=_ready)
@pytest.mark.parametrize("extra", [3, 4, 37])
def test_row_pitch_and_unaligned_rows(gen, extra):
    x = sliced(make_logits(gen, 16, 20000, "specials").cuda(), extra=extra, fill=float("nan"))
    lens = _lengths_for(20000, 2048, 16, gen).cuda()
    splits = (split_plan(16, 20000, 132, H200_SM, cluster=4, solo_max=0),
              split_plan(16, 20000, 132, H200_SM, cluster=2, buf=4104, solo_max=0))
    for plan in (None, Plan(4, 4), Plan(2, 2048), Plan(1, 24576, 64), _solo(20000), _solo(20000, 8200)) + splits:
        for stable in (True, False):
            got = _run_decode(x, lens, 2048, plan=plan, stable=stable)
            _check_decode(got, x, lens, 2048, stable, f"pitch {x.stride(0)} {plan}")


@pytest.mark.gpu(needs=_ready)
def test_never_reads_past_the_length(gen):
    """The columns past L hold the best key there is (+NaN 0x7FFFFFFF): a kernel that read
    them and let them in would not equal the reference; and a row placed at the very end
    of its allocation is read with L = W - 1."""
    x = make_logits(gen, 8, 50000, "randn")
    lens = torch.tensor([3000, 2049, 50000 - 1, 40001, 7, 4096, 33333, 12345], dtype=torch.int32)
    for r, n in enumerate(lens.tolist()):
        x[r, n:] = from_bits([0x7FFF_FFFF])
    x, lens = x.cuda(), lens.cuda()
    splits = tuple(split_plan(8, 50000, 132, H200_SM, cluster=c, solo_max=0) for c in (2, 8))
    for plan in (None, Plan(1, 4), Plan(16, 4), Plan(4, 16384), Plan(4, 14336, 0), _solo(50000), _solo(50000, 64)) \
            + splits:
        for stable in (True, False):
            _check_decode(_run_decode(x, lens, 2048, plan=plan, stable=stable), x, lens, 2048, stable, f"{plan}")


@pytest.mark.gpu(needs=_ready)
@pytest.mark.parametrize("kind", ["randn", "ties", "specials"])
def test_prefill_windows(gen, kind):
    rows, width = 300, 30000
    x = make_logits(gen, rows, width, kind).cuda()
    s = torch.randint(-5, width, (rows,), generator=gen)
    e = s + torch.randint(-10, 9000, (rows,), generator=gen)
    e[:20] = width + 50
    s[:10] = 0
    s, e = s.to(torch.int32).cuda(), e.to(torch.int32).cuda()
    for stable in (False, True):
        got = dsa_ops.topk_prefill(x, s, e, 2048, backend="cuda", stable=stable)
        if stable:
            want = dsa_ops.topk_prefill(x, s, e, 2048, backend="reference", stable=True)
            _assert_same(got, want, f"prefill {kind}")
        else:
            assert_prefill_equivalent(got, x, s, e, 2048)
    sub = slice(0, 40)
    _assert_same(got[sub].cpu(), oracle.topk_prefill(x[sub].cpu(), s[sub].cpu(), e[sub].cpu(), 2048), "oracle")


@pytest.mark.gpu(needs=_ready)
def test_graph_replay_with_new_lengths():
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(8, 133120, device="cuda", generator=g)
    lens = torch.full((8,), 131072, dtype=torch.int32, device="cuda")
    out = torch.empty(8, 2048, dtype=torch.int32, device="cuda")
    dsa_ops.topk_decode(x, lens, 2048, backend="cuda", out=out)  # warm-up: compile + load outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dsa_ops.topk_decode(x, lens, 2048, backend="cuda", out=out)
    for new in ([0] * 8, [131072] * 8, [5, 2048, 2049, 4096, 70000, 133120, 1, 0], [40000] * 8):
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        x.normal_(generator=g)
        graph.replay()
        _check_decode(out, x, lens, 2048, False, f"replay {new}")  # the policy's stable=False


@pytest.mark.gpu(needs=_ready)
def test_million_columns_collect_and_reread():
    g = torch.Generator(device="cuda").manual_seed(9)
    x = torch.randn(3, 1 << 20, device="cuda", generator=g)
    x[1] = 0.25  # every key equal: the candidate buffer overflows, four reads
    lens = torch.tensor([1 << 20, 1 << 20, 999_999], dtype=torch.int32, device="cuda")
    plans = (None, make_plan(3, 1 << 20, cluster=1, **H200), make_plan(3, 1 << 20, cluster=16, stage_keys=2048, **H200),
             make_plan(3, 1 << 20, cluster=16, cand_keys=8192, **H200))
    for plan in plans:
        _assert_same(_run_decode(x, lens, 2048, plan=plan), _ref_decode(x, lens, 2048), f"1M {plan}")


@pytest.mark.gpu(needs=_ready)
@pytest.mark.parametrize("stable", [True, False], ids=["stable", "any"])
@pytest.mark.parametrize("family", ["decode", "prefill"])
def test_opcheck_on_the_gpu(gen, family, stable):
    """torch.library.opcheck of dsa_ops::topk_<family>_cuda and its out= form on CUDA tensors
    (schema, fake kernel, dispatch): the CPU suite cannot run them. stable=False emits in atomic
    order (contract §1.1: any order, any of the tied keys), so two calls may differ in their
    bytes: its opcheck leaves out the eager-vs-AOT byte comparison, and the contract check
    stands in for it."""
    from dsa_ops import ops
    from tests.data import i32, poisoned_out

    x = make_logits(gen, 4, 5000, "ties").cuda()
    if family == "decode":
        lens = i32([0, 5, 2049, 5000]).cuda()
        args = (x, lens, 16, 1, 1, stable)  # k, next_n, compress_ratio, stable
    else:
        starts, ends = i32([0, 10, 90, 50]).cuda(), i32([100, 10, 4000, 20]).cuda()
        args = (x, starts, ends, 16, 1, stable)  # k, compress_ratio, stable
    utils = None if stable else ("test_schema", "test_autograd_registration", "test_faketensor")
    kw = {} if utils is None else {"test_utils": utils}
    torch.library.opcheck(ops.backend_op("cuda", family), args, **kw)
    torch.library.opcheck(ops.backend_op("cuda", family, out=True), args + (poisoned_out(4, 16).cuda(),), **kw)
    got = ops.backend_op("cuda", family)(*args).cpu()
    if family == "decode":
        assert_decode_equivalent(got, x.cpu(), lens.cpu(), 16, stable=stable)
    else:
        assert_prefill_equivalent(got, x.cpu(), starts.cpu(), ends.cpu(), 16, stable=stable)


def test_prepared_launch_refills_its_arguments(monkeypatch):
    """CPU: a prepared launch (one per function, plan, stream, build, thread) passes each
    call's own pointers and ints in the order of the plan's argument list; the config's grid,
    block, cluster and shared memory follow the plan."""
    import ctypes

    from dsa_ops.backends.cuda import driver
    from dsa_ops.backends.cuda.kernel import Function

    seen = []
    types = []  # what the launch being checked packs

    def fake_launch(handle, cfg, params):
        vals = [ctypes.cast(params[i], ctypes.POINTER(t)).contents.value for i, t in enumerate(types[0])]
        seen.append((handle, tuple(cfg.grid), tuple(cfg.block), cfg.shared_bytes, cfg.num_attrs, vals))

    monkeypatch.setattr(driver, "launch", fake_launch)
    x = torch.zeros(3, 5000)
    lens, starts, ends = (torch.zeros(3, dtype=torch.int32) for _ in range(3))
    out = torch.empty(3, 16, dtype=torch.int32)
    ptrs = [x.data_ptr(), 5000, 5000, lens.data_ptr(), starts.data_ptr(), ends.data_ptr()]
    lp = cuda_api.plan(3, 5000, facts=H200_FACTS, shape=Plan(4, 6144))
    assert (lp.kernel, lp.grid, lp.cluster, lp.shared) == ("topk_rows", 12, (4, 1, 1), Plan(4, 6144).shared)
    assert lp.arg_names()[-5:] == ("out", "C", "stage_keys", "cand_keys", "solo_max")
    run = topk._Launch(Function("f", 77, 0, "sm_90a", 232448), lp, 0)
    types[:] = [lp.arg_types()]
    for k in (16, 2048):
        run(lp.args(x, lens, starts, ends, 1, 2, k, out))
    assert [s[:5] for s in seen] == [(77, (12, 1, 1), (topk.THREADS, 1, 1), lp.shared, 1)] * 2
    assert seen[0][5] == ptrs + [1, 2, 16, out.data_ptr(), 4, 6144, 4096, 0]
    assert seen[1][5][8] == 2048
    assert cuda_api.plan(200, 5000, facts=H200_FACTS, shape=Plan(4, 6144)).kernel == "topk_rows_many"
    solo = SoloPlan(16000, 4160)
    lp = cuda_api.plan(3, 5000, facts=H200_FACTS, shape=solo, stable=False)
    assert (lp.kernel, lp.grid, lp.cluster) == ("topk_solo", 3, None)
    run = topk._Launch(Function("g", 78, 0, "sm_90a", 232448), lp, 0)
    seen.clear()
    types[:] = [lp.arg_types()]
    run(lp.args(x, lens, starts, ends, 2, 1, 2048, out))
    assert seen == [(78, (3, 1, 1), (topk.THREADS, 1, 1), solo.shared, 0,
                     ptrs + [2, 1, 2048, out.data_ptr(), 16000, 4160, 0])]
    split = SplitPlan(8, 16384, 0, 12288, 16384)
    assert split.shared == 4 * (2 * 2048 + 16384 + 16384)  # the stage after the buffer
    lp = cuda_api.plan(3, 5000, facts=H200_FACTS, shape=split, stable=False)
    assert (lp.kernel, lp.grid, lp.cluster) == ("topk_split", 24, (8, 1, 1))
    stamps = torch.zeros(24, 16, dtype=torch.int64)  # a lab build: the stamp buffer last
    assert lp.arg_types(profile=True) == lp.arg_types() + (ctypes.c_void_p,)
    assert lp.arg_names(profile=True)[-1] == "stamps"
    run = topk._Launch(Function("h", 79, 0, "sm_90a", 232448), lp, 0, profile=True)
    seen.clear()
    types[:] = [lp.arg_types(profile=True)]
    run(lp.args(x, lens, starts, ends, 0, 1, 2048, out, stamps, profile=True))
    assert seen == [(79, (24, 1, 1), (topk.THREADS, 1, 1), split.shared, 1,
                     ptrs + [0, 1, 2048, out.data_ptr(), 8, 16384, 0, 12288, 0, 16384, stamps.data_ptr()])]
    with pytest.raises(ValueError, match="shared memory"):
        topk._Launch(Function("f", 77, 0, "sm_90a", 1024), cuda_api.plan(3, 5000, facts=H200_FACTS,
                                                                           shape=Plan(4, 6144)), 0)


def test_stamps_need_a_lab_build():
    """CPU: the shipped build's kernels take no stamp buffer; asking for stamps from it is an
    error before any launch, and a lab build is known from its options."""
    x = torch.zeros(2, 5000)
    lens = torch.full((2,), 5000, dtype=torch.int32)
    out = torch.empty(2, 16, dtype=torch.int32)
    with pytest.raises(ValueError, match="stamps: the shipped build"):
        topk.launch(x, lens, lens, lens, 0, 1, 16, out, stamps=torch.zeros(2, 16, dtype=torch.int64))
    assert not topk.profiling(cuda_api.program())
    lab = cuda_api.program(profile=1)
    assert topk.profiling(lab) and lab is cuda_api.program(1) and lab.headers == cuda_api.program().headers
    assert "-DDSA_OPS_PROFILE=2" in cuda_api.program(2).options
    with pytest.raises(ValueError, match="profile"):
        cuda_api.program(3)


@pytest.mark.parametrize("stable", [True, False])
def test_writers_pass_the_mode_to_the_kernel(monkeypatch, stable):
    """CPU: the op's ``stable`` reaches the launch as ``ordered`` (False: the solo and split
    kernels may emit in any order), for decode and prefill."""
    seen = []
    monkeypatch.setattr(topk, "launch", lambda *a, **kw: seen.append(kw.get("ordered")))
    x = torch.zeros(2, 10)
    lens = torch.tensor([3, 10], dtype=torch.int32)
    out = torch.empty(2, 4, dtype=torch.int32)
    topk.decode(x, lens, 4, 1, stable, out)
    topk.prefill(x, lens, lens, 4, stable, out)
    assert seen == [stable, stable]


def test_variants_tool_passes_unordered_checks_and_fails_on_a_fail():
    """CPU: the devtool's exit status (run 16 exited 1 with every check passing: the
    unordered variants' "ok (any order)" was not counted as a pass)."""
    all_ok = pytest.importorskip("lab.cuda_topk_variants", reason="lab/ is in a checkout, not in the wheel").all_ok

    assert all_ok([{"check": "ok"}, {"check": "ok (any order)"}, {"check": "differs (not exact)"}])
    assert not all_ok([{"check": "ok"}, {"check": "FAIL rows differ"}])
