"""How fast can one program a row read a prefill chunk's rows? (GPU; CUDA.)

    python -m lab.read_probe OUT.json [C ...]
    TRITON_INTERPRET=1 python -m lab.read_probe --selfcheck     (CPU: the kernels on small rows)

The radix kernel's wide-chunk read (``kernels_bracket._lane_pass``) waits on its loads
(runs 40-41: long scoreboard, DRAM 44 %). This probe isolates the read: persistent
programs, one row at a time, each row's window [start, end) of a 16384-row causal chunk
read once and every key compared with a threshold (the count is checked against torch).
Variants:

* ``lanes``: the shipped read's loads (a step of STEP keys viewed as (STEP / 128, 128),
  the next step's loads in flight), 128 registers x 4 programs a multiprocessor.
* ``flat``: the same with a step taken as STEP contiguous keys, 16-byte aligned, so the
  loads are 16-byte vectors (LDG.128); the row's head up to the alignment and its tail
  are masked loads.
* ``tma-NS``: full steps by a TMA descriptor load of (1, STEP) keys into shared memory,
  pipelined ``NS`` steps deep by Triton (``tl.range(num_stages=NS)``); the tail by masked
  loads, so nothing at or past a row's end is read; boxes start 16-byte aligned (the
  head before that is a masked load too). Needs a 16-byte aligned base and pitch.
* ``async-NS``: the aligned full steps of ``flat`` pipelined by Triton (cp.async, 16 bytes).

Prints ms and the device-wide read rate, and writes them as JSON.
"""

from __future__ import annotations

from lab import help_requested

help_requested(__doc__)

import json
import sys
import time

import torch
import triton
import triton.language as tl

ROWS = 16384
LN = 128


@triton.jit
def _count(v, m, thr):
    return tl.sum(((v > thr) & m).to(tl.int32))


@triton.jit
def _read_lanes(x, P, starts, ends, cnt, R, thr, STEP: tl.constexpr):
    """The shipped lane read's loads: (STEP / LN, LN), next step in flight."""
    rows = tl.arange(0, STEP // 128)[:, None] * 128
    lane = tl.arange(0, 128)[None, :]
    ofs = rows + lane
    for r in range(tl.program_id(0), R, tl.num_programs(0)):
        lo = tl.load(starts + r)
        hi = tl.load(ends + r)
        row = x + (r + tl.zeros([], tl.int64)) * P
        acc = tl.full([], 0, tl.int32)
        v = tl.load((row + lo + lane) + rows, mask=ofs < hi - lo, other=0.0)
        for start in range(lo, hi, STEP):
            rem = hi - start
            cur = v
            v = tl.load((row + (start + STEP) + lane) + rows, mask=ofs < rem - STEP, other=0.0)
            acc += _count(cur, ofs < rem, thr)
        tl.store(cnt + r, acc)


@triton.jit
def _read_flat(x, P, starts, ends, cnt, R, thr, STEP: tl.constexpr, NS: tl.constexpr):
    """Aligned contiguous steps (16-byte vectors); NS > 0: Triton pipelines them NS deep
    (cp.async), else the next step's loads are issued before this step's compares."""
    o = tl.arange(0, STEP)
    for r in range(tl.program_id(0), R, tl.num_programs(0)):
        lo = tl.load(starts + r)
        hi = tl.load(ends + r)
        row = x + (r + tl.zeros([], tl.int64)) * P
        a = tl.minimum((lo + 3) // 4 * 4, hi)  # first aligned column
        nf = (hi - a) // STEP
        acc = _count(tl.load(row + lo + o, mask=o < a - lo, other=0.0), o < a - lo, thr)
        if NS > 0:
            for i in tl.range(0, nf, num_stages=NS):
                st = tl.multiple_of(a + i * STEP, 4)
                acc += _count(tl.load(row + st + o), o < STEP, thr)
        else:
            v = tl.load(row + tl.multiple_of(a, 4) + o, mask=o < nf * STEP, other=0.0)
            for i in range(0, nf):
                cur = v
                v = tl.load(row + tl.multiple_of(a + (i + 1) * STEP, 4) + o, mask=o < (nf - i - 1) * STEP, other=0.0)
                acc += _count(cur, o < STEP, thr)
        t = a + nf * STEP
        acc += _count(tl.load(row + t + o, mask=o < hi - t, other=0.0), o < hi - t, thr)
        tl.store(cnt + r, acc)


@triton.jit
def _read_tma(desc, x, P, starts, ends, cnt, R, thr, STEP: tl.constexpr, NS: tl.constexpr):
    """Full steps by TMA (1, STEP) boxes, NS deep; the tail by masked loads."""
    o = tl.arange(0, STEP)
    for r in range(tl.program_id(0), R, tl.num_programs(0)):
        lo = tl.load(starts + r)
        hi = tl.load(ends + r)
        row = x + (r + tl.zeros([], tl.int64)) * P
        a = tl.minimum((lo + 3) // 4 * 4, hi)  # TMA boxes start 16-byte aligned
        nf = (hi - a) // STEP
        acc = _count(tl.load(row + lo + o, mask=o < a - lo, other=0.0), o < a - lo, thr)
        for i in tl.range(0, nf, num_stages=NS):
            v = desc.load([r, tl.multiple_of(a + i * STEP, 4)])
            acc += tl.sum((v > thr).to(tl.int32))
        t = a + nf * STEP
        acc += _count(tl.load(row + t + o, mask=o < hi - t, other=0.0), o < hi - t, thr)
        tl.store(cnt + r, acc)


def regs(per_sm: int) -> int:
    """Registers a thread for ``per_sm`` four-warp programs a multiprocessor."""
    return min(128, 65536 // (per_sm * 128))


def selfcheck() -> None:
    """Every variant's count against torch on small, ragged windows (any device; on the
    CPU under TRITON_INTERPRET=1): starts off the 16-byte grid, empty and full windows."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    R, C, thr, step = 24, 700, 0.5, 64
    x = torch.randn(R, C, generator=g).to(dev)
    ends = torch.randint(0, C + 1, (R,), generator=g, dtype=torch.int32)
    ends[0], ends[1] = C, 0
    starts = torch.minimum(torch.randint(0, 50, (R,), generator=g, dtype=torch.int32), ends)
    col = torch.arange(C)[None, :]
    ref = ((x.cpu() > thr) & (col < ends[:, None].long()) & (col >= starts[:, None].long())).sum(1).to(torch.int32)
    starts, ends = starts.to(dev), ends.to(dev)
    cnt = torch.zeros(R, dtype=torch.int32, device=dev)
    for name, fn in (("lanes", lambda: _read_lanes[(5,)](x, C, starts, ends, cnt, R, thr, STEP=256)),
                     ("flat", lambda: _read_flat[(5,)](x, C, starts, ends, cnt, R, thr, STEP=step, NS=0)),
                     ("async", lambda: _read_flat[(5,)](x, C, starts, ends, cnt, R, thr, STEP=step, NS=3)),
                     ("tma", lambda: _read_tma[(5,)](TensorDescriptor.from_tensor(x, [1, step]), x, C, starts, ends,
                                                     cnt, R, thr, STEP=step, NS=3))):
        cnt.zero_()
        fn()
        if not torch.equal(cnt.cpu(), ref):
            raise SystemExit(f"read_probe: {name} counts differ from torch: {cnt.tolist()} vs {ref.tolist()}")
        print(f"{name}: ok")


def main(argv: list[str]) -> int:
    from triton.tools.tensor_descriptor import TensorDescriptor

    if argv[:1] == ["--selfcheck"]:
        selfcheck()
        return 0
    out_path = argv[0]
    cs = [int(c) for c in argv[1:]] or [32768, 131072]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "rows": ROWS, "runs": {}}
    thr = 0.5
    for C in cs:
        x = torch.randn(ROWS, C, device="cuda")
        ends = torch.arange(C - ROWS + 1, C + 1, device="cuda", dtype=torch.int32)
        starts = torch.zeros(ROWS, dtype=torch.int32, device="cuda")
        ref = ((x > thr) & (torch.arange(C, device="cuda")[None, :] < ends[:, None].long())).sum(1).to(torch.int32)
        nbytes = int(ends.sum().item()) * 4
        cnt = torch.zeros(ROWS, dtype=torch.int32, device="cuda")
        variants = []
        for step in (2048, 4096):
            variants.append((f"lanes step {step}, 128x4", lambda g, s=step: _read_lanes[(g,)](
                x, C, starts, ends, cnt, ROWS, thr, STEP=s, num_warps=4, maxnreg=128), 4))
        for step, ns in ((4096, 0), (2048, 0), (4096, 2), (4096, 3), (2048, 3), (2048, 4)):
            for per_sm in (4, 8):
                variants.append((f"flat step {step}, {'async ' + str(ns) if ns else 'prefetch'}, {per_sm}/SM",
                                 lambda g, s=step, n=ns, p=per_sm: _read_flat[(g,)](
                                     x, C, starts, ends, cnt, ROWS, thr, STEP=s, NS=n, num_warps=4,
                                     maxnreg=regs(p)), per_sm))
        for box in (1024, 2048, 4096):
            desc = TensorDescriptor.from_tensor(x, [1, box])
            for ns in (2, 3, 4):
                for per_sm in (4, 8):
                    if ns * box * 4 * per_sm > 200 * 1024:
                        continue
                    variants.append((f"tma box {box}, {ns} stages, {per_sm}/SM", lambda g, d=desc, s=box, n=ns, p=per_sm: _read_tma[(g,)](
                        d, x, C, starts, ends, cnt, ROWS, thr, STEP=s, NS=n, num_warps=4, maxnreg=regs(p)), per_sm))
        for name, fn, per_sm in variants:
            g = sms * per_sm
            try:
                cnt.zero_()
                fn(g)
                torch.cuda.synchronize()
                ok = bool(torch.equal(cnt, ref))
                ts = []
                for _ in range(10):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    fn(g)
                    b.record()
                    torch.cuda.synchronize()
                    ts.append(a.elapsed_time(b))
                ms = sorted(ts)[len(ts) // 2]
                rec = {"ms": round(ms, 3), "TB/s": round(nbytes / ms / 1e9, 2), "ok": ok}
            except Exception as e:  # a variant this Triton cannot build: record why, go on
                rec = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            res["runs"][f"C={C} {name}"] = rec
            print(f"{time.strftime('%T')} C={C} {name}: {rec}", flush=True)
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
