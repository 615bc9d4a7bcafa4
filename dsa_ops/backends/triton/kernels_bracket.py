"""The bracket of the radix kernel (``kernels_radix``, step 0): the sampled window of the
k-th key, the one read that gathers the window into the program's region of the candidate
buffer, and that region's layout (slots per warp or per lane, packed (key, column) pairs).
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsa_ops.backends.triton.kernels_select import INT_MAX, INT_MIN, _skey, _window


# One returning atomic per warp and four keys a thread (PTX; CUDA only): the lanes' key counts
# are scanned with shuffles, lane 31 adds the warp's total to the counter, and every key gets
# base + its rank in the warp. $0-$3: slots, $4-$7: masks (0 / 1), $8-$11: the counter's address.
_WARP_SLOTS_PTX = tl.constexpr("""{
.reg .u32 wn, wx, wt, wtot, wbase, wlane;
.reg .pred wp, wq;
add.u32 wn, $4, $5;
add.u32 wn, wn, $6;
add.u32 wn, wn, $7;
mov.u32 wx, wn;
shfl.sync.up.b32 wt|wp, wx, 1, 0, 0xffffffff;
@wp add.u32 wx, wx, wt;
shfl.sync.up.b32 wt|wp, wx, 2, 0, 0xffffffff;
@wp add.u32 wx, wx, wt;
shfl.sync.up.b32 wt|wp, wx, 4, 0, 0xffffffff;
@wp add.u32 wx, wx, wt;
shfl.sync.up.b32 wt|wp, wx, 8, 0, 0xffffffff;
@wp add.u32 wx, wx, wt;
shfl.sync.up.b32 wt|wp, wx, 16, 0, 0xffffffff;
@wp add.u32 wx, wx, wt;
shfl.sync.idx.b32 wtot, wx, 31, 31, 0xffffffff;
mov.u32 wlane, %laneid;
setp.eq.u32 wq, wlane, 31;
setp.ne.and.u32 wq, wtot, 0, wq;
mov.u32 wbase, 0;
@wq atom.relaxed.gpu.global.add.u32 wbase, [$8], wtot;
shfl.sync.idx.b32 wbase, wbase, 31, 31, 0xffffffff;
sub.u32 wx, wx, wn;
add.u32 $0, wbase, wx;
add.u32 $1, $0, $4;
add.u32 $2, $1, $5;
add.u32 $3, $2, $6;
}""")


@triton.jit
def _slots(ctr, m, wz, WAGG: tl.constexpr):
    """A slot per key where ``m`` (any order; other lanes' values are arbitrary) from the
    counter ``ctr``. WAGG (CUDA, 4k keys a thread, no replicated layout, every lane of a warp
    here): one atomic per warp and four keys a thread (``_WARP_SLOTS_PTX``); the counter
    gets an L2 request per warp instead of one per key (a profile counted 23.7M atomic
    requests for 23.7M window keys), where the program-uniform ``wz`` holds. Else one relaxed
    atomic per key."""
    if WAGG:
        if wz:
            pc = tl.inline_asm_elementwise(_WARP_SLOTS_PTX, "=r,=r,=r,=r,r,r,r,r,l,l,l,l",
                                           [m.to(tl.int32), (ctr + tl.zeros(m.shape, tl.int32)).to(tl.int64)],
                                           dtype=tl.int32, is_pure=False, pack=4)
        else:
            pc = tl.atomic_add(ctr + tl.zeros(m.shape, tl.int32), 1, mask=m, sem="relaxed")
    else:
        pc = tl.atomic_add(ctr + tl.zeros(m.shape, tl.int32), 1, mask=m, sem="relaxed")
    return pc


@triton.jit
def _pk(s, col):
    """(key, column) as one int64: the column in the high word, the key's bits in the low."""
    return (col.to(tl.int64) << 32) | (s.to(tl.int64) & 0xFFFFFFFF)


@triton.jit
def _put(dk, di, pc, s, col, m, PACK: tl.constexpr):
    """Keys ``s`` and columns at slots ``pc`` where ``m``: one int64 store (``_pk``) at
    ``dk`` viewed as int64 (PACK), or a key store at dk and a column store at di."""
    if PACK:
        tl.store(dk.to(tl.pointer_type(tl.int64)) + pc, _pk(s, col), mask=m)
    else:
        tl.store(dk + pc, s, mask=m)
        tl.store(di + pc, col, mask=m)


@triton.jit
def _ldk(gk, off, v, packed):
    """Keys at ``off`` where ``v``: an int32 array, or the low words of a packed one (``_pk``)."""
    if packed != 0:
        s = tl.load(gk.to(tl.pointer_type(tl.int64)) + off, mask=v, other=0, cache_modifier=".cg").to(tl.int32)
    else:
        s = tl.load(gk + off, mask=v, other=0, cache_modifier=".cg")
    return s


@triton.jit
def _ld2(gk, gi, off, v, packed):
    """Keys and columns at ``off`` where ``v``: two int32 arrays (gk, gi), or where
    ``packed`` != 0 one int64 array at gk (``_pk``; gi unused)."""
    if packed != 0:
        w = tl.load(gk.to(tl.pointer_type(tl.int64)) + off, mask=v, other=0, cache_modifier=".cg")
        s = w.to(tl.int32)
        col = (w >> 32).to(tl.int32)
    else:
        s = tl.load(gk + off, mask=v, other=0, cache_modifier=".cg")
        col = tl.load(gi + off, mask=v, other=0, cache_modifier=".cg")
    return s, col


@triton.jit
def _bracket(row, L, k, SAMP: tl.constexpr, NBW: tl.constexpr):
    """Window of the k-th key from SAMP strided samples of the row, sorted (``tl.sort``:
    a bitonic network in registers and shared memory, no global round trips): the window's
    top is sample rank q + m (``_window``: 4.5 sigma + 2, q the k-th's expected rank).
    Returns the window's top key ``t_hi`` (INT_MAX past the last sample) and the bins: base
    key ``s_base`` aligned to 2^sh, with bin ``1 + (t_hi - s_base) >> sh < NBW`` (bin 0:
    keys below the base). The base is sample rank q - m; when that is below the best
    sample, the window's width below the best sample."""
    st = L // SAMP
    i = tl.arange(0, SAMP)
    srt = tl.sort(_skey(tl.load(row + i * st + st // 2)))
    q = ((k - 1).to(tl.int64) * SAMP // L).to(tl.int32)
    lo, hi = _window(q, tl.zeros([], tl.int32) + SAMP, q < 0)
    lo_key = tl.sum(tl.where(i == tl.maximum(lo, 0), srt, 0))
    t_hi = tl.where(hi < SAMP, tl.sum(tl.where(i == hi, srt, 0)), INT_MAX)
    ulo = lo_key.to(tl.int64) - INT_MIN  # unsigned order as int64
    uhi = t_hi.to(tl.int64) - INT_MIN
    if lo < 0:
        ulo = tl.maximum(ulo - (uhi - ulo), 0)
    d = uhi - ulo
    sh = tl.zeros([], tl.int32)
    while (d >> sh) >= NBW // 2:
        sh += 1
    s_base = (((ulo >> sh) << sh) + INT_MIN).to(tl.int32)
    return t_hi, s_base, sh


@triton.jit
def _bracket_pass(row, lo, hi, s0, x1, t_hi, s_base, sh, dk, di, capp, whist, ctr, wz, BLOCK: tl.constexpr,
                  CATOM: tl.constexpr, PIPE: tl.constexpr, PF: tl.constexpr, BINS: tl.constexpr,
                  WAGG: tl.constexpr, PACK: tl.constexpr):
    """The bracket's one read of [lo, hi): every key up to ``t_hi`` goes to this program's
    region of the buffer (dk, di: ``capp`` slots) and, when at or above ``s_base``, adds one
    to bin ``1 + (key - s_base) >> sh`` of ``whist``. Slots: CATOM, one atomic per such key
    on the program's counter ``ctr`` (any order: no CTA-wide scan or barrier per block);
    otherwise a block cumsum. PIPE (with CATOM): a block's keys are stored one block later,
    so the slot atomics' round trip overlaps the next block. Returns (keys up to t_hi, keys
    below s_base); PF (1 or 2): blocks of loads in flight ahead of the one at work. Slots past
    ``capp`` are not written. ``s0``: the first block's keys, ``x1``: the second block's
    values (loaded early). BINS (CATOM only) = False: no bin atomics (every window key lands in
    bin 0, so the row radixes its gathered keys from the top digit). PACK (the host sets it
    with CATOM only): window keys stored by ``_put``. As in ``_lane_pass``, no key pays a
    bounds test: ``s0`` / ``x1`` and the loads here are the logits' bits with -1 (the worst
    key) past the slice, the window's top is clamped below it, and the next block's loads
    take no mask while it is whole."""
    ar = tl.arange(0, BLOCK)
    rb = row.to(tl.pointer_type(tl.int32))
    t_lim = tl.minimum(t_hi, INT_MAX - 1)
    s = s0
    x = x1
    cnt = tl.zeros([], tl.int32)
    und = tl.zeros([], tl.int32)
    p_pc = tl.zeros([BLOCK], tl.int32)  # PIPE: the previous block's slots, keys, columns
    p_s = tl.zeros([BLOCK], tl.int32)
    p_o = tl.zeros([BLOCK], tl.int32)
    p_in = tl.zeros([BLOCK], tl.int1)
    if PF == 2:
        y = tl.load(rb + lo + 2 * BLOCK + ar, mask=lo + 2 * BLOCK + ar < hi, other=-1)
    for start in range(lo, hi, BLOCK):
        o = start + ar
        if start > lo:
            s = _skey(x)
            if PF == 2:
                x = y
                y = tl.load(rb + o + 2 * BLOCK, mask=o + 2 * BLOCK < hi, other=-1)
            else:
                if start + 2 * BLOCK <= hi:  # the next block is whole: no mask
                    x = tl.load(rb + o + BLOCK)
                else:
                    x = tl.load(rb + o + BLOCK, mask=o + BLOCK < hi, other=-1)
        inw = s <= t_lim
        if BINS | (CATOM == 0):
            _bin_add(whist, s, inw, s_base, sh, BLOCK)
        if CATOM:
            pc = _slots(ctr, inw, wz, WAGG)
            if PIPE:
                _put(dk, di, p_pc, p_s, p_o, p_in & (p_pc < capp), PACK)
                p_pc = pc
                p_s = s
                p_o = o
                p_in = inw
            else:
                _put(dk, di, pc, s, o, inw & (pc < capp), PACK)
        else:
            binned = inw & (s >= s_base)
            n2 = tl.sum(inw.to(tl.int32) + (binned.to(tl.int32) << 16))  # both counts in one reduction
            nc = n2 & 0xFFFF
            if nc > 0:
                pc = cnt + tl.cumsum(inw.to(tl.int32), axis=0) - 1
                _put(dk, di, pc, s, o, inw & (pc < capp), False)
            cnt += nc
            und += nc - (n2 >> 16)
    if CATOM:
        if PIPE:
            _put(dk, di, p_pc, p_s, p_o, p_in & (p_pc < capp), PACK)
        tl.debug_barrier()
        cnt = tl.atomic_add(ctr, 0, sem="relaxed")  # every slot of this program was taken
        und = -1  # the caller derives it from the bins
    return cnt, und


@triton.jit
def _flat(x, N: tl.constexpr):
    """A (BLOCK / LN, LN) tensor as N = BLOCK values in row-major order. The scattered
    atomics and stores take it flat: Triton gives an access whose addresses have no
    contiguity a layout ordered by dimension 0 first, so a 2D one would go through shared
    memory to change layout; the flat view keeps each thread's values where they are."""
    return tl.reshape(x, [N])


@triton.jit
def _lane_pass(row, lo, hi, t_hi, s_base, sh, dk, lcap, whist, BLOCK: tl.constexpr, LN: tl.constexpr,
               BINS: tl.constexpr, PBINS: tl.constexpr, LU: tl.constexpr, LPF: tl.constexpr):
    """The bracket's read with lane regions (no slot atomics). A block is viewed as
    (BLOCK / LN, LN): column ``start + j * LN + i`` belongs to lane i, and every lane owns
    the slots ``i, i + LN, i + 2 LN, ...`` of this program's region at ``dk`` (int64 slots,
    ``_pk`` pairs): its n-th window key goes to slot ``n * LN + i``. A lane's running count
    is one value a lane and its place in a block an exclusive scan along the block's first
    axis, so the slots need no atomic, no shuffle and no memory round trip (with Triton's
    default layout for this shape a lane is one thread and the scan stays in its registers;
    any other layout gives the same slots). Keys whose lane already holds ``lcap`` are
    counted but not stored; row ``lcap`` of the region receives the lanes' counts (the
    readers' validity, ``_lane_ok``). Bins as in ``_bracket_pass``; PBINS (with BINS): not
    in the read but after it, from the region's keys (the read loop then has no atomic at
    all; the keys that fit their lane are counted, so an overflowed region's bins are
    short, which the caller's poison makes moot). A read step takes LU blocks, (LU x BLOCK /
    LN, LN); LPF: the next step's loads are issued before this step is stored (a step in
    flight while one is at work), else each step loads and then waits. Run 41's profile: with
    one block a step the read waits on its loads (long scoreboard), so wide rows take four.
    Addresses are one pointer a thread and step plus immediates (the rows' offsets), which
    keeps ptxas from re-deriving the thread's offsets every block. No key pays a bounds
    test: the loads read the logits' bits, a masked load past the window gives -1 (a NaN
    whose order key, INT_MAX, is the worst there is) and the window's top is clamped below
    INT_MAX, so padding never enters the window; the next step's loads take no mask at all
    while it is whole (748 -> ~570 instructions a step of four blocks, the 128K
    read phase 83 -> 78 µs). Rows whose k-th key is INT_MAX then hold fewer than k window
    keys and take the exact fallback. The loads evict first: the logits are read once, and
    a read of them would otherwise push the programs' regions (stored here, read back by the
    emit) out of L2 (the 128K read phase 78.6 -> 73.3 µs, prefill 4.78 -> 4.61 ms;
    3.94 -> 2.71 ms for the read alone when the regions stay in L2). Returns (window keys,
    largest lane count): the region overflowed where the latter exceeds lcap."""
    R: tl.constexpr = BLOCK // LN
    STEP: tl.constexpr = LU * BLOCK  # keys a read step
    lane = tl.arange(0, LN)[None, :]
    rows = tl.arange(0, STEP // LN)[:, None] * LN  # a thread's keys of a step: constants after its lane
    ofs = rows + lane
    dl = dk + lane  # lane i's slot 0
    cnt = tl.zeros([LN], tl.int32)
    # The logits' bits; past the window a load gives -1 (the bits of a NaN whose order key
    # is INT_MAX, the worst), and the window's top is clamped below that, so the window test
    # alone keeps those out. (A row whose k-th key is INT_MAX then has fewer than k window
    # keys: the exact fallback.)
    rb = row.to(tl.pointer_type(tl.int32))
    t_lim = tl.minimum(t_hi, INT_MAX - 1)
    if LPF:
        x = tl.load((rb + lo + lane) + rows, mask=ofs < hi - lo, other=-1, eviction_policy="evict_first")
    for start in range(lo, hi, STEP):
        # Addresses: one pointer a thread and step ((row + start) + lane), plus the rows'
        # offsets, which are immediates; masks compare the offsets with one scalar.
        rem = hi - start
        if LPF:
            s = _skey(x)
            if rem >= 2 * STEP:  # the next step is whole: no mask (no compare, no fill a key)
                x = tl.load((rb + (start + STEP) + lane) + rows, eviction_policy="evict_first")
            else:
                x = tl.load((rb + (start + STEP) + lane) + rows, mask=ofs < rem - STEP, other=-1,
                            eviction_policy="evict_first")
        else:
            s = _skey(tl.load((rb + start + lane) + rows, mask=ofs < rem, other=-1, eviction_policy="evict_first"))
        inw = s <= t_lim
        if BINS & (PBINS == 0):
            _bin_add(whist, s, inw, s_base, sh, STEP)
        m = inw.to(tl.int32)
        n = cnt[None, :] + tl.cumsum(m, axis=0) - m
        tl.store(_flat(dl + n * LN, STEP), _flat(_pk(s, start + ofs), STEP),
                 mask=_flat(inw & (n < lcap), STEP))
        cnt += tl.sum(m, axis=0)
    tl.store(dk + lcap * LN + tl.arange(0, LN), cnt.to(tl.int64))
    if BINS & PBINS:
        tl.debug_barrier()  # the region's keys, stored by any thread, are read by any other
        nr = tl.minimum(tl.max(cnt), lcap)
        br = tl.arange(0, R)[:, None]
        bo = br * LN + lane
        lim = tl.minimum(cnt, lcap)[None, :]
        v = br < lim
        w = tl.load(_flat(dk + bo, BLOCK), mask=_flat(v, BLOCK), other=0, cache_modifier=".cg")
        for j0 in range(0, nr, R):
            vn = br + j0 + R < lim
            wn = tl.load(_flat(dk + j0 * LN + BLOCK + bo, BLOCK), mask=_flat(vn, BLOCK), other=0, cache_modifier=".cg")
            _bin_add(whist, w.to(tl.int32), _flat(v, BLOCK), s_base, sh, BLOCK)
            w = wn
            v = vn
    return tl.sum(cnt), tl.max(cnt)


@triton.jit
def _bin_add(whist, s, m, s_base, sh, BLOCK: tl.constexpr):
    """Each key ``s`` of a block where ``m`` and at or above ``s_base`` adds one to its
    window bin ``1 + (s - s_base) >> sh`` of ``whist`` (taken flat, ``_flat``)."""
    d = ((s.to(tl.uint32, bitcast=True) - s_base.to(tl.uint32, bitcast=True)) >> sh.to(tl.uint32)).to(tl.int32)
    tl.atomic_add(_flat(whist + 1 + d, BLOCK), 1, mask=_flat(m & (s >= s_base), BLOCK), sem="relaxed")


@triton.jit
def _lane_ok(gk, off, v, lbase, lcap, LN: tl.constexpr):
    """Readers of a region of ``_lane_pass`` (``lcap`` > 0; 0: a contiguous region, ``v``
    unchanged): int64 slot ``off`` of gk holds a key where its row is below its lane's
    count (row lcap of the region at ``lbase``). LN = 0: no lane regions in this build."""
    if LN > 0:
        if lcap > 0:
            rel = off - lbase
            n = tl.load(gk.to(tl.pointer_type(tl.int64)) + lbase + lcap * LN + rel % LN, mask=v, other=0)
            v = v & ((rel // LN).to(tl.int64) < n)
    return v
