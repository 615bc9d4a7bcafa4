"""Device probe: the floors of a native CUDA decode top-k on Hopper, measured the way
``floor_probe`` measured Triton's (CUDA-graph replay of one call, 256 MiB written before each
replay, median of 30, two rounds in one process; every kernel checked against torch first).

Kernels (``cuda_floors.cu``, compiled with NVRTC through ``dsa_ops.backends.cuda``):

- ``empty``: one CTA that stores one word; ``empty x2`` two launches in one graph;
  ``empty x2 pdl``: the second launched with programmatic dependent launch (it waits on
  ``griddepcontrol.wait`` and reads what the first wrote).
- ``cluster N [sync]``: an empty launch of ``rows`` clusters of N CTAs (2 / 4 / 8 / 16;
  16 is a non-portable size), with one cluster barrier if ``sync``.
- ``cta``: one CTA a row reads L fp32 keys (float4, 4 loads in flight a thread) and builds a
  2048-bin shared-memory histogram of the top 11 key bits, then writes the bins.
- ``cluster N``: the same read split over a cluster of N CTAs, the N histograms reduced
  through distributed shared memory between two cluster barriers.
- ``last N``: the same split over N plain CTAs; each adds its non-zero bins to a global
  histogram, and the last CTA to arrive (one atomic) copies it out and zeroes it.
- Histogram modes: ``atomic`` (one shared atomic a key), ``match`` (keys of a warp with the
  same bin merged by ``__match_any_sync`` first) and ``read`` (no histogram: the read and a
  compare a key, the count in bin 0) to separate the read from the counting.

Usage (device): ``python -m lab.cuda_floors OUT.json [--quick]``;
``--selfcheck`` (CPU) compiles the source with NVRTC and checks the torch reference.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Callable

import torch

from dsa_ops.backends.cuda import DriverError, Program

W = 133120
BINS = 2048
SOURCE = open(os.path.join(os.path.dirname(__file__), "cuda_floors.cu")).read()
PROGRAM = Program("cuda_floors", SOURCE, ("-lineinfo",))
SPECIALS = (float("inf"), float("-inf"), float("nan"), -float("nan"), 0.0, -0.0, 3.4e38, -1.4e-45)


def reference_hist(x: torch.Tensor, lens: torch.Tensor, mode: str) -> torch.Tensor:
    """(R, 2048) int64: per row, the count of each top-11-bit key digit of x[r, :L_r]
    (contract key: sign clear -> bits ^ 0x7FFFFFFF, sign set -> bits); mode ``read``: the
    count of keys below digit 1024 in bin 0, zeros elsewhere."""
    out = torch.zeros(x.shape[0], BINS, dtype=torch.int64, device=x.device)
    for r in range(x.shape[0]):
        bits = x[r, :int(lens[r])].contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        key = torch.where(bits >= 1 << 31, bits, bits ^ 0x7FFFFFFF)
        digit = key >> 21
        if mode == "read":
            out[r, 0] = int((digit < 1024).sum())
        else:
            out[r] = torch.bincount(digit, minlength=BINS)
    return out


def make_rows(rows: int, dev: torch.device) -> torch.Tensor:
    """(rows, W) randn logits with the contract's special values near the front of each row."""
    g = torch.Generator(device="cpu").manual_seed(rows)
    x = torch.randn(rows, W, generator=g)
    x[:, 7:7 + len(SPECIALS)] = torch.tensor(SPECIALS)
    return x.to(dev)


Case = tuple[str, Callable[[], None], Callable[[], None]]


class Mismatch(RuntimeError):
    """A kernel's result differs from torch's (the case is reported, never timed)."""


def build_cases(dev: torch.device, quick: bool = False) -> list[Case]:
    """(tag, launch, check against torch) of every case."""
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    fn = lambda name, **kw: PROGRAM.function(name, idx, **kw)  # noqa: E731
    flag = torch.zeros(4096, dtype=torch.int32, device=dev)
    cases: list[Case] = []

    def expect(tag: str, got: torch.Tensor, want: torch.Tensor) -> None:
        torch.cuda.synchronize()
        if not torch.equal(got.cpu().to(torch.int64), want.cpu().to(torch.int64)):
            bad = (got.cpu().to(torch.int64) != want.cpu().to(torch.int64)).nonzero()[:4].tolist()
            raise Mismatch(f"cuda_floors: {tag}: mismatch at {bad}")

    empty = fn("empty")

    def run_empty():
        empty((1,), (128,), (flag,))

    def check_empty():
        flag.zero_()
        run_empty()
        expect("empty", flag[:1], torch.ones(1))

    cases.append(("empty", run_empty, check_empty))
    first, second = fn("pdl_first"), fn("pdl_second")
    for pdl in (False, True):
        def run_pair(pdl=pdl):
            first((1,), (128,), (flag,))
            second((1,), (128,), (flag,), pdl=pdl)

        def check_pair(pdl=pdl, run_pair=run_pair):
            flag.zero_()
            run_pair()
            expect("pdl", flag[:2], torch.tensor([1, 2]))

        cases.append(("empty x2" + (" pdl" if pdl else ""), run_pair, check_pair))

    ec = fn("empty_cluster", non_portable_cluster=True)
    for rows in (1, 64):
        for n in (2, 4, 8, 16):
            for sync in (0, 1):
                def run_ec(n=n, rows=rows, sync=sync):
                    ec((rows * n,), (128,), (flag, sync), cluster=(n,))

                def check_ec(n=n, rows=rows, run_ec=run_ec):
                    flag.zero_()
                    run_ec()
                    b = torch.arange(rows * n)
                    expect(f"cluster {n}", flag[:rows * n], (n << 8) | (b % n))

                cases.append((f"{rows} x cluster {n}" + (" sync" if sync else ""), run_ec, check_ec))

    for rows in ((1, 64) if quick else (1, 8, 16, 64)):
        x = make_rows(rows, dev)
        out = torch.zeros(rows, BINS, dtype=torch.int32, device=dev)
        ws = torch.zeros(rows, BINS, dtype=torch.int32, device=dev)
        cnt = torch.zeros(rows, dtype=torch.int32, device=dev)
        for L in (4096, 32768, 131072):
            lens = torch.full((rows,), L, dtype=torch.int32, device=dev)
            want = {m: reference_hist(x, lens, m) for m in ("atomic", "read")}
            want["match"] = want["atomic"]
            for mode in ("atomic", "match", "read"):
                shapes = [("cta", 1, 1024)]
                shapes += [("cluster", n, 512) for n in (2, 4, 8, 16)]
                shapes += [("last", n, 512) for n in (4, 16, 32)]
                if rows == 1 and L == 131072:
                    shapes += [("cluster", 16, 1024), ("cluster", 16, 256), ("last", 32, 1024), ("last", 64, 256)]
                for kind, n, threads in shapes:
                    k = fn(f"hist_{kind}_{mode}", non_portable_cluster=kind == "cluster")

                    def run_h(k=k, kind=kind, n=n, threads=threads, x=x, lens=lens, out=out, ws=ws, cnt=cnt):
                        if kind == "cta":
                            k((x.shape[0],), (threads,), (x, W, lens, out))
                        elif kind == "cluster":
                            k((x.shape[0] * n,), (threads,), (x, W, lens, out), cluster=(n,))
                        else:
                            k((x.shape[0] * n,), (threads,), (x, W, lens, n, ws, cnt, out))

                    tag = f"{rows} x {L // 1024}K {kind} {n} {mode} t{threads}"

                    def check_h(tag=tag, run_h=run_h, out=out, ws=ws, cnt=cnt, w=want[mode]):
                        out.fill_(-1)
                        run_h()
                        expect(tag, out, w)
                        expect(tag + " (workspace restored)", ws.abs().sum().reshape(1) + cnt.abs().sum(),
                               torch.zeros(1))

                    cases.append((tag, run_h, check_h))
    return cases


def measure(cases: list[Case], rounds: int = 2) -> dict:
    """Check each case, then time it ``rounds`` times (interleaved); failures are recorded."""
    from dsa_ops.benchmarking import time_graph

    res: dict = {"us": {}, "failed": {}}
    ok = []
    for tag, run, check in cases:
        try:
            check()
            ok.append((tag, run))
        except (DriverError, RuntimeError) as e:
            res["failed"][tag] = str(e)[:300]
            torch.cuda.synchronize()
    for rnd in range(rounds):
        for tag, run in ok:
            try:
                res["us"].setdefault(tag, []).append(round(time_graph(run).median, 2))
            except (DriverError, RuntimeError) as e:
                res["failed"][tag] = str(e)[:300]
    return res


def selfcheck() -> None:
    """CPU: compile the source for sm_90a (if NVRTC is found) and check the torch reference."""
    from dsa_ops.backends.cuda import nvrtc

    x = torch.tensor([[1.0, -1.0, float("inf"), float("-inf"), 0.0, -0.0, 2.0, 0.5]])
    lens = torch.tensor([8], dtype=torch.int32)
    h = reference_hist(x, lens, "atomic")[0]
    # +inf has the smallest key (0x007FFFFF: digit 3), -inf the largest (0xFF800000: 2044);
    # +0.0 -> 0x7FFFFFFF (1023), -0.0 -> 0x80000000 (1024); 1.0 -> 0x407FFFFF (515).
    want = torch.zeros(BINS, dtype=torch.int64)
    for v in (1.0, -1.0, float("inf"), float("-inf"), 0.0, -0.0, 2.0, 0.5):
        bits = int(torch.tensor([v]).view(torch.int32)) & 0xFFFFFFFF
        want[(bits if bits >> 31 else bits ^ 0x7FFFFFFF) >> 21] += 1
    if not torch.equal(h, want) or h[3] != 1 or h[2044] != 1 or h[1023] != 1 or h[1024] != 1 or h[515] != 1:
        raise SystemExit(f"selfcheck: reference histogram wrong: {h.nonzero().flatten().tolist()}")
    if int(reference_hist(x, lens, "read")[0, 0]) != 5:  # 1, inf, +0, 2, 0.5 have the sign clear
        raise SystemExit("selfcheck: reference read count wrong")
    try:
        nvrtc.load()
    except nvrtc.NvrtcError as exc:  # not found: nothing to compile with (a compile error still raises below)
        print(f"selfcheck: reference ok; compile skipped: {str(exc).split(': ')[0]} (set DSA_OPS_NVRTC)")
        return
    cubin, _ = nvrtc.compile_cubin(SOURCE, "cuda_floors.cu", "sm_90a", ("-lineinfo",))
    print(f"selfcheck: reference ok; cuda_floors.cu compiles for sm_90a ({len(cubin)} bytes)")


def main(argv: list[str]) -> None:
    if argv[1:] == ["--selfcheck"]:
        selfcheck()
        return
    if len(argv) not in (2, 3) or argv[1].startswith("-") or argv[2:] not in ([], ["--quick"]):
        raise SystemExit("usage: python -m lab.cuda_floors OUT.json [--quick] | --selfcheck")
    dev = torch.device("cuda", torch.cuda.current_device())
    cases = build_cases(dev, quick="--quick" in argv)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "arch": PROGRAM.function("empty").arch,
           "note": "us, graph replay of one call, 256 MiB written before each replay, median of 30; two rounds",
           "registers": {n: f.attrs for (n, *_), f in PROGRAM._functions.items()}}
    res.update(measure(cases))
    with open(argv[1], "w") as f:
        json.dump(res, f, indent=1)
    for tag, us in res["us"].items():
        print(f"{tag:44s} {' / '.join(f'{u:6.2f}' for u in us)}")
    for tag, err in res["failed"].items():
        print(f"{tag:44s} FAILED {err}")


if __name__ == "__main__":
    main(sys.argv)
