"""Phased prefill (non-stable, wide chunks): the radix kernel's row mode cut into three
launches, so that the chunk's one read runs with nothing else on the multiprocessors.

In the fused row mode (``kernels_radix``, one program a row) a program spends ~40 % of a
wide row in phases that issue no loads (the sample sort, the bin choice, the emit, the
rank), and its registers are sized for the read, so a multiprocessor holds only four
programs: the read runs at ~60 % of the rate a pure read reaches (notes, runs 42-45).
Here each phase is its own kernel:

1. ``sample_kernel`` (one program a row): SAMP strided samples sorted, the window's top
   ``t_hi`` and the bins (``kernels_bracket._bracket``, the same window as the fused
   kernel) -> ``prm[r] = (t_hi, s_base, sh, ok)``; ok = 0 for rows of L <= k or shorter
   than ``br_min``.
2. ``read_kernel`` (persistent, shaped for the read): every key of row r up to t_hi goes
   to row r's lane region (``kernels_bracket._lane_pass``: int64 (key, column) pairs, the
   lanes' counts in the region's last row). Nothing else.
3. ``select_kernel`` (persistent, shaped for latency): the window bins from the region,
   the bin of the k-th key (``_choose``), winners and the bin's keys in one pass over the
   region (``_lane_emit``), the bin ranked exactly (``_rank_emit``) unless taken whole.
   Rows that the bracket does not settle here (not bracketed, fewer than k window keys, a
   full lane, the k-th below the bins' base, a bin too large to rank) take the exact
   fallback in place: eight 4-bit counting reads and an index-ordered emission
   (``kernels_select._radix_kth`` / ``_emit_ordered``).

Rows of L <= k get 0..L-1, then -1 (``_trivial``). Every loop is bounded by the row's live
length; no logit at or past it is read. The regions need no initial value: a row's
counts are written by the read before the select reads them, and rows the read skips
(ok = 0) are never looked at. Each select program's window bins are restored to zero
after every row.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsa_ops.backends.triton.kernels_bracket import _bin_add, _bracket, _flat, _lane_pass, _pk
from dsa_ops.backends.triton.kernels_radix import _choose, _lane_emit, _rank_emit
from dsa_ops.backends.triton.kernels_select import INT_MAX, INT_MIN, _emit_ordered, _radix_kth, _row_window, _skey, _trivial


@triton.jit(do_not_specialize=["stride_r", "R", "W", "k", "br_min"])
def sample_kernel(logits, stride_r, starts, ends, prm, R, W, k, br_min, SAMP: tl.constexpr, NBW: tl.constexpr):
    """Program r: row r's bracket -> prm[r, 0:4] = (t_hi, s_base, sh, ok)."""
    r = tl.program_id(0)
    L, row, _ = _row_window(r, starts, starts, ends, 1, 1, W, logits, stride_r, logits, k)
    ok = (L > k) & (L >= br_min)
    t_hi = tl.zeros([], tl.int32)
    s_base = tl.zeros([], tl.int32)
    sh = tl.zeros([], tl.int32)
    if ok:
        t_hi, s_base, sh = _bracket(row, L, k, SAMP, NBW)
    j = tl.arange(0, 4)
    v = tl.where(j == 0, t_hi, tl.where(j == 1, s_base, tl.where(j == 2, sh, ok.to(tl.int32))))
    tl.store(prm + 4 * r + j, v)


@triton.jit
def _lane_read_x(row, lo, hi, t_hi, dk, lcap, BLOCK: tl.constexpr, LN: tl.constexpr, LU: tl.constexpr,
                 EV: tl.constexpr, SEV: tl.constexpr, ST: tl.constexpr):
    """Probe-only copy of ``_lane_pass`` (prefetch on, no bins) with knobs: EV, the loads
    evict first; SEV, the region stores evict last; ST = False, nothing stored (counts only).
    (Knobs inside ``_lane_pass`` itself change the shipped build's SASS even when off.)"""
    STEP: tl.constexpr = LU * BLOCK
    lane = tl.arange(0, LN)[None, :]
    rows = tl.arange(0, STEP // LN)[:, None] * LN
    ofs = rows + lane
    dl = dk + lane
    cnt = tl.zeros([LN], tl.int32)
    rb = row.to(tl.pointer_type(tl.int32))
    t_lim = tl.minimum(t_hi, INT_MAX - 1)
    if EV:
        x = tl.load((rb + lo + lane) + rows, mask=ofs < hi - lo, other=-1, eviction_policy="evict_first")
    else:
        x = tl.load((rb + lo + lane) + rows, mask=ofs < hi - lo, other=-1)
    for start in range(lo, hi, STEP):
        rem = hi - start
        s = _skey(x)
        if rem >= 2 * STEP:
            if EV:
                x = tl.load((rb + (start + STEP) + lane) + rows, eviction_policy="evict_first")
            else:
                x = tl.load((rb + (start + STEP) + lane) + rows)
        else:
            x = tl.load((rb + (start + STEP) + lane) + rows, mask=ofs < rem - STEP, other=-1)
        inw = s <= t_lim
        m = inw.to(tl.int32)
        n = cnt[None, :] + tl.cumsum(m, axis=0) - m
        if SEV:
            tl.store(_flat(dl + n * LN, STEP), _flat(_pk(s, start + ofs), STEP),
                     mask=_flat(inw & (n < lcap), STEP), eviction_policy="evict_last")
        elif ST:
            tl.store(_flat(dl + n * LN, STEP), _flat(_pk(s, start + ofs), STEP), mask=_flat(inw & (n < lcap), STEP))
        cnt += tl.sum(m, axis=0)
    tl.store(dk + lcap * LN + tl.arange(0, LN), cnt.to(tl.int64))


@triton.jit(do_not_specialize=["stride_r", "R", "W", "k", "lcap", "reg_stride"])
def read_kernel(logits, stride_r, starts, ends, prm, reg, R, W, k, lcap, reg_stride, BLOCK: tl.constexpr,
                LN: tl.constexpr, LU: tl.constexpr, LPF: tl.constexpr, EV: tl.constexpr = False,
                SEV: tl.constexpr = False, ST: tl.constexpr = True, REUSE: tl.constexpr = False):
    """Persistent: program g reads rows g, g + G, ...: each bracketed row's window keys
    to its lane region ``reg + r * reg_stride`` (int64 slots, ``lcap`` rows of LN lanes, then
    the lanes' counts)."""
    pid = tl.program_id(0)
    for r in range(pid, R, tl.num_programs(0)):
        L, row, _ = _row_window(r, starts, starts, ends, 1, 1, W, logits, stride_r, logits, k)
        if tl.load(prm + 4 * r + 3) != 0:
            t_hi = tl.load(prm + 4 * r)
            s_base = tl.load(prm + 4 * r + 1)
            sh = tl.load(prm + 4 * r + 2)
            g = reg + ((pid if REUSE else r) + tl.zeros([], tl.int64)) * reg_stride
            if (EV == 0) & (SEV == 0) & ST:
                _lane_pass(row, 0, L, t_hi, s_base, sh, g, lcap, prm, BLOCK, LN, False, False, LU, LPF)
            else:
                _lane_read_x(row, 0, L, t_hi, g, lcap, BLOCK, LN, LU, EV, SEV, ST)


@triton.jit(do_not_specialize=["stride_r", "R", "W", "k", "lcap", "reg_stride", "ws_stride", "cap", "rank_budget",
                               "want_stats"])
def select_kernel(logits, stride_r, starts, ends, out, prm, reg, ws, stats, R, W, k, lcap, reg_stride, ws_stride,
                  cap, rank_budget, want_stats, BLOCK: tl.constexpr, LN: tl.constexpr, NBW: tl.constexpr,
                  RT: tl.constexpr, CT: tl.constexpr, BC: tl.constexpr, BS: tl.constexpr):
    """Persistent: program g settles rows g, g + G, ... from their regions. Its slot of
    ``ws``: NBW window bins (zero between rows), then the bin's keys and columns (``cap``
    each) for the rank. want_stats: stats[r] = (path, window keys): 1 settled from the
    region, 3 the exact fallback (rows of L > k only)."""
    pid = tl.program_id(0)
    slot = ws + pid.to(tl.int64) * ws_stride
    whist = slot
    bk = slot + NBW
    bi = bk + cap
    nb = tl.arange(0, NBW)
    lane = tl.arange(0, LN)
    RR: tl.constexpr = BLOCK // LN
    br = tl.arange(0, RR)[:, None]
    bo = br * LN + lane[None, :]
    for r in range(pid, R, tl.num_programs(0)):
        tl.debug_barrier()  # the last row's reads of the slot finish first
        L, row, out_row = _row_window(r, starts, starts, ends, 1, 1, W, logits, stride_r, out, k)
        if L <= k:
            _trivial(out_row, L, k, BS)
        else:
            ok = tl.load(prm + 4 * r + 3)
            g = reg + (r + tl.zeros([], tl.int64)) * reg_stride
            done = tl.zeros([], tl.int32)
            nwin = tl.zeros([], tl.int32)
            if ok != 0:
                cnt = tl.load(g + lcap * LN + lane).to(tl.int32)
                nwin = tl.sum(cnt)
                if (tl.max(cnt) <= lcap) & (nwin >= k):
                    s_base = tl.load(prm + 4 * r + 1)
                    sh = tl.load(prm + 4 * r + 2)
                    # the window bins, from the region's keys (bin 0: below the base, by difference)
                    lim = cnt[None, :]
                    for j0 in range(0, tl.max(cnt), RR):
                        v = br + j0 < lim
                        w = tl.load(_flat(g + j0 * LN + bo, BLOCK), mask=_flat(v, BLOCK), other=0)
                        _bin_add(whist, w.to(tl.int32), _flat(v, BLOCK), s_base, sh, BLOCK)
                    tl.debug_barrier()
                    hw = tl.load(whist + nb, cache_modifier=".cg")
                    hw += tl.where(nb == 0, nwin - tl.sum(hw), 0)
                    b, bel, cb = _choose(hw, k)
                    need = k - bel
                    take_all = ((sh == 0) | (cb == need)).to(tl.int32)
                    cb64 = cb.to(tl.int64)
                    if (b > 0) & ((take_all != 0) | ((cb <= cap) & (cb64 * cb64 <= rank_budget))):
                        pval = (s_base.to(tl.int64) - INT_MIN + ((b - 1).to(tl.int64) << sh)).to(tl.int32)
                        _lane_emit(g, 0, lcap, -1 << sh, pval, out_row, tl.zeros([], tl.int32),
                                   tl.zeros([], tl.int32), k, need, take_all, bk, bi, cap, BLOCK, LN)
                        if take_all == 0:
                            tl.debug_barrier()  # the bin's keys, stored by any thread, are read by any other
                            _rank_emit(bk, bi, cb, 0, cb, out_row, k - need, need, RT, CT)
                        done = tl.full([], 1, tl.int32)
                    tl.debug_barrier()
                    tl.store(whist + nb, tl.zeros([NBW], tl.int32))
            if done == 0:  # the exact fallback, in place
                tk, quota = _radix_kth(row, L, k, BC)
                tl.debug_barrier()
                _emit_ordered(row, L, out_row, k, tk, tl.zeros([], tl.int32) + INT_MAX, quota, BS)
            if want_stats != 0:
                j = tl.arange(0, 2)
                tl.store(stats + 2 * r + j, tl.where(j == 0, 3 - 2 * done, nwin))
