"""Triton bodies of the ``triton`` backend: one launch, sample pivots, one streaming read.

Keys (contract §1.1) are held as *signed* int32 so plain signed compares give the order:
``skey = bits ^ (~(bits >> 31) | INT_MIN)``; smaller = better. The composite (key, column)
is a strict total order whose first k elements are exactly the reference's stable set.

Per row of live length L > k, split over ``n_slices`` programs (a "slice" each):
1. every program loads the same strided sample of NS values, ranks it (an NS x NS compare),
   and takes pivots ``t_lo <= t_hi`` bracketing the k-th key with high probability, plus 16
   splitter keys between them (identical in every program: the math is deterministic);
2. one read of its slice: key < t_lo -> ``out`` (definite winners), t_lo <= key < t_hi ->
   the row's mid buffer (key, column), key == t_hi -> the tie buffer (column, first k);
   positions come from per-row atomics (split) or running counts (one program per row);
3. the last program to arrive (atomic counter) resolves: counts per splitter bucket pick the
   bucket holding the k-th; one pass over the mid buffer emits the buckets below it and
   compacts that bucket; "levels" (sample 128, rank, 16 splitters, count, compact) narrow
   it to <= 128 elements, ranked exactly. Any pivot miss or overflow falls back to an exact
   4-bit radix over the row (8 counting reads), then an index-ordered emission.
Stable mode emits in index order from the final threshold (one more read of the row).
Nothing reads a column at or past L: every load is masked by the device length.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsa_ops.backends.triton.kernels_select import (  # noqa: F401  (jit helpers resolve by name)
    INT_MAX,
    INT_MIN,
    MAXIT,
    _bucket,
    _copy,
    _count_pass,
    _emit_ordered,
    _final,
    _level_splitters,
    _pick,
    _radix_kth,
    _rank_part,
    _row_pivots,
    _row_window,
    _skey,
    _split_pass,
    _splitters,
    _trivial,
)


@triton.jit
def _stream(row, lo, hi, t_lo, t_hi, u, out_row, k, mk, mi, tie, us, cap, cnt_row, split, lim,
            BLOCK: tl.constexpr, COUNT: tl.constexpr):
    """The one read of a slice [lo, hi): classify, write winners / mid / ties, count splitters.

    Reads logits[lo:hi] once (next block prefetched). Writes out (key < t_lo, unless stable),
    mid (key, column) and tie columns at atomic (split) or running positions. Row counters
    (int64): [0] winners, [1] mid, [2] ties, [3] arrivals, [4:20] mid below each splitter
    (added here when ``COUNT``: bucket = how many splitters a key reaches, 16 scalar compares,
    then a 32-bin histogram; the splitters go through ``us`` to become scalars).
    """
    ar = tl.arange(0, BLOCK)
    j = tl.arange(0, 16)
    j4 = tl.arange(0, 4)
    a32 = tl.arange(0, 32)
    if COUNT:
        tl.store(us + j, u)  # every program of the row writes the same values
        tl.debug_barrier()
    cw = tl.zeros([], tl.int32)
    cm = tl.zeros([], tl.int32)
    ct = tl.zeros([], tl.int32)
    acc = tl.zeros([16], tl.int32)
    x = tl.load(row + lo + ar, mask=lo + ar < hi, other=0.0)
    for start in range(lo, hi, BLOCK):
        o = start + ar
        v = o < hi
        on = o + BLOCK
        xn = tl.load(row + on, mask=on < hi, other=0.0)  # prefetch: its latency overlaps this block
        key = _skey(x)
        win = v & (key < t_lo)
        tie_m = v & (key == t_hi)
        mid = v & (key >= t_lo) & (key < t_hi)
        # one reduction for the three class sizes (21-bit fields; BLOCK < 2^21)
        packed = tl.sum(win.to(tl.int64) + (mid.to(tl.int64) << 21) + (tie_m.to(tl.int64) << 42))
        nw = (packed & 2097151).to(tl.int32)
        nm = ((packed >> 21) & 2097151).to(tl.int32)
        nt = (packed >> 42).to(tl.int32)
        if COUNT:
            bidx = tl.zeros([BLOCK], tl.int32)
            for jj in tl.static_range(16):
                bidx += (key >= tl.load(us + jj)).to(tl.int32)
            h = tl.histogram(tl.where(mid, bidx, 31), 32)
            acc += tl.sum(tl.where(a32[:, None] <= j[None, :], h[:, None], 0), axis=0)
        if nw + nm + nt > 0:
            bw = cw
            bm = cm
            bt = ct
            if split != 0:  # one vector atomic: bases for the three classes in one round trip
                add = tl.where(j4 == 0, nw, tl.where(j4 == 1, nm, tl.where(j4 == 2, nt, 0)))
                old = tl.atomic_add(cnt_row + j4, add.to(tl.int64)).to(tl.int32)
                bw = tl.sum(tl.where(j4 == 0, old, 0))
                bm = tl.sum(tl.where(j4 == 1, old, 0))
                bt = tl.sum(tl.where(j4 == 2, old, 0))
            pw = bw + tl.cumsum(win.to(tl.int32), axis=0) - 1
            tl.store(out_row + pw, o, mask=win & (pw < lim))
            pm = bm + tl.cumsum(mid.to(tl.int32), axis=0) - 1
            tl.store(mk + pm, key, mask=mid & (pm < cap))
            tl.store(mi + pm, o, mask=mid & (pm < cap))
            pt = bt + tl.cumsum(tie_m.to(tl.int32), axis=0) - 1
            tl.store(tie + pt, o, mask=tie_m & (pt < k))
        cw += nw
        cm += nm
        ct += nt
        x = xn
    if COUNT:
        tl.atomic_add(cnt_row + 4 + j, acc.to(tl.int64))
    return cw, cm, ct, acc



@triton.jit
def _resolve(row, L, k, out_row, t_lo, t_hi, u, cw, cm, ct, acc, cnt_row, mk, mi, ak, ai, tie, cap,
             split, count, stable, dbg, MF: tl.constexpr, CH: tl.constexpr, BC: tl.constexpr, BS: tl.constexpr):
    """Last program of a row: from the counters and buffers to a full out row (see module doc)."""
    j = tl.arange(0, 16)
    n_win = cw
    c_mid = cm
    c_tie = ct
    if split != 0:
        # Atomic exchange: read every counter and leave zeros for the next call in one step
        # (a separate reset store could overtake another thread's read).
        j4 = tl.arange(0, 4)
        c4 = tl.atomic_xchg(cnt_row + j4, tl.zeros([4], tl.int64)).to(tl.int32)
        n_win = tl.sum(tl.where(j4 == 0, c4, 0))
        c_mid = tl.sum(tl.where(j4 == 1, c4, 0))
        c_tie = tl.sum(tl.where(j4 == 2, c4, 0))
        c16 = tl.atomic_xchg(cnt_row + 4 + j, tl.zeros([16], tl.int64)).to(tl.int32)
        if count != 0:
            acc = c16
    lim = tl.where(stable != 0, 0, INT_MAX)  # emission bound: 0 in stable mode (0-d bools break interpreted masks)
    need = k - n_win
    fb = ((n_win >= k) | (n_win + c_mid + c_tie < k) | (c_mid > cap)).to(tl.int32)
    if dbg == 2:  # timing probe: stop once the counters are read (out is left as is)
        fb = tl.zeros([], tl.int32) + 2
    tk = t_hi
    ti = tl.zeros([], tl.int32) + INT_MAX
    quota = need - c_mid
    if fb == 0:
        if c_mid >= need:
            imin = tl.zeros([16], tl.int32) + INT_MIN
            if count == 0:
                acc = _count_pass(mk, mi, c_mid, u, imin, BC, True)
            below, top, lbk, lbi, ubk, ubi = _bucket(acc, c_mid, need, u, imin, t_lo, INT_MIN, t_hi, INT_MIN)
            _split_pass(mk, mi, c_mid, lbk, lbi, ubk, ubi, ak, ai, out_row, n_win, lim, BS)
            tl.debug_barrier()
            opos = n_win + below
            need2 = need - below
            n = top - below
            src_k = ak
            src_i = ai
            alt_k = mk
            alt_i = mi
            it = tl.zeros([], tl.int32)
            while (n > MF) & (it < MAXIT):
                pk, pi = _level_splitters(src_k, src_i, n, need2, MF, CH)
                lacc = _count_pass(src_k, src_i, n, pk, pi, BC, False)
                below, top, lbk, lbi, ubk, ubi = _bucket(lacc, n, need2, pk, pi, INT_MIN, INT_MIN, INT_MAX, INT_MAX)
                _split_pass(src_k, src_i, n, lbk, lbi, ubk, ubi, alt_k, alt_i, out_row, opos, lim, BS)
                tl.debug_barrier()
                opos += below
                need2 -= below
                n = top - below
                src_k, alt_k = alt_k, src_k
                src_i, alt_i = alt_i, src_i
                it += 1
            if n <= MF:
                tk, ti = _final(src_k, src_i, n, need2, out_row, opos, lim, MF, CH)
                quota = tl.zeros([], tl.int32) + INT_MAX
            else:
                fb = tl.zeros([], tl.int32) + 1
        else:
            if stable == 0:  # all mid, then the first `quota` ties (any ties conform)
                _copy(mi, c_mid, out_row + n_win, BS)
                _copy(tie, quota, out_row + n_win + c_mid, BS)
    if fb == 1:
        tl.atomic_add(cnt_row + 31, 1)  # diagnostics: fallbacks taken by this slot (never reset)
        tk, quota = _radix_kth(row, L, k, BC)
        ti = tl.zeros([], tl.int32) + INT_MAX
        tl.debug_barrier()  # earlier partial writes to out (other threads) land first
        _emit_ordered(row, L, out_row, k, tk, ti, quota, BS)
    if fb == 0:
        if stable != 0:
            _emit_ordered(row, L, out_row, k, tk, ti, quota, BS)


@triton.jit(do_not_specialize=["stride_r", "R", "W", "k", "next_n", "n_slices", "is_prefill", "split",
                               "count", "stable", "cap", "ws_stride", "dbg"])
def topk_kernel(logits, stride_r, lens, starts, ends, out, ws, cnt,
                R, W, k, next_n, n_slices, is_prefill, split, count, stable, cap, ws_stride, dbg,
                NS: tl.constexpr, MF: tl.constexpr, CH: tl.constexpr, BLOCK: tl.constexpr, BC: tl.constexpr,
                BS: tl.constexpr):
    """Grid (G0, n_slices). Split mode: G0 = R, program (r, s) owns slice s of row r and the
    row's workspace slot r. Row mode (n_slices = 1): program g loops over rows g, g + G0, ...
    with private slot g. Flags (is_prefill, split, count, stable) are runtime ints so one
    compiled kernel serves every call."""
    pid0 = tl.program_id(0)
    pid_s = tl.program_id(1)
    g0 = tl.num_programs(0)
    wsr = ws + pid0.to(tl.int64) * ws_stride
    mk = wsr
    mi = wsr + cap
    ak = wsr + 2 * cap
    ai = wsr + 3 * cap
    tie = wsr + 4 * cap
    cnt_row = cnt + pid0 * 32
    lim = tl.where(stable != 0, 0, k)  # definite winners go to out unless stable
    for r in range(pid0, R, g0):
        tl.debug_barrier()  # row mode reuses the slot: the last row's reads finish before new writes
        L, row, out_row = _row_window(r, lens, starts, ends, next_n, is_prefill, W, logits, stride_r, out, k)
        if L <= k:
            if pid_s == 0:
                _trivial(out_row, L, k, BS)
        else:
            sl = tl.cdiv(tl.cdiv(L, n_slices), BLOCK) * BLOCK  # slices are whole streaming blocks
            n_act = tl.cdiv(L, sl)
            lo = pid_s * sl
            if lo < L:
                hi = tl.minimum(lo + sl, L)
                t_lo, t_hi, u = _row_pivots(row, L, k, NS, CH)
                cw = tl.zeros([], tl.int32)
                cm = tl.zeros([], tl.int32)
                ct = tl.zeros([], tl.int32)
                acc = tl.zeros([16], tl.int32)
                if dbg == 1:  # timing probe: pivots only
                    tl.store(out_row + pid_s, t_lo + t_hi)
                elif count != 0:  # split mode, many slices: programs count splitter buckets too
                    cw, cm, ct, acc = _stream(row, lo, hi, t_lo, t_hi, u, out_row, k, mk, mi, tie, tie + k, cap,
                                              cnt_row, split, lim, BLOCK, True)
                else:
                    cw, cm, ct, acc = _stream(row, lo, hi, t_lo, t_hi, u, out_row, k, mk, mi, tie, tie + k, cap,
                                              cnt_row, split, lim, BLOCK, False)
                last = tl.zeros([], tl.int32) + (dbg != 1)
                if (split != 0) & (dbg != 1):
                    tl.debug_barrier()  # this program's buffer writes happen-before its arrival
                    arrived = tl.atomic_add(cnt_row + 3, 1)
                    last = (arrived == n_act - 1).to(tl.int32)
                if last != 0:
                    _resolve(row, L, k, out_row, t_lo, t_hi, u, cw, cm, ct, acc, cnt_row, mk, mi, ak, ai, tie,
                             cap, split, count, stable, dbg, MF, CH, BC, BS)
