"""Cooperative radix select: the ``triton`` backend's decode kernel (and its row mode).

Row r of live length L > k is split over ``n_act`` programs (contiguous slices of whole
blocks, in index order). Order keys (contract §1.1) as signed int32, smaller = better; the
radix works on ``u = skey ^ INT_MIN`` whose *unsigned* order is the same.

0. Bracket (non-stable rows of L >= ``br_min`` > 0; the host picks br_min >= 4 x SAMP, see
   ``radix_launch.bracket_min_len``). Every
   program reads the same SAMP strided samples of the row and sorts them; sample rank
   q + m (q the k-th's expected rank, m = 4.5 sigma + 2) gives the window's top key
   t_hi, and rank q - m (or, past the best sample, the window's width below it) the base
   of NBW bins of 2^sh keys each. One read of the slice then sends every key <= t_hi to the
   program's region of the candidate buffer (slots from a per-program atomic counter, no
   CTA-wide scan; on CUDA one atomic per warp and four keys a thread; key and column stored
   as one int64: ``kernels_bracket``; or, LANES > 0, lane regions: each lane of a block
   owns strided slots, counted in registers, no atomic) and counts it in its bin of the
   row's window histogram (bin 0: keys below the base; counted in the read or, PBINS,
   after it from the region). After one barrier every program picks the bin of the
   k-th key; that bin is a prefix of the key bits, so steps 1-3 continue on the gathered
   keys (usually with a bin of a few keys: straight to the rank). Exact fallbacks: the
   k-th below the base (bin 0) radixes all gathered keys from the top digit; fewer than k
   keys up to t_hi, or a full region, runs steps 1-3 on the row as if there were no bracket.
1. Digit passes of DBITS bits (default 8: four passes of 256 bins), most significant
   first. The first pass (and any pass where more than ``sparse_max`` keys of the row still
   match the prefix) histograms each program's keys with ``tl.histogram``; with more than
   one program per row the program adds its histogram to the row's global one (one masked
   vector atomic) and waits at a row barrier. Later passes are sparse: each key that still
   matches adds one to its bin of the row's global histogram (a relaxed atomic), since on
   Triton 3.6 ``tl.histogram`` costs the same ballots for every key, matching or not.
   Every program then reads the same histogram and picks the same bin: the first whose
   running count reaches ``need`` (how many of the k are still to be found). A slice of
   one block stays in registers across the passes; longer slices re-read (L2) with a
   one-block prefetch.
2. Gather (``fuse``, non-stable, slices longer than one block, at most ``cand_cap / 2``
   matching keys): the sparse pass's read also writes the definite winners (prefix below
   the bin) to ``out`` and the matching keys to the candidate buffer; later passes, the
   rank and the take-whole then read only the gathered keys, each program its share.
3. Early exit (non-stable only): once the chosen bin holds ``cb`` keys with
   ``cb * cb <= rank_budget * n_act`` (and cb <= the candidate buffer), one more read
   (of the row, or of the gathered keys) writes the definite winners to ``out`` and the
   bin's keys to a candidate buffer; after a barrier the programs split the candidates and
   rank each one exactly against all of them ((key, column) order); rank < need goes to
   ``out[k - need + rank]``. After the last pass (or when the bin is taken whole) the
   bin's keys are taken directly, first come first served (ties: any conforming choice).
4. ``stable=True``: all passes give the exact k-th key T and how many ties q to keep; each
   program counts its winners / ties, a barrier shares the counts, and one read in index
   order emits the reference's bytes (ties: smallest columns; ascending columns).

Barriers are spin waits on a per-row arrival counter; they are safe because the host
launches at most ``per_sm`` programs per multiprocessor in split mode with registers capped
so that they all fit (all co-resident), and a single program per row otherwise (its
barrier never waits). The program that finishes a row last restores the row's histograms,
window bins, counters and per-program counts to zero, so replays need no memset.
Workspace per slot (int32): [0, 12288) histograms (passes x bins), [12288, 12304)
counters, [12304, 12816) per-program counts (stable) and slot counters (bracket),
[12816, 14864) window bins, then the candidate keys and columns (``cand_cap`` each; gathers
use the first half, the rank's bin the second half; the bracket's packed regions fill the
key array as ``cand_cap / 2`` int64, and the rank's bin then goes to the column array's
two halves).
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsa_ops.backends.triton.kernels_bracket import _bracket, _bracket_pass, _flat, _lane_ok, _lane_pass, _ld2, _ldk
from dsa_ops.backends.triton.kernels_select import INT_MIN, _rank_part, _row_window, _skey, _trivial

HIST = tl.constexpr(0)  # up to 3 x 4096 bins (12-bit digits) or 4 x 256 (8-bit)
CTL = tl.constexpr(12288)  # [0] arrivals, [1] winner slots, [2] taken-bin slots, [3] done
PCNT = tl.constexpr(12304)  # 2 x PMAX (256) per-program counts (stable)
WHIST = tl.constexpr(12816)  # NBW bins of the bracket's window (room for NBW_MAX), then the candidate keys and columns
NBW_MAX = tl.constexpr(2048)  # the candidate buffer starts after this many window bins, whatever a launch's NBW


@triton.jit
def _barrier(ctr, target):
    """Row barrier: arrive, then spin until ``target`` arrivals (cumulative per launch).
    (Acquire loads as polls, which save the final acquire atomic, measured no faster on the
    H200: the wait is for the slowest program, not the way out.)"""
    tl.debug_barrier()  # every thread's writes of this program precede the arrival
    seen = tl.atomic_add(ctr, 1, sem="release") + 1
    while seen < target:  # poll with plain L2 loads: RMW polling would queue behind arrivals
        seen = tl.load(ctr, volatile=True)
    seen = tl.atomic_add(ctr, 0, sem="acquire")  # acquire: the others' writes are visible
    tl.debug_barrier()


@triton.jit
def _hist_block(s, v, pmask, pval, shift, NB: tl.constexpr, HMASK: tl.constexpr):
    """NB-bin histogram of digit ``(u >> shift) & (NB - 1)`` over valid keys with ``u & pmask == pval``.

    Triton lowers ``tl.histogram`` to one shared-memory atomic per element, so lanes that do
    not count must not pile onto one bin: they are masked out (``HMASK``, Triton >= 3.3's
    ``mask=``) or spread over NB spare bins that are dropped."""
    u = s ^ INT_MIN
    m = v & ((u & pmask) == pval)
    d = (u >> shift) & (NB - 1)
    if HMASK:
        h = tl.histogram(d, NB, mask=m)
    else:
        lane = tl.arange(0, s.shape[0]) & (NB - 1)
        h2 = tl.reshape(tl.histogram(tl.where(m, d, NB + lane), 2 * NB), (2, NB))
        h = tl.sum(tl.where(tl.arange(0, 2)[:, None] == 0, h2, 0), axis=0)
    return h


@triton.jit
def _hist_pass(row, lo, hi, s0, pmask, pval, shift, BLOCK: tl.constexpr, NB: tl.constexpr, HMASK: tl.constexpr):
    """Histogram of the slice [lo, hi); its first block's keys ``s0`` are already loaded (a
    slice of one block is read once for every pass); later blocks are prefetched."""
    ar = tl.arange(0, BLOCK)
    h = _hist_block(s0, lo + ar < hi, pmask, pval, shift, NB, HMASK)
    x = tl.load(row + lo + BLOCK + ar, mask=lo + BLOCK + ar < hi, other=0.0)
    for start in range(lo + BLOCK, hi, BLOCK):
        o = start + ar
        xn = tl.load(row + o + BLOCK, mask=o + BLOCK < hi, other=0.0)
        h += _hist_block(_skey(x), o < hi, pmask, pval, shift, NB, HMASK)
        x = xn
    return h


@triton.jit
def _atomic_pass(row, lo, hi, s0, pmask, pval, shift, ghist, BLOCK: tl.constexpr, NB: tl.constexpr):
    """Sparse pass: every key of [lo, hi) that matches the prefix adds one to its digit's
    bin of the row's global histogram ``ghist`` (one relaxed atomic per matching key, no
    ``tl.histogram``). The caller takes this path only when few keys match."""
    ar = tl.arange(0, BLOCK)
    s = s0
    x = tl.load(row + lo + BLOCK + ar, mask=lo + BLOCK + ar < hi, other=0.0)
    for start in range(lo, hi, BLOCK):
        o = start + ar
        if start > lo:
            s = _skey(x)
            x = tl.load(row + o + BLOCK, mask=o + BLOCK < hi, other=0.0)
        u = s ^ INT_MIN
        m = (o < hi) & ((u & pmask) == pval)
        tl.atomic_add(ghist + ((u >> shift) & (NB - 1)), 1, mask=m, sem="relaxed")


@triton.jit
def _choose(hh, need):
    """Bin holding the need-th key of the row's histogram -> (bin, keys below it, keys in it)."""
    bins = tl.arange(0, hh.shape[0])
    cum = tl.cumsum(hh, axis=0)
    b = tl.sum((cum < need).to(tl.int32))
    below = tl.sum(tl.where(bins < b, hh, 0))
    cb = tl.sum(tl.where(bins == b, hh, 0))
    return b, below, cb


@triton.jit
def _sides(s, v, pmask, pval):
    """Keys ``s`` where ``v`` against the chosen prefix ``pval`` (bits ``pmask``): the
    winners (prefix below it) and the bin's keys (prefix equal to it)."""
    mu = ((s ^ INT_MIN) & pmask) ^ INT_MIN  # prefix compared in signed order
    pv = pval ^ INT_MIN
    return v & (mu < pv), v & (mu == pv)


@triton.jit
def _put_bin(s, col, cand, pc, out_row, k, need, take_all, dk, di, cap):
    """The bin's keys ``cand`` at slots ``pc``: their columns to out's [k - need, k) while
    they last (take_all), else keys and columns to (dk, di) below ``cap``."""
    if take_all != 0:
        tl.store(out_row + (k - need) + pc, col, mask=cand & (pc < need))
    else:
        tl.store(dk + pc, s, mask=cand & (pc < cap))
        tl.store(di + pc, col, mask=cand & (pc < cap))


@triton.jit
def _split_block(s, col, v, pmask, pval, out_row, bctr, ctl, k, need, take_all, dk, di, cap):
    """One block of a split: keys with prefix below pval (winners) -> out at atomic slots
    of ctl[1]; keys in the bin -> out at slots [k - need, k) of ``bctr`` while they last
    (take_all) or the buffer (dk, di) at slots below ``cap``. Returns the block's bin mask."""
    win, cand = _sides(s, v, pmask, pval)
    nwc = tl.sum(win.to(tl.int32) + (cand.to(tl.int32) << 16))  # both counts in one reduction
    nw = nwc & 0xFFFF
    nc = nwc >> 16
    if nw > 0:
        bw = tl.atomic_add(ctl + 1, nw, sem="relaxed")
        tl.store(out_row + bw + tl.cumsum(win.to(tl.int32), axis=0) - 1, col, mask=win)
    if nc > 0:
        bc = tl.atomic_add(bctr, nc, sem="relaxed")
        pc = bc + tl.cumsum(cand.to(tl.int32), axis=0) - 1
        _put_bin(s, col, cand, pc, out_row, k, need, take_all, dk, di, cap)
    return cand


@triton.jit
def _split_at(s, col, v, pmask, pval, out_row, bw, bc, k, need, take_all, dk, di, cap):
    """``_split_block`` for a row's only program, at running slots instead of atomics:
    winners -> out from slot ``bw``, the bin's keys from slot ``bc`` (of [k - need, k) while
    they last when take_all, else of (dk, di) below ``cap``). One scan counts both (chunks
    under 65536 keys). Returns the chunk's (winners, bin keys)."""
    win, cand = _sides(s, v, pmask, pval)
    both = tl.cumsum(win.to(tl.int32) + (cand.to(tl.int32) << 16), axis=0)
    tl.store(out_row + bw + (both & 0xFFFF) - 1, col, mask=win)
    _put_bin(s, col, cand, bc + (both >> 16) - 1, out_row, k, need, take_all, dk, di, cap)
    tot = tl.max(both)  # (both counts only grow)
    return tot & 0xFFFF, tot >> 16


@triton.jit
def _split_run(gk, gi, off, idx, lim, end, pmask, pval, out_row, bw, bc, k, need, take_all, dk, di, cap, packed,
               STEP: tl.constexpr):
    """``_split_at`` over the keys (gk, gi) at ``off + c0`` for c0 in [0, end) by STEP, a lane
    valid while ``idx + c0 < lim``, the next step prefetched; ``bw`` / ``bc``: the running
    slots to start from (``packed``: see ``_ld2``). Returns them after the last step."""
    v = idx < lim
    s, col = _ld2(gk, gi, off, v, packed)
    for c0 in range(0, end, STEP):
        vn = idx + c0 + STEP < lim
        sn, coln = _ld2(gk, gi, off + c0 + STEP, vn, packed)
        nw, nc = _split_at(s, col, v, pmask, pval, out_row, bw, bc, k, need, take_all, dk, di, cap)
        bw += nw
        bc += nc
        s = sn
        col = coln
        v = vn
    return bw, bc


@triton.jit
def _emit_pass(row, lo, hi, s0, pmask, pval, out_row, ctl, k, need, take_all, cand_k, cand_i, cap,
               shift, ghist, count, BLOCK: tl.constexpr, NB: tl.constexpr):
    """``_split_block`` over the row slice [lo, hi) (bin slots of ctl[2]); where
    (count != 0, never with take_all) each key of the bin also adds one to its next digit's
    bin of ``ghist`` (digit at ``shift``)."""
    ar = tl.arange(0, BLOCK)
    s = s0
    x = tl.load(row + lo + BLOCK + ar, mask=lo + BLOCK + ar < hi, other=0.0)
    for start in range(lo, hi, BLOCK):
        o = start + ar
        if start > lo:
            s = _skey(x)
            x = tl.load(row + o + BLOCK, mask=o + BLOCK < hi, other=0.0)
        cand = _split_block(s, o, o < hi, pmask, pval, out_row, ctl + 2, ctl, k, need, take_all, cand_k,
                            cand_i, cap)
        if count != 0:
            tl.atomic_add(ghist + (((s ^ INT_MIN) >> shift) & (NB - 1)), 1, mask=cand, sem="relaxed")


@triton.jit
def _region_emit(gk, gi, capp, cnts, n_reg, pmask, pval, out_row, k, need, take_all, c2k, c2i, cap,
                 T: tl.constexpr):
    """The finisher's one pass over the bracket's regions (region j: ``cnts[j]`` keys at
    [j * capp, ...) of gk / gi; at most 32 regions, T / 32 keys of each per step): keys with
    prefix below pval -> out (slots from 0), keys in the bin -> out at [k - need, k) while
    they last (take_all) or (c2k, c2i) from slot 0. One program: running offsets, no atomics."""
    e = tl.arange(0, T)
    j = e // (T // 32)
    c = e % (T // 32)
    jj = tl.arange(0, 32)
    cj = tl.minimum(tl.load(cnts + jj, mask=jj < n_reg, other=0, cache_modifier=".cg"), capp)
    cnt = tl.minimum(tl.load(cnts + j, mask=j < n_reg, other=0, cache_modifier=".cg"), capp)
    _split_run(gk, gi, j * capp + c, c, cnt, tl.max(cj), pmask, pval, out_row, tl.zeros([], tl.int32),
               tl.zeros([], tl.int32), k, need, take_all, c2k, c2i, cap, 0, T // 32)


@triton.jit
def _buf_count(cand_k, q0, q1, pmask, pval, shift, ghist, packed, lcap, RB: tl.constexpr, NB: tl.constexpr,
               LN: tl.constexpr):
    """Sparse pass over the gathered keys [q0, q1) of the candidate buffer (``packed``: see
    ``_ldk``; lcap > 0: lane regions, see ``_lane_ok``): each key that matches the prefix
    adds one to its digit's bin of ``ghist``."""
    r = tl.arange(0, RB)
    for start in range(q0, q1, RB):
        o = start + r
        v = _lane_ok(cand_k, o, o < q1, q0, lcap, LN)
        u = _ldk(cand_k, o, v, packed) ^ INT_MIN
        m = v & ((u & pmask) == pval)
        tl.atomic_add(ghist + ((u >> shift) & (NB - 1)), 1, mask=m, sem="relaxed")


@triton.jit
def _lane_emit(gk, lbase, lcap, pmask, pval, out_row, bw, bc, k, need, take_all, dk, di, cap, BLOCK: tl.constexpr,
               LN: tl.constexpr):
    """``_split_run`` for the lane regions of ``_lane_pass`` at int64 slot ``lbase`` of gk:
    tiles of (BLOCK / LN rows, LN lanes) from row 0 to the fullest lane's count, a slot valid
    below its lane's count (the counts read once into registers; no lookup a key), taken
    flat (``_flat``), the next tile prefetched. Returns the running slots."""
    R: tl.constexpr = BLOCK // LN
    rows = tl.arange(0, R)[:, None]
    ofs = rows * LN + tl.arange(0, LN)[None, :]
    g = gk.to(tl.pointer_type(tl.int64)) + lbase
    cnt = tl.minimum(tl.load(g + lcap * LN + tl.arange(0, LN), cache_modifier=".cg").to(tl.int32), lcap)
    lim = cnt[None, :]
    v = rows < lim
    w = tl.load(_flat(g + ofs, BLOCK), mask=_flat(v, BLOCK), other=0, cache_modifier=".cg")
    for j0 in range(0, tl.max(cnt), R):
        vn = rows + (j0 + R) < lim
        wn = tl.load(_flat(g + (j0 + R) * LN + ofs, BLOCK), mask=_flat(vn, BLOCK), other=0, cache_modifier=".cg")
        nw, nc = _split_at(w.to(tl.int32), (w >> 32).to(tl.int32), _flat(v, BLOCK), pmask, pval, out_row, bw, bc, k,
                           need, take_all, dk, di, cap)
        bw += nw
        bc += nc
        w = wn
        v = vn
    return bw, bc


@triton.jit
def _buf_emit(cand_k, cand_i, q0, q1, pmask, pval, out_row, ctl, k, need, take_all, c2k, c2i, cap, solo, packed,
              lcap, RB: tl.constexpr, LN: tl.constexpr, BLOCK: tl.constexpr):
    """``_split_block`` over the gathered keys [q0, q1): the bin's keys get the slots of
    ctl[4] and go to the second buffer (c2k, c2i) unless taken whole. ``solo`` (the row's
    only program): running slot counts in registers (read from ctl[1] / ctl[4] once, written
    back at the end) and the next chunk prefetched, instead of two dependent atomics a chunk.
    ``packed``: see ``_ld2``; lcap > 0: lane regions (``_lane_ok``)."""
    r = tl.arange(0, RB)
    if solo != 0:
        tl.debug_barrier()  # every warp's earlier slot atomics are done
        bw = tl.load(ctl + 1, cache_modifier=".cg")
        bc = tl.load(ctl + 4, cache_modifier=".cg")
        lanes = tl.zeros([], tl.int32)
        if LN > 0:  # (a build with lane regions)
            lanes = (lcap > 0).to(tl.int32)
            if lanes != 0:
                bw, bc = _lane_emit(cand_k, q0, lcap, pmask, pval, out_row, bw, bc, k, need, take_all, c2k, c2i,
                                    cap, BLOCK, LN)
        if lanes == 0:
            bw, bc = _split_run(cand_k, cand_i, q0 + r, q0 + r, q1, q1 - q0, pmask, pval, out_row, bw, bc, k, need,
                                take_all, c2k, c2i, cap, packed, RB)
        tl.debug_barrier()
        tl.store(ctl + 1, bw)
        tl.store(ctl + 4, bc)
    else:
        for start in range(q0, q1, RB):
            o = start + r
            v = _lane_ok(cand_k, o, o < q1, q0, lcap, LN)
            s, col = _ld2(cand_k, cand_i, o, v, packed)
            _split_block(s, col, v, pmask, pval, out_row, ctl + 4, ctl, k, need, take_all, c2k, c2i, cap)


@triton.jit
def _rank_emit(cand_k, cand_i, cb, c0, c1, out_row, base, need, RT: tl.constexpr, CT: tl.constexpr):
    """Exact (key, column) rank of candidates [c0, c1) among all cb; rank < need -> out.
    cb <= CT (the usual case): all cb columns are loaded once and the row tiles are
    prefetched one ahead; otherwise the column tiles are prefetched one ahead."""
    rt = tl.arange(0, RT)
    ct = tl.arange(0, CT)
    if cb <= CT:  # one column tile (the usual case): load it once, prefetch the row tiles
        jv = ct < cb
        jk = tl.load(cand_k + ct, mask=jv, other=0, cache_modifier=".cg")
        jx = tl.load(cand_i + ct, mask=jv, other=0, cache_modifier=".cg")
        tk = tl.load(cand_k + c0 + rt, mask=c0 + rt < c1, other=0, cache_modifier=".cg")
        tx = tl.load(cand_i + c0 + rt, mask=c0 + rt < c1, other=0, cache_modifier=".cg")
        for t0 in range(c0, c1, RT):
            tv = t0 + rt < c1
            nv = t0 + RT + rt < c1
            nk = tl.load(cand_k + t0 + RT + rt, mask=nv, other=0, cache_modifier=".cg")
            nx = tl.load(cand_i + t0 + RT + rt, mask=nv, other=0, cache_modifier=".cg")
            rank = _rank_part(tk, tx, jk, jx, jv)
            tl.store(out_row + base + rank, tx, mask=tv & (rank < need))
            tk = nk
            tx = nx
    else:
        for t0 in range(c0, c1, RT):
            ti = t0 + rt
            tv = ti < c1
            tk = tl.load(cand_k + ti, mask=tv, other=0, cache_modifier=".cg")
            tx = tl.load(cand_i + ti, mask=tv, other=0, cache_modifier=".cg")
            rank = tl.zeros([RT], tl.int32)
            jk = tl.load(cand_k + ct, mask=ct < cb, other=0, cache_modifier=".cg")
            jx = tl.load(cand_i + ct, mask=ct < cb, other=0, cache_modifier=".cg")
            for j0 in range(0, cb, CT):
                jn = j0 + CT + ct
                nk = tl.load(cand_k + jn, mask=jn < cb, other=0, cache_modifier=".cg")
                nx = tl.load(cand_i + jn, mask=jn < cb, other=0, cache_modifier=".cg")
                jv = j0 + ct < cb
                rank += _rank_part(tk, tx, jk, jx, jv)
                jk = nk
                jx = nx
            tl.store(out_row + base + rank, tx, mask=tv & (rank < need))


@triton.jit
def _stable_emit(row, lo, hi, tkey, q, out_row, ctl, pcnt, s_idx, n_act, nb,
                 BLOCK: tl.constexpr, PMAX: tl.constexpr):
    """Index-ordered emission of {key < T} + the first q columns with key == T."""
    ar = tl.arange(0, BLOCK)
    nw = tl.zeros([], tl.int32)
    nt = tl.zeros([], tl.int32)
    for start in range(lo, hi, BLOCK):
        o = start + ar
        v = o < hi
        s = _skey(tl.load(row + o, mask=v, other=0.0))
        nw += tl.sum((v & (s < tkey)).to(tl.int32))
        nt += tl.sum((v & (s == tkey)).to(tl.int32))
    tl.store(pcnt + 2 * s_idx, nw)
    tl.store(pcnt + 2 * s_idx + 1, nt)
    _barrier(ctl, n_act * (nb + 1))
    pp = tl.arange(0, PMAX)
    lower = pp < s_idx
    bw = tl.sum(tl.load(pcnt + 2 * pp, mask=lower, other=0, cache_modifier=".cg"))
    bt = tl.sum(tl.load(pcnt + 2 * pp + 1, mask=lower, other=0, cache_modifier=".cg"))
    pos = bw + tl.minimum(bt, q)  # selected columns before this slice
    trank = bt  # ties before the current block
    for start in range(lo, hi, BLOCK):
        o = start + ar
        v = o < hi
        s = _skey(tl.load(row + o, mask=v, other=0.0))
        tie = v & (s == tkey)
        tr = trank + tl.cumsum(tie.to(tl.int32), axis=0) - 1
        sel = (v & (s < tkey)) | (tie & (tr < q))
        p = pos + tl.cumsum(sel.to(tl.int32), axis=0) - 1
        tl.store(out_row + p, o, mask=sel)
        pos += tl.sum(sel.to(tl.int32))
        trank += tl.sum(tie.to(tl.int32))


@triton.jit
def _tick(stats, r, i, me, TIMING: tl.constexpr):
    """TIMING (CUDA probes only): the program that reports for row r (``me``) stores the
    global timer (ns, low 32 bits: comparable across multiprocessors) at stats[r, 2 + i],
    after every warp of the program got here."""
    if TIMING:
        if me != 0:
            tl.debug_barrier()
            c = tl.inline_asm_elementwise("mov.u32 $0, %globaltimer_lo;", "=r,r", [me], dtype=tl.int32, is_pure=False,
                                          pack=1)
            tl.store(stats + 10 * r + 2 + i, c)


@triton.jit(do_not_specialize=["stride_r", "R", "W", "k", "next_n", "n_slices", "is_prefill", "stable",
                               "cand_cap", "ws_stride", "min_slice", "rank_budget", "sparse_max", "fuse",
                               "br_min", "want_stats", "finisher", "solo_emit", "wagg_max"])
def radix_kernel(logits, stride_r, lens, starts, ends, out, ws, stats,
                 R, W, k, next_n, n_slices, is_prefill, stable, cand_cap, ws_stride, min_slice, rank_budget,
                 sparse_max, fuse, br_min, want_stats, finisher, solo_emit, wagg_max,
                 BLOCK: tl.constexpr, RT: tl.constexpr, CT: tl.constexpr, PMAX: tl.constexpr,
                 HMASK: tl.constexpr, DBITS: tl.constexpr, NB: tl.constexpr, RB: tl.constexpr,
                 SAMP: tl.constexpr, NBW: tl.constexpr, CATOM: tl.constexpr = True, PIPE: tl.constexpr = False,
                 PF: tl.constexpr = 1, BINS: tl.constexpr = True, WAGG: tl.constexpr = False,
                 PACK: tl.constexpr = False, LANES: tl.constexpr = 0, PBINS: tl.constexpr = False,
                 LU: tl.constexpr = 1, LPF: tl.constexpr = True, TIMING: tl.constexpr = False):
    """Grid (G0, n_slices). n_slices > 1: G0 = R, program (r, s) owns slice s of row r and
    slot r. n_slices = 1: program g loops over rows g, g + G0, ... with slot g.
    want_stats: ``stats[r] = (path, window keys)``, path 0 no bracket, 1 bracket, 2 bracket
    then the whole window from the top digit, 3 bracket missed (exact fallback)."""
    tl.static_assert((PACK == 0) | (CATOM != 0), "PACK needs CATOM (the host clears it otherwise)")
    tl.static_assert((LANES == 0) | (PACK != 0), "LANES needs PACK (the host clears it otherwise)")
    tl.static_assert(NBW <= NBW_MAX, "NBW bins must fit the workspace's window region")
    pid0 = tl.program_id(0)
    s_idx = tl.program_id(1)
    g0 = tl.num_programs(0)
    slot = ws + pid0.to(tl.int64) * ws_stride
    ctl = slot + CTL
    pcnt = slot + PCNT
    whist = slot + WHIST
    cand_k = whist + NBW_MAX  # (not + NBW: a launch with fewer bins would leave keys where a later one counts)
    cand_i = cand_k + cand_cap
    half = cand_cap // 2
    bins = tl.arange(0, NB)
    ar = tl.arange(0, BLOCK)
    for r in range(pid0, R, g0):
        tl.debug_barrier()  # row mode reuses the slot: the last row's reads finish first
        L, row, out_row = _row_window(r, lens, starts, ends, next_n, is_prefill, W, logits, stride_r, out, k)
        if L <= k:
            if s_idx == 0:
                _trivial(out_row, L, k, BLOCK)
        else:
            sl = tl.maximum(tl.cdiv(tl.cdiv(L, n_slices), BLOCK) * BLOCK, min_slice)
            n_act = tl.cdiv(L, sl)
            n_row = n_act  # programs of the row (n_act: programs still at work on it)
            brk = (br_min > 0) & (stable == 0) & (L >= br_min)  # the row starts with the bracket
            lo = s_idx * sl
            if lo < L:
                hi = tl.minimum(lo + sl, L)
                need = k
                pmask = tl.zeros([], tl.int32)
                pval = tl.zeros([], tl.int32)
                cb = L
                nb = tl.zeros([], tl.int32)  # barriers passed
                p = tl.zeros([], tl.int32)  # passes made (histogram slot)
                rem = tl.zeros([], tl.int32) + 32  # low key bits not yet fixed by the prefix
                go = tl.full([], 1, tl.int32)
                buf = tl.zeros([], tl.int32)  # 1 / 2: the matching keys are gathered in the candidate buffer (2: packed)
                q0 = tl.zeros([], tl.int32)  # this program's share [q0, q1) of the gathered keys
                q1 = tl.zeros([], tl.int32)
                gofs = tl.zeros([], tl.int32)  # gathered keys at this offset of the buffer, the rank's bin at the other half
                lcap = tl.zeros([], tl.int32)  # > 0: the gathered keys are in lane regions of lcap rows (_lane_pass)
                lc = tl.zeros([], tl.int32)
                alive = tl.full([], 1, tl.int32)  # 0: a finisher took the row over
                me = (s_idx == 0).to(tl.int32)  # reports the row's stats
                _tick(stats, r, 0, me, TIMING)
                # first block, kept (as bits: past the slice -1, the worst key, see _bracket_pass)
                key0 = _skey(tl.load(row.to(tl.pointer_type(tl.int32)) + lo + ar, mask=lo + ar < hi, other=-1))
                if brk:
                    # one read: every key up to the sampled window's top -> this program's region
                    # of the buffer, binned; then the k-th key's bin is a prefix of the gathered keys
                    if LANES == 0:
                        x1 = tl.load(row.to(tl.pointer_type(tl.int32)) + lo + BLOCK + ar, mask=lo + BLOCK + ar < hi,
                                     other=-1)  # in flight meanwhile
                    t_hi, s_base, sh = _bracket(row, L, k, SAMP, NBW)
                    _tick(stats, r, 1, me, TIMING)
                    capp = half // n_act
                    if LANES:
                        capp = capp // LANES * LANES  # whole lane rows
                    q0 = s_idx * capp
                    if LANES:
                        lc = capp // LANES - 1  # rows of the lane regions (row lc: the lanes' counts)
                        cnt, mx = _lane_pass(row, lo, hi, t_hi, s_base, sh, cand_k.to(tl.pointer_type(tl.int64)) + q0,
                                             lc, whist, BLOCK, LANES, BINS, PBINS, LU, LPF)
                        q1 = q0 + tl.minimum(mx, lc) * LANES
                        cnt = tl.where(mx > lc, capp + 1, cnt)  # a full lane: the region overflowed
                        und = tl.full([], -1, tl.int32)
                    else:
                        cnt, und = _bracket_pass(row, lo, hi, key0, x1, t_hi, s_base, sh,
                                                 cand_k + (2 * q0 if PACK else q0), cand_i + q0, capp,
                                                 whist, pcnt + s_idx, L < wagg_max, BLOCK, CATOM, PIPE, PF, BINS, WAGG,
                                                 PACK)
                        q1 = q0 + tl.minimum(cnt, capp)
                    tl.atomic_add(ctl + 6, tl.where(cnt > capp, 1 << 24, cnt), sem="relaxed")  # overflow: poison
                    if und >= 0:
                        tl.atomic_add(whist, und, sem="relaxed")
                    _tick(stats, r, 2, me, TIMING)
                    fin = (finisher != 0) & (n_act >= 16) & (n_act <= 32)
                    if fin:  # no barrier: the last program to arrive finishes the row alone
                        tl.debug_barrier()
                        alive = (tl.atomic_add(ctl + 7, 1, sem="acq_rel") == n_act - 1).to(tl.int32)
                        me = alive
                    else:
                        nb += 1
                        _barrier(ctl, n_act * nb)
                    _tick(stats, r, 3, me, TIMING)
                    if alive != 0:
                        nwin = tl.load(ctl + 6, cache_modifier=".cg")
                        hw = tl.load(whist + tl.arange(0, NBW), cache_modifier=".cg")  # (with nwin: one round trip)
                        if CATOM:  # bin 0 (keys below the base) was not counted: the rest of the window
                            hw += tl.where(tl.arange(0, NBW) == 0, nwin - tl.sum(hw), 0)
                        path = tl.full([], 3, tl.int32)
                        if (nwin >= k) & (nwin < (1 << 24)):
                            b, bel, cb = _choose(hw, k)
                            buf = tl.full([], 2 if PACK else 1, tl.int32)  # 2: packed (no finisher)
                            lcap = lc
                            path = tl.full([], 2, tl.int32)
                            if b == 0:  # the k-th is below the base: radix the gathered keys from the top digit
                                cb = nwin
                            else:
                                path = tl.full([], 1, tl.int32)
                                need -= bel
                                pval = (s_base.to(tl.int64) - INT_MIN + ((b - 1).to(tl.int64) << sh)).to(tl.int32)
                                pmask = -1 << sh
                                rem = sh
                            if fin:  # one pass over every region: winners -> out, the bin -> second half
                                take = ((rem == 0) | (cb == need)).to(tl.int32)
                                _region_emit(cand_k, cand_i, capp, pcnt, n_act, pmask, pval, out_row, k, need, take,
                                             cand_k + half, cand_i + half, half, BLOCK)
                                if take != 0:
                                    alive = tl.zeros([], tl.int32)
                                else:  # later winners take the slots after the k - need written here
                                    tl.store(ctl + 1, k - need)
                                    tl.debug_barrier()
                                gofs = half  # the bin's keys are now the gathered ones
                                q0 = tl.zeros([], tl.int32)
                                q1 = cb
                        else:  # missed (fewer than k keys up to t_hi) or a region overflowed: the exact path
                            q0 = tl.zeros([], tl.int32)
                            q1 = tl.zeros([], tl.int32)
                            if fin:  # alone: the whole row
                                lo = tl.zeros([], tl.int32)
                                hi = L
                                sl = L
                                key0 = _skey(tl.load(row + ar, mask=ar < L, other=0.0))
                        if fin:
                            n_act = tl.full([], 1, tl.int32)
                            s_idx = tl.zeros([], tl.int32)
                        if (want_stats != 0) & (me != 0):
                            tl.store(stats + (10 if TIMING else 2) * r + tl.arange(0, 2),
                                     tl.where(tl.arange(0, 2) == 0, path, nwin))
                    _tick(stats, r, 4, me, TIMING)
                # digit passes (the first over the row; after a gather, over the buffer)
                cb64 = cb.to(tl.int64)
                small = (cb <= cand_cap) & (cb64 * cb64 <= rank_budget * n_act.to(tl.int64))
                go = ((alive != 0) & (rem > 0) & ((stable != 0) | ((cb != need) & (small == 0)))).to(tl.int32)
                while go != 0:
                    shift = tl.maximum(rem - DBITS, 0)  # 12-bit: 20, 8, 0 (overlap already fixed)
                    ghist = slot + HIST + NB * p
                    if buf != 0:  # later passes count the gathered keys only
                        _buf_count(cand_k + gofs, q0, q1, pmask, pval, shift, ghist, buf == 2, lcap, RB, NB, LANES)
                        nb += 1
                        _barrier(ctl, n_act * nb)
                        h = tl.load(ghist + bins, cache_modifier=".cg")
                    elif ((p > 0) & (cb <= sparse_max) & (fuse != 0) & (stable == 0) & (cb <= half)
                          & (sl > BLOCK)):
                        # one read: winners -> out, the cb matching keys -> buffer + next digit's counts
                        # (slices of one block keep their keys in registers: re-reading them is free)
                        _emit_pass(row, lo, hi, key0, pmask, pval, out_row, ctl, k, need, 0, cand_k, cand_i,
                                   half, shift, ghist, 1, BLOCK, NB)
                        buf = tl.full([], 1, tl.int32)
                        per = tl.cdiv(cb, n_act)
                        q0 = tl.minimum(s_idx * per, cb)
                        q1 = tl.minimum(q0 + per, cb)
                        nb += 1
                        _barrier(ctl, n_act * nb)
                        h = tl.load(ghist + bins, cache_modifier=".cg")
                    elif (p > 0) & (cb <= sparse_max):  # few keys match: atomics, not tl.histogram
                        _atomic_pass(row, lo, hi, key0, pmask, pval, shift, ghist, BLOCK, NB)
                        nb += 1
                        _barrier(ctl, n_act * nb)  # also orders the atomics before the read (row mode)
                        h = tl.load(ghist + bins, cache_modifier=".cg")
                    else:
                        h = _hist_pass(row, lo, hi, key0, pmask, pval, shift, BLOCK, NB, HMASK)
                        if n_act > 1:
                            tl.atomic_add(ghist + bins, h, mask=h != 0, sem="relaxed")
                            nb += 1
                            _barrier(ctl, n_act * nb)
                            h = tl.load(ghist + bins, cache_modifier=".cg")
                    b, below, cb = _choose(h, need)
                    need -= below
                    pval = pval | (b << shift)
                    pmask = pmask | ((NB - 1) << shift)
                    rem = shift
                    p += 1
                    cb64 = cb.to(tl.int64)
                    small = (cb <= cand_cap) & (cb64 * cb64 <= rank_budget * n_act.to(tl.int64))
                    go = ((rem > 0) & ((stable != 0) | ((cb != need) & (small == 0)))).to(tl.int32)
                _tick(stats, r, 5, me, TIMING)
                if (alive != 0) & (stable != 0):
                    # all passes ran: pval is the k-th key (as u); keep `need` of its ties
                    _stable_emit(row, lo, hi, pval ^ INT_MIN, need, out_row, ctl, pcnt, s_idx, n_act, nb,
                                 BLOCK, PMAX)
                    nb += 1
                elif alive != 0:
                    take_all = ((rem == 0) | (cb == need)).to(tl.int32)
                    rk = cand_k  # where the bin's keys end up for the rank
                    ri = cand_i
                    if buf != 0:
                        rk = cand_k + (half - gofs)
                        ri = cand_i + (half - gofs)
                        if buf == 2:  # the packed keys fill cand_k: the bin goes to cand_i's two halves
                            rk = cand_i
                            ri = cand_i + half
                        _buf_emit(cand_k + gofs, cand_i + gofs, q0, q1, pmask, pval, out_row, ctl, k, need, take_all, rk, ri,
                                  half, (n_act == 1) & (solo_emit != 0), buf == 2, lcap, RB, LANES, BLOCK)
                    else:
                        _emit_pass(row, lo, hi, key0, pmask, pval, out_row, ctl, k, need, take_all, cand_k,
                                   cand_i, cand_cap, 0, ctl, 0, BLOCK, NB)
                    _tick(stats, r, 6, me, TIMING)
                    if take_all == 0:
                        nb += 1
                        _barrier(ctl, n_act * nb)
                        per = tl.cdiv(cb, n_act)
                        c0 = s_idx * per
                        _rank_emit(rk, ri, cb, c0, tl.minimum(c0 + per, cb), out_row, k - need, need, RT, CT)
                # the last program of the row to finish restores the zeros
                _tick(stats, r, 7, me, TIMING)
                tl.debug_barrier()
                done = tl.atomic_add(ctl + 3, 1, sem="acq_rel")
                if done == n_row - 1:
                    for z in range(0, ((32 + DBITS - 1) // DBITS) * NB, 1024):
                        tl.store(slot + HIST + z + tl.arange(0, 1024), tl.zeros([1024], tl.int32))
                    tl.store(ctl + tl.arange(0, 16), tl.zeros([16], tl.int32))
                    if brk:
                        for z in range(0, NBW, 1024):
                            tl.store(whist + z + tl.arange(0, 1024), tl.zeros([1024], tl.int32))
                    tl.store(pcnt + tl.arange(0, 2 * PMAX), tl.zeros([2 * PMAX], tl.int32))  # counts, slot counters
