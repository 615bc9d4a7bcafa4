"""Triton bodies shared by the ``triton`` backend's kernels: row windows and the L <= k
write (both kernels), order keys, exact small ranks,
sample splitters, passes over the (key, column) arrays of the workspace, and the exact
fallback (4-bit radix counting over the row, then an index-ordered emission).

Arrays hold (key, column) pairs; "composite" order is (key, column), a strict total order
whose first k elements are the reference's stable choice. Every pass says what it reads
and writes; none reads a logit at or past the row's live length.
"""

from __future__ import annotations

import triton
import triton.language as tl

INT_MIN = tl.constexpr(-2147483648)
INT_MAX = tl.constexpr(2147483647)
MAXIT = tl.constexpr(16)  # level cap; each level keeps ~1/20 of its set on real data


@triton.jit
def _skey(x):
    """fp32 -> signed int32 order key (smaller = better), contract §1.1."""
    b = x.to(tl.int32, bitcast=True)
    return b ^ (~(b >> 31) | INT_MIN)


@triton.jit
def _row_window(r, lens, starts, ends, next_n, is_prefill, W, logits, stride_r, out, k):
    """Row r's live length L and its logits / out row pointers, from the device lengths.

    Decode: L = lens[r // next_n] - next_n + 1 + r % next_n, computed in int64 so that lengths
    near INT_MIN cannot wrap; prefill: window [s, e). Both clamped to [0, W] (branch-free,
    masked loads); the logits pointer starts at the window.
    """
    pf = is_prefill != 0
    s_raw = tl.load(starts + r, mask=pf, other=0)
    e_raw = tl.load(ends + r, mask=pf, other=0)
    # int64: a request length near INT_MIN minus the draft offset must not wrap to ~2^31.
    l_raw = tl.load(lens + r // next_n, mask=is_prefill == 0, other=0).to(tl.int64) - next_n + 1 + r % next_n
    s0 = tl.where(pf, tl.minimum(tl.maximum(s_raw, 0), W), 0)
    e0 = tl.minimum(tl.maximum(e_raw, 0), W)
    l_dec = tl.minimum(tl.maximum(l_raw, 0), W).to(tl.int32)
    L = tl.where(pf, tl.maximum(e0 - s0, 0), l_dec)
    r64 = r + tl.zeros([], tl.int64)  # the loop index is a Python int in the interpreter
    return L, logits + r64 * stride_r + s0, out + r64 * k


@triton.jit
def _trivial(out_row, L, k, BS: tl.constexpr):
    """L <= k: out = 0, 1, ..., L-1, then -1; reads no logits."""
    ar = tl.arange(0, BS)
    for s in range(0, k, BS):
        o = s + ar
        tl.store(out_row + o, tl.where(o < L, o, -1), mask=o < k)


@triton.jit
def _lt(k1, i1, k2, i2):
    """Composite (key, column) strict less-than."""
    return (k1 < k2) | ((k1 == k2) & (i1 < i2))


@triton.jit
def _rank_part(k, i, ck, ci, cv):
    """How many of the valid columns (ck, ci) are below each element (k, i): an M x CH compare.

    Ranks are built from column chunks re-read from memory (L1 hits) rather than one M x M
    tensor, which would need ~255 registers a thread at M = 128.
    """
    less = _lt(ck[None, :], ci[None, :], k[:, None], i[:, None]) & cv[None, :]
    return tl.sum(less.to(tl.int32), axis=1)


@triton.jit
def _pick(rank, v, k, i, t):
    """(key, column) of the valid elements whose rank is t[j], for each j."""
    sel = (rank[:, None] == t[None, :]) & v[:, None]
    pk = tl.sum(tl.where(sel, k[:, None], 0), axis=0)
    pi = tl.sum(tl.where(sel, i[:, None], 0), axis=0)
    return pk, pi


@triton.jit
def _window(q, ns, exact):
    """Sample-rank window [q - m, q + m] that brackets the target w.h.p. (4.5 sigma + 2)."""
    qf = q.to(tl.float32)
    nf = ns.to(tl.float32)
    var = tl.maximum(qf * (1.0 - qf / nf), 0.0)
    m = (4.5 * tl.sqrt(var) + 2.0).to(tl.int32)
    m = tl.where(exact, 0, m)
    return q - m, q + m


@triton.jit
def _splitters(sk, si, rank, v, ns, q, exact):
    """16 splitters spread over the window, plus the window's two ends (as flags)."""
    lo, hi = _window(q, ns, exact)
    a = tl.maximum(lo, 0)
    c = tl.minimum(hi, ns - 1)
    j = tl.arange(0, 16)
    t = a + (j * (c - a)) // 15
    pk, pi = _pick(rank, v, sk, si, t)
    return pk, pi, lo >= 0, hi <= ns - 1


@triton.jit
def _row_pivots(row, L, k, NS: tl.constexpr, CH: tl.constexpr):
    """Reads NS strided values of [0, L); returns t_lo, t_hi and 16 splitter keys."""
    i = tl.arange(0, NS)
    ns = tl.minimum(L, NS)
    v = i < ns
    pos = ((i.to(tl.int64) * L) // ns).to(tl.int32)
    key = _skey(tl.load(row + pos, mask=v, other=0.0))
    rank = tl.zeros([NS], tl.int32)
    for c in tl.static_range(NS // CH):
        cx = c * CH + tl.arange(0, CH)
        cv = cx < ns
        cpos = ((cx.to(tl.int64) * L) // ns).to(tl.int32)
        ck = _skey(tl.load(row + cpos, mask=cv, other=0.0))
        rank += _rank_part(key, pos, ck, cpos, cv)
    q = ((k - 1) * ns) // L
    u, _, has_lo, has_hi = _splitters(key, pos, rank, v, ns, q, ns == L)
    j = tl.arange(0, 16)
    t_lo = tl.where(has_lo, tl.sum(tl.where(j == 0, u, 0)), INT_MIN)
    t_hi = tl.where(has_hi, tl.sum(tl.where(j == 15, u, 0)), INT_MAX)
    return t_lo, t_hi, u


@triton.jit
def _count_pass(sk_ptr, si_ptr, n, pk, pi, BC: tl.constexpr, KEY_ONLY: tl.constexpr):
    """Reads an array of n (key, column); counts elements below each of 16 splitters.

    KEY_ONLY: the splitters are bare keys (column INT_MIN), so columns are neither read nor
    compared (a third of the work of the composite compare).
    """
    ar = tl.arange(0, BC)
    acc = tl.zeros([16], tl.int32)
    ck = tl.load(sk_ptr + ar, mask=ar < n, other=0, cache_modifier=".cg")
    ci = ck
    if not KEY_ONLY:
        ci = tl.load(si_ptr + ar, mask=ar < n, other=0, cache_modifier=".cg")
    for s in range(0, n, BC):
        o = s + ar
        v = o < n
        on = o + BC  # prefetch the next block: one L2 round trip per pass, not per block
        ckn = tl.load(sk_ptr + on, mask=on < n, other=0, cache_modifier=".cg")
        if KEY_ONLY:
            lt = (ck[:, None] < pk[None, :]) & v[:, None]
        else:
            cin = tl.load(si_ptr + on, mask=on < n, other=0, cache_modifier=".cg")
            lt = _lt(ck[:, None], ci[:, None], pk[None, :], pi[None, :]) & v[:, None]
            ci = cin
        acc += tl.sum(lt.to(tl.int32), axis=0)
        ck = ckn
    return acc


@triton.jit
def _bucket(acc, n, need, pk, pi, lok, loi, hik, hii):
    """Bucket of the need-th element from the splitter counts: (below, top, bounds)."""
    j = tl.arange(0, 16)
    b = tl.sum((acc < need).to(tl.int32))
    below = tl.sum(tl.where(j == b - 1, acc, 0))
    top = tl.where(b == 16, n, tl.sum(tl.where(j == b, acc, 0)))
    lbk = tl.where(b == 0, lok, tl.sum(tl.where(j == b - 1, pk, 0)))
    lbi = tl.where(b == 0, loi, tl.sum(tl.where(j == b - 1, pi, 0)))
    ubk = tl.where(b == 16, hik, tl.sum(tl.where(j == b, pk, 0)))
    ubi = tl.where(b == 16, hii, tl.sum(tl.where(j == b, pi, 0)))
    return below, top, lbk, lbi, ubk, ubi


@triton.jit
def _split_pass(sk_ptr, si_ptr, n, lbk, lbi, ubk, ubi, dk, di, out_row, opos, lim, BS: tl.constexpr):
    """Reads an array once: elements below the bucket -> out[opos...] (unless stable), elements
    in [lb, ub) -> the array (dk, di) in order."""
    ar = tl.arange(0, BS)
    rb = tl.zeros([], tl.int32)
    rm = tl.zeros([], tl.int32)
    ckn = tl.load(sk_ptr + ar, mask=ar < n, other=0, cache_modifier=".cg")
    cin = tl.load(si_ptr + ar, mask=ar < n, other=0, cache_modifier=".cg")
    for s in range(0, n, BS):
        o = s + ar
        v = o < n
        ck = ckn
        ci = cin
        on = o + BS  # prefetch the next block
        ckn = tl.load(sk_ptr + on, mask=on < n, other=0, cache_modifier=".cg")
        cin = tl.load(si_ptr + on, mask=on < n, other=0, cache_modifier=".cg")
        below = v & _lt(ck, ci, lbk, lbi)
        inb = v & (~below) & _lt(ck, ci, ubk, ubi)
        pb = opos + rb + tl.cumsum(below.to(tl.int32), axis=0) - 1
        tl.store(out_row + pb, ci, mask=below & (pb < lim))
        pm = rm + tl.cumsum(inb.to(tl.int32), axis=0) - 1
        tl.store(dk + pm, ck, mask=inb)
        tl.store(di + pm, ci, mask=inb)
        rb += tl.sum(below.to(tl.int32))
        rm += tl.sum(inb.to(tl.int32))
    return rb, rm


@triton.jit
def _level_splitters(sk_ptr, si_ptr, n, need, MF: tl.constexpr, CH: tl.constexpr):
    """Reads MF evenly spaced entries of an array of n > MF; 16 composite splitters."""
    i = tl.arange(0, MF)
    pos = ((i.to(tl.int64) * n) // MF).to(tl.int32)
    v = i < MF
    sk = tl.load(sk_ptr + pos)  # arrays this program wrote: L1 is coherent for them
    si = tl.load(si_ptr + pos)
    rank = tl.zeros([MF], tl.int32)
    for c in tl.static_range(MF // CH):
        cx = c * CH + tl.arange(0, CH)
        cpos = ((cx.to(tl.int64) * n) // MF).to(tl.int32)
        rank += _rank_part(sk, si, tl.load(sk_ptr + cpos), tl.load(si_ptr + cpos), cx < MF)
    q = ((need - 1).to(tl.int64) * MF // n).to(tl.int32)
    pk, pi, _, _ = _splitters(sk, si, rank, v, tl.zeros([], tl.int32) + MF, q, n == 0)
    return pk, pi


@triton.jit
def _final(sk_ptr, si_ptr, n, need, out_row, opos, lim, MF: tl.constexpr, CH: tl.constexpr):
    """Reads <= MF entries; exact ranks; winners -> out[opos + rank]; returns the need-th."""
    o = tl.arange(0, MF)
    v = o < n
    ck = tl.load(sk_ptr + o, mask=v, other=0)  # arrays this program wrote: L1 is coherent for them
    ci = tl.load(si_ptr + o, mask=v, other=0)
    rank = tl.zeros([MF], tl.int32)
    for c in tl.static_range(MF // CH):
        cx = c * CH + tl.arange(0, CH)
        cv = cx < n
        rank += _rank_part(ck, ci, tl.load(sk_ptr + cx, mask=cv, other=0), tl.load(si_ptr + cx, mask=cv, other=0), cv)
    tl.store(out_row + opos + rank, ci, mask=v & (rank < tl.minimum(need, lim)))
    t = tl.zeros([2], tl.int32) + (need - 1)
    tk, ti = _pick(rank, v, ck, ci, t)
    return tl.max(tk, axis=0), tl.max(ti, axis=0)


@triton.jit
def _copy(src, n, dst, BS: tl.constexpr):
    """dst[:n] = src[:n] (int32)."""
    ar = tl.arange(0, BS)
    for s in range(0, n, BS):
        o = s + ar
        v = o < n
        tl.store(dst + o, tl.load(src + o, mask=v, other=0, cache_modifier=".cg"), mask=v)


@triton.jit
def _radix_kth(row, L, k, BC: tl.constexpr):
    """Exact k-th key of row[:L] by eight 4-bit counting reads; returns (key, ties to take)."""
    ar = tl.arange(0, BC)
    j = tl.arange(0, 16)
    prefix = tl.zeros([], tl.int32)
    rem = tl.zeros([], tl.int32) + k
    for p in tl.static_range(8):
        acc = tl.zeros([16], tl.int32)
        for s in range(0, L, BC):
            o = s + ar
            v = o < L
            uk = _skey(tl.load(row + o, mask=v, other=0.0)) ^ INT_MIN  # unsigned-order bits
            if p == 0:
                match = v
            else:
                match = v & (((uk ^ prefix) >> (32 - 4 * p)) == 0)
            d = (uk >> (28 - 4 * p)) & 15
            acc += tl.sum(((d[:, None] == j[None, :]) & match[:, None]).to(tl.int32), axis=0)
        cum = tl.cumsum(acc, axis=0)
        dsel = tl.sum((cum < rem).to(tl.int32))
        rem = rem - tl.sum(tl.where(j < dsel, acc, 0))
        prefix = prefix | (dsel << (28 - 4 * p))
    return prefix ^ INT_MIN, rem


@triton.jit
def _emit_ordered(row, L, out_row, k, tk, ti, quota, BS: tl.constexpr):
    """Reads row[:L] in order; writes columns with (key < tk) or (key == tk, column <= ti, among
    the first ``quota`` such ties) to out in ascending order: the stable result."""
    ar = tl.arange(0, BS)
    pos = tl.zeros([], tl.int32)
    tc = tl.zeros([], tl.int32)
    s = tl.zeros([], tl.int32)
    while (s < L) & (pos < k):
        o = s + ar
        v = o < L
        key = _skey(tl.load(row + o, mask=v, other=0.0))
        eq = v & (key == tk) & (o <= ti)
        tr = tc + tl.cumsum(eq.to(tl.int32), axis=0) - 1
        take = (v & (key < tk)) | (eq & (tr < quota))
        p = pos + tl.cumsum(take.to(tl.int32), axis=0) - 1
        tl.store(out_row + p, o, mask=take & (p < k))
        pos += tl.sum(take.to(tl.int32))
        tc += tl.sum(eq.to(tl.int32))
        s += BS


