"""Compile the radix kernel for sm_90 without a GPU and report what ptxas made of it.

    python -m lab.offline_sass [--mode row|split] [--num-warps N] [--maxnreg N]
                                 [--sass FILE] [NAME=INT ...]

Device time is scarce, so check a kernel change here before measuring it. The report
gives the registers, the stack (spills) and the shared memory, then the bracket's read
loop (the backward branch whose body holds both the slot atomic and the bin atomic):
its SASS instruction count a block and its local-memory loads and stores.

The Triton found first on ``sys.path`` does the compile. To see what the device's Triton
does, install that version aside and put it first, for example
``pip install --no-deps --target /tmp/t36 triton==3.6.0`` and then
``PYTHONPATH=/tmp/t36:. python -m lab.offline_sass``. Codegen differs between versions:
in run 28, Triton 3.9 kept a tiled read in registers, and 3.6 did not.

Defaults are a shipped launch: row mode is 4 warps, 1024-key blocks, samp 512, lane
regions (LANES=128, as for rows of one program each; LANES=0 gives the warp-aggregated
build that prefill chunks under ``LANES_WIDE`` = 64K columns take; wide chunks take LU=4
PBINS=1 at ``--maxnreg 128``) and 64 registers; split mode (decode) is 8 warps, 2048-key blocks, samp 256 and 128
registers. ``NAME=INT`` overrides a constexpr of ``radix_kernel`` (e.g. ``PF=2``).
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget

from dsa_ops.backends.triton import radix_launch as rl
from dsa_ops.backends.triton.kernels_radix import radix_kernel

POINTERS = {"logits": "*fp32", "lens": "*i32", "starts": "*i32", "ends": "*i32", "out": "*i32", "ws": "*i32",
            "stats": "*i32"}


def constexprs(mode: str, num_warps: int, overrides: dict[str, int]) -> dict[str, int]:
    """The launch's constexprs for ``mode``, with ``overrides`` applied (names checked)."""
    block = 1024 if mode == "row" else rl.BLOCK
    c = dict(BLOCK=block, RT=rl.RT, CT=rl.CT, PMAX=rl.PMAX, HMASK=True, DBITS=rl.DBITS, NB=1 << rl.DBITS,
             RB=rl.RB, SAMP=rl.SAMP_ROW if mode == "row" else rl.SAMP, NBW=min(rl.NBW, 256 * num_warps),
             CATOM=True, PIPE=False, PF=rl.PF_ROW if mode == "row" else 1, WAGG=True, PACK=True,
             LANES=32 * num_warps if mode == "row" else 0, PBINS=False, LU=1, LPF=1, BINS=1, TIMING=False)
    params = inspect.signature(radix_kernel.fn).parameters
    for name, value in overrides.items():
        if name not in params:
            raise SystemExit(f"offline_sass: {name} is not a parameter of radix_kernel")
        c[name] = value
    c["PACK"] = c["PACK"] and c["CATOM"]  # as radix_launch.launch: packed stores need the slot atomics
    c["LANES"] = c["LANES"] if c["PACK"] else 0  # and lane regions the packed stores
    return {k: v for k, v in c.items() if k in params}


def compile_cubin(consts: dict[str, int], num_warps: int, maxnreg: int) -> bytes:
    params = list(inspect.signature(radix_kernel.fn).parameters)
    sig = {p: "constexpr" if p in consts else POINTERS.get(p, "i32") for p in params}
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(params) if p in POINTERS}
    src = triton.compiler.ASTSource(fn=radix_kernel, signature=sig, constexprs=consts, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "maxnreg": maxnreg})
    return k.asm["cubin"]


def read_loop(sass: str, lanes: bool, pbins: bool = False) -> tuple[str, int, int, int] | None:
    """(address range, instructions, LDL, STL) of the bracket's read: the first backward
    branch whose body holds a global load, a REDG (the bin atomic per window key; none in
    the read with lane regions and PBINS, where the bins are counted after it) and, without
    lane regions, an ATOMG (the slot atomic); with them, the 64-bit key stores instead."""
    ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,6})\*/\s+([^;]*);", sass)]
    for addr, text in ins:
        m = re.search(r"BRA (0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            body = [t for a, t in ins if int(m.group(1), 16) <= a <= addr]
            has = lambda op: any(op in t for t in body)  # noqa: E731
            bins = has("REDG") != (lanes and pbins)
            if has("LDG") and bins and (has("STG.E.64") if lanes else has("ATOMG")):
                return (f"{m.group(1)}-{hex(addr)}", len(body), sum("LDL" in t for t in body),
                        sum("STL" in t for t in body))
    return None


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("row", "split"), default="row", help="launch shape (default: row)")
    ap.add_argument("--num-warps", type=int, default=None, help="default: 4 (row) / 8 (split)")
    ap.add_argument("--maxnreg", type=int, default=None, help="default: ROW_MAXNREG (row) / MAXNREG (split)")
    ap.add_argument("--sass", default=None, help="also write the SASS to this file")
    ap.add_argument("consts", nargs="*", metavar="NAME=INT", help="constexpr overrides")
    a = ap.parse_args(argv)
    nw = a.num_warps or (4 if a.mode == "row" else rl.NUM_WARPS)
    mr = a.maxnreg or (rl.ROW_MAXNREG if a.mode == "row" else rl.MAXNREG)
    over = {}
    for item in a.consts:
        name, _, value = item.partition("=")
        if not value.lstrip("-").isdigit():
            raise SystemExit(f"offline_sass: expected NAME=INT, got {item!r}")
        over[name] = int(value)
    consts = constexprs(a.mode, nw, over)
    cubin = compile_cubin(consts, nw, mr)
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([os.path.join(tools, "cuobjdump"), "--dump-resource-usage", f.name],
                               capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", f.name],
                              capture_output=True, text=True, check=True).stdout
    if a.sass:
        with open(a.sass, "w") as out:
            out.write(sass)
    res = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", usage)
    print(f"triton {triton.__version__}, sm_90, {a.mode} mode, {nw} warps, maxnreg {mr}, {over or 'no overrides'}")
    print(f"registers {res.group(1)}, stack {res.group(2)} B, static shared {res.group(3)} B" if res else usage)
    lanes = bool(consts.get("LANES"))
    loop = read_loop(sass, lanes, bool(consts.get("PBINS")))
    step = consts.get("LU", 1) if lanes else 1
    if loop is None:
        print("bracket read loop: not found")
    else:
        span, n, ldl, stl = loop
        per = "a block" if step == 1 else f"a step of {step} blocks"
        print(f"bracket read loop {span}: {n} instructions {per}, {ldl} LDL, {stl} STL")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
