"""Stall samples of a radix kernel profile by loop: ``python -m lab.ncu_stalls SASS.csv [LO HI]``.

SASS.csv is the per-instruction source page that ``lab/ncu_radix.sh`` exports (``ncu --page
source --csv --print-source sass``). Each loop (a backward branch) holding at least 1 % of
the warp stall samples is listed with its share and its top stall reasons, then the kernel's
overall reasons; with LO HI (hex addresses) also every instruction in that range with its
samples and its main reason.
"""

from __future__ import annotations

from lab import help_requested

help_requested(__doc__)

import collections
import csv
import re
import sys


def num(v: str) -> float:
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0


def main(argv: list[str]) -> None:
    rows = list(csv.reader(open(argv[1])))
    hdr = rows[1]
    ix = {h: i for i, h in enumerate(hdr)}
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    ins = [(int(r[ix["Address"]], 16), r[ix["Source"]], r) for r in rows[2:] if len(r) == len(hdr)]
    samples = "Warp Stall Sampling (All Samples)"
    tot = sum(num(r[ix[samples]]) for _, _, r in ins) or 1.0
    print(f"{tot:.0f} samples over {len(ins)} instructions")
    loops = []
    for a, src, _ in ins:
        m = re.search(r"BRA (?:`\(\.L_x_\d+\) )?0x([0-9a-f]+)", src)
        if m and a - 0x10000 < int(m.group(1), 16) < a:
            loops.append((int(m.group(1), 16), a))
    rep = []
    for lo, hi in loops:
        s: collections.Counter = collections.Counter()
        n = ex = 0
        for a, _, r in ins:
            if lo <= a <= hi:
                n += 1
                ex += num(r[ix["Instructions Executed"]])
                for h in stalls:
                    s[h] += num(r[ix[h]])
        t = sum(s.values())
        if t / tot > 0.01:
            rep.append((t, lo, hi, n, ex, s))
    for t, lo, hi, n, ex, s in sorted(rep, reverse=True):
        top = ", ".join(f"{h[6:]} {v / t * 100:.0f} %" for h, v in s.most_common(5))
        print(f"loop {lo:#x}-{hi:#x}: {n} instructions, {ex / 1e6:.1f}M executed, {t / tot * 100:.1f} % of samples ({top})")
    allst: collections.Counter = collections.Counter()
    for _, _, r in ins:
        for h in stalls:
            allst[h] += num(r[ix[h]])
    print("overall:", ", ".join(f"{h[6:]} {v / tot * 100:.1f} %" for h, v in allst.most_common(8)))
    if len(argv) > 3:
        lo, hi = int(argv[2], 16), int(argv[3], 16)
        for a, src, r in ins:
            if lo <= a <= hi:
                top = max(stalls, key=lambda h: num(r[ix[h]]))
                print(f"{a:#x} {num(r[ix[samples]]):7.0f} {top[6:]:12s} {src[:80]}")


if __name__ == "__main__":
    main(sys.argv)
