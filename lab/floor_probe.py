"""Device probe: what the steps of any Triton decode top-k cost on their own (the floors
under the <= 10 us target for rows <= 16 at 128K).

Each microkernel does one step of the chain that an exact top-k of one row needs, on
fresh random data, and its result is checked against torch before it is timed (graph
replay of one call, 256 MiB written before each replay, median of 30, two interleaved
rounds), the way ``dsa-ops bench`` times decode:

- ``empty``: a Triton kernel that does nothing; ``empty x2``: two of them in one graph.
- ``read P=.. L=.. bar=..``: P programs of 8 warps split a row of L fp32 keys, count the
  keys above a threshold (a compare a key, one block of loads in flight), then pass
  ``bar`` row barriers (the spin barrier of ``kernels_radix._barrier``), each after
  adding the program's count to the row's total; the last program restores the zeros.
  ``last``: no barrier; one atomic adds a program's count and its arrival, and the last
  program to arrive goes on alone (with ``choose``: the bin choice) and restores the zeros.
- ``sort S/w``: one program of w warps loads S strided samples of the row, sorts them
  (``tl.sort``) and takes sample rank q (the bracket's first step).
- ``choose``: one program loads 2048 bin counts and finds the bin of the k-th key
  (``kernels_radix._choose``: a cumsum and three sums).
- ``skeleton`` (``read ... sort choose``): the bracket's chain with its real steps and no
  region work: P programs sort the sample while their first block is in flight, read and
  count the slice, barrier, load the 2048 bins and choose (the choice is stored and
  checked, so it cannot be compiled away), barrier again; or, with ``last``, one arrival
  atomic and the last program chooses.
- ``read P=1 ...`` (8, 16 or 32 warps): one program reads the whole row (no exchange at all).
- ``radix``: the shipped kernel at the same shapes.

Usage (device): ``python -m lab.floor_probe OUT.json``. ``--selfcheck`` (CPU, with
``TRITON_INTERPRET=1``) checks the kernels against torch on small shapes (tests/test_tools.py).
"""

from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl

from dsa_ops.backends.triton import radix_launch as radix
from dsa_ops.backends.triton.kernels_radix import _barrier, _choose
from dsa_ops.benchmarking import time_graph
from dsa_ops.testing import assert_decode_equivalent

K = 2048
W = 133120


@triton.jit
def _empty(x):
    pass


@triton.jit
def _sample_pivot(x, L, SAMP: tl.constexpr):
    """Sample rank q (the k-th's expected rank) of SAMP strided keys of the row, sorted."""
    st = L // SAMP
    i = tl.arange(0, SAMP)
    srt = tl.sort(tl.load(x + i * st + st // 2), descending=True)
    q = (2047 * SAMP) // L
    return tl.sum(tl.where(i == q, srt, 0.0))


@triton.jit
def _put3(dst, a, b, c):
    """Three scalars to dst[0:3]."""
    j = tl.arange(0, 4)
    tl.store(dst + j, tl.where(j == 0, a, tl.where(j == 1, b, c)), mask=j < 3)


@triton.jit
def _read_bar(x, L, thr, out, ctl, hist, P: tl.constexpr, BLOCK: tl.constexpr, NBAR: tl.constexpr,
              SORT: tl.constexpr, SAMP: tl.constexpr, CHOOSE: tl.constexpr, LAST: tl.constexpr = False):
    pid = tl.program_id(0)
    sl = tl.cdiv(tl.cdiv(L, P), BLOCK) * BLOCK
    lo = pid * sl
    hi = tl.minimum(lo + sl, L)
    ar = tl.arange(0, BLOCK)
    xb = tl.load(x + lo + ar, mask=lo + ar < hi, other=float("-inf"))  # in flight during the sort
    t = thr
    if SORT:
        t = _sample_pivot(x, L, SAMP)
    c = tl.zeros([BLOCK], tl.int32)
    for s in range(lo, hi, BLOCK):
        xn = tl.load(x + s + BLOCK + ar, mask=s + BLOCK + ar < hi, other=float("-inf"))
        c += (xb > t).to(tl.int32)
        xb = xn
    n = tl.sum(c)
    if LAST:  # no barrier: one atomic adds the count and the arrival; the last to arrive goes on alone
        tl.debug_barrier()
        old = tl.atomic_add(ctl + 8, n + (1 << 24), sem="acq_rel")
        if (old >> 24) == P - 1:
            tot = (old & 0xFFFFFF) + n
            if CHOOSE:
                bn, below, cb = _choose(tl.load(hist + tl.arange(0, 2048), cache_modifier=".cg"), tot % 4096 + 1)
                _put3(out + 200, bn, below, cb)  # (stored, so the choice is not compiled away; checked)
            tl.store(out, tot)
            tl.store(ctl + tl.arange(0, 16), tl.zeros([16], tl.int32))
    for b in tl.static_range(NBAR):
        tl.atomic_add(ctl + 8 + b, n, sem="relaxed")
        _barrier(ctl, P * (b + 1))
        n = tl.load(ctl + 8 + b, cache_modifier=".cg")
        if CHOOSE:
            if b == 0:
                bn, below, cb = _choose(tl.load(hist + tl.arange(0, 2048), cache_modifier=".cg"), n % 4096 + 1)
                if pid == 0:
                    _put3(out + 200, bn, below, cb)
    if not LAST:
        tl.store(out + pid, n)
    if NBAR > 0:
        tl.debug_barrier()
        if tl.atomic_add(ctl + 1, 1, sem="acq_rel") == P - 1:  # the last to leave restores the zeros
            tl.store(ctl + tl.arange(0, 16), tl.zeros([16], tl.int32))


@triton.jit
def _sort_only(x, L, out, SAMP: tl.constexpr):
    tl.store(out, _sample_pivot(x, L, SAMP))


@triton.jit
def _choose_only(hist, need, out):
    b, below, cb = _choose(tl.load(hist + tl.arange(0, 2048), cache_modifier=".cg"), need)
    _put3(out, b, below, cb)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def build_cases(dev: torch.device, cpu: bool) -> list:
    """(tag, launch, check against torch) of every case; ``cpu``: the interpreter's set
    (no spin barrier with more than one program: the interpreter runs programs one after
    another), for ``--selfcheck``."""
    torch.manual_seed(0)
    x = torch.randn(1, W, device=dev)
    ctl = torch.zeros(64, dtype=torch.int32, device=dev)
    hist = torch.randint(0, 8, (2048,), dtype=torch.int32, device=dev)
    out = torch.zeros(256, dtype=torch.int32, device=dev)
    outf = torch.zeros(4, device=dev)
    thr = 0.5
    cases = []

    def read(P, L, nbar, sort=False, choose=False, nw=8, samp=256, last=False):
        block = 8 * 32 * nw
        tag = f"read P={P} L={L} bar={nbar}" + (" last" if last else "") + (" sort" if sort else "") + \
            (" choose" if choose else "") + (f" {nw} warps" if nw != 8 else "")

        def fn():
            _read_bar[(P,)](x, L, thr, out, ctl, hist, P=P, BLOCK=block, NBAR=nbar, SORT=sort, SAMP=samp,
                            CHOOSE=choose, LAST=last, num_warps=nw)

        def check():
            out.fill_(-1)
            fn()
            _sync(dev)
            row = x[0, :L]
            t = _pivot(row, samp) if sort else torch.tensor(thr, device=dev)
            counts = _slices(row, t, P, block)
            total = int(counts.sum())
            if last:
                want = counts.sum().reshape(1)
            elif nbar:
                # each barrier adds the running total again: n_b = sum of the programs' n_{b-1}
                want = torch.full((P,), total * P ** (nbar - 1), device=dev)
            else:
                want = counts
            got = out[:want.numel()].to(want.dtype)
            if not torch.equal(got, want):
                raise SystemExit(f"floor_probe: {tag}: {got.tolist()[:8]} vs {want.tolist()[:8]}")
            if int(ctl.abs().sum()) != 0:
                raise SystemExit("floor_probe: the barrier counters were not restored")
            if choose:
                need = total % 4096 + 1
                if out[200:203].tolist() != _choice(need):
                    raise SystemExit(f"floor_probe: {tag}: choice {out[200:203].tolist()} vs {_choice(need)}")

        cases.append((tag, fn, check))

    def _choice(need):
        """(bin, keys below it, keys in it) of the need-th key of ``hist``, as ``_choose``."""
        cum = torch.cumsum(hist, 0)
        b = int((cum < need).sum())
        return [b, int(hist[:b].sum()), int(hist[b])]

    def _pivot(row, samp):
        """Sample rank q of the row's SAMP strided keys, as ``_sample_pivot``."""
        L = row.numel()
        st = L // samp
        return torch.sort(row[torch.arange(samp, device=dev) * st + st // 2], descending=True).values[(2047 * samp) // L]

    def _slices(row, t, P, block):
        """Each program's count of keys above t, on the kernel's slices (whole blocks)."""
        L = row.numel()
        sl = triton.cdiv(triton.cdiv(L, P), block) * block
        return torch.tensor([int((row[p * sl:min(p * sl + sl, L)] > t).sum()) for p in range(P)], device=dev)

    def sort_case(samp, nw, L):
        def fn():
            _sort_only[(1,)](x, L, outf, SAMP=samp, num_warps=nw)

        def check():
            fn()
            _sync(dev)
            want = _pivot(x[0, :L], samp)
            if float(outf[0]) != float(want):
                raise SystemExit(f"floor_probe: sort {samp}: {float(outf[0])} vs {float(want)}")

        cases.append((f"sort {samp}/{nw} warps L={L}", fn, check))

    def choose_case():
        def fn():
            _choose_only[(1,)](hist, 2048, out, num_warps=8)

        def check():
            out.fill_(-1)
            fn()
            _sync(dev)
            if out[:3].tolist() != _choice(2048):
                raise SystemExit(f"floor_probe: choose {out[:3].tolist()} vs {_choice(2048)}")

        cases.append(("choose 2048 bins", fn, check))

    def radix_case(L):
        lens = torch.full((1,), L, dtype=torch.int32, device=dev)
        o = torch.empty(1, K, dtype=torch.int32, device=dev)

        def fn():
            radix.launch(x, lens, lens, lens, K, 1, False, False, o)

        def check():
            fn()
            _sync(dev)
            assert_decode_equivalent(o, x, lens, K)

        cases.append((f"radix (shipped) L={L}", fn, check))

    def empty2():
        def fn():
            _empty[(1,)](out)
            _empty[(1,)](out)

        cases.append(("empty x2", fn, lambda: None))

    if cpu:
        read(1, 4096, 2, sort=True, choose=True)
        read(4, 16384, 0)
        read(4, 16384, 0, sort=True, choose=True, last=True)
        sort_case(256, 8, 16384)
        choose_case()
        return cases
    cases.append(("empty", lambda: _empty[(1,)](out), lambda: None))
    empty2()
    for P, L in ((2, 4096), (32, 131072)):
        for nbar in (0, 1, 2):
            read(P, L, nbar)
    read(128, 131072, 0, nw=4)
    read(128, 131072, 1, nw=4)
    for nw in (8, 16, 32):
        read(1, 131072, 0, nw=nw)
    sort_case(256, 8, 131072)
    sort_case(512, 4, 131072)
    sort_case(256, 8, 4096)
    choose_case()
    read(2, 4096, 2, sort=True, choose=True)
    read(32, 131072, 2, sort=True, choose=True)
    read(32, 131072, 0, last=True)
    read(2, 4096, 0, sort=True, choose=True, last=True)
    read(32, 131072, 0, sort=True, choose=True, last=True)
    radix_case(4096)
    radix_case(131072)
    return cases


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str]) -> None:
    if argv[1:] == ["--selfcheck"]:  # the kernels against torch on the CPU (TRITON_INTERPRET=1)
        for tag, fn, check in build_cases(torch.device("cpu"), True):
            check()
            print(f"{tag}: ok")
        return
    if len(argv) != 2 or argv[1].startswith("-"):
        raise SystemExit("usage: python -m lab.floor_probe OUT.json | --selfcheck")
    cases = build_cases(torch.device("cuda"), False)
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                 "note": "us, graph replay of one call, 256 MiB written before each replay, median of 30; two rounds",
                 "us": {}}
    for tag, fn, check in cases:
        check()
    for rnd in range(2):
        for tag, fn, check in cases:
            res["us"].setdefault(tag, []).append(round(time_graph(fn).median, 1))
            if rnd == 1:
                log(f"{tag:42s} {res['us'][tag]}")
    json.dump(res, open(argv[1], "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv)
