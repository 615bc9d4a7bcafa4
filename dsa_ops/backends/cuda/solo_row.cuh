// dsa_ops backend `cuda`: one row selected by one CTA (solo_row), and the parts of it that
// split.cu's leader reuses (sample_tau, keep4, warp_reserve, finish_row). topk.cu (a short row,
// by CTA 0 alone), solo.cu (one CTA a row) and split.cu (the leader's finish) include it.
// Design: docs/cuda-kernel.md §4.2.
//
// - A row of L <= buf keys is kept whole in shared memory (direct): one read.
// - A longer row is sampled first (SAMPLE keys spread over [0, L), twice as many past
//   SAMPLE_LONG, four times past 2 x SAMPLE_LONG); the sample sets a bound tau on the keys
//   such that, very likely,
//   k <= #{keys <= tau} <= buf / 2. The one read of the row keeps those keys with their
//   columns. If fewer than k or more than buf / 2 were
//   kept, the row falls back to digit passes over global memory (up to four more reads), so
//   the result never depends on the data, only the time does.
// - The select runs on the kept keys: 11 + 11 + 10 bit digits, stopping as soon as the
//   chosen bin is taken whole.
// - stable (ordered): winners are marked in two column bitmaps (keys < T; keys == T) and
//   emitted in column order, ties lowest column first: the stable bytes.
// - not stable: each winner takes a slot from a shared count as the kept keys are read once
//   more (emit_any); no bitmaps, no ordered scan (the plans of stable=False have no bitmaps:
//   the sample-missed fallback emits while it reads the row once more, emit_any_row).

#pragma once

#include "common.cuh"

enum : int { SAMPLE = 1024 };  // sample keys (a multiple of NT)
enum : int { SAMPLE_LONG = 262144 };  // rows longer than this take twice as many sample keys (past twice this: four times)
enum : int { SIGMAS = 3 };  // the bound's margin, in standard deviations of the sample count
enum : u32 { TAKE_ALL = 0xFFFFFFFFu };

// Zero the four bins [4t, 4t + 4) this thread read in choose_bin_a2a (no other thread reads them).
__device__ __forceinline__ void clear_own(u32* h) {
    *reinterpret_cast<uint4*>(h + 4 * threadIdx.x) = make_uint4(0u, 0u, 0u, 0u);
}

// The first of the n slots this thread takes from *cnt: one inclusive warp scan, and one
// atomic from lane 31 for the whole warp (cl: a cluster-scope atomic, for the leader's count
// that other CTAs of the cluster add to too). Called by whole warps.
__device__ __forceinline__ u32 warp_reserve(u32 n, u32* cnt, bool cl) {
    const u32 lane = threadIdx.x & 31;
    u32 incl = n;
#pragma unroll
    for (int s = 1; s < 32; s <<= 1) {
        const u32 y = __shfl_up_sync(0xFFFFFFFFu, incl, s);
        if (lane >= (u32)s) incl += y;
    }
    u32 p = 0;
    if (lane == 31) p = cl ? atomic_add_cluster(cnt, incl) : atomicAdd(cnt, incl);
    return __shfl_sync(0xFFFFFFFFu, p, 31) + incl - n;
}

// Keep the keys of four hits a..d (columns i..i+3) at slots reserved by warp_reserve (cl as
// there); every slot past cap is counted but not written. h (unless null) counts the kept
// keys' first digits.
__device__ __forceinline__ void keep4(u32 a, u32 b, u32 c, u32 d, uint4 q, int i, u32* bkey, u32* bcol, u32 cap,
                                      u32* h, u32* cnt, bool cl = false) {
    const u32 n = a + b + c + d;
    if (__ballot_sync(0xFFFFFFFFu, n != 0) == 0) return;
    u32 p = warp_reserve(n, cnt, cl);
    const u32 key[4] = {q.x, q.y, q.z, q.w}, hit[4] = {a, b, c, d};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        if (hit[u]) {
            if (p < cap) {
                bkey[p] = key[u];
                bcol[p] = (u32)(i + u);
                if (h != nullptr) atomicAdd(h + (key[u] >> 21), 1u);
            }
            ++p;
        }
    }
}

// f(key) for the n kept keys (ROW false) or every key of the row [0, L) (ROW true).
template <bool ROW, class F>
__device__ __forceinline__ void each_key(const float* __restrict__ x, int L, const u32* bkey, int n, F&& f) {
    if (ROW) {
        visit_global(x, 0, L, [&](int, bool ok, u32 key) {
            if (ok) f(key);
        });
    } else {
        visit_stage(bkey, n, [&](int, u32 key) { f(key); });
    }
}

// The k-th key T of the keys counted in h (first digits; see each_key for which keys), and
// how many keys equal to T win (`need`, TAKE_ALL when the last bin chosen is taken whole).
// h2 must be zero; h and h2 are left dirty.
template <bool ROW>
__device__ __forceinline__ void select_keys(u32* h, u32* h2, Scalars& sc, const float* __restrict__ x, int L,
                                            const u32* bkey, int n, u32& T, u32& need) {
    choose_bin_a2a(h, 1, 0, sc, false);
    const u32 b1 = sc.bin;
    if (sc.binsz == sc.kr) {
        T = (b1 << 21) | 0x1FFFFFu;
        need = TAKE_ALL;
        return;
    }
    each_key<ROW>(x, L, bkey, n, [&](u32 key) {
        if ((key >> 21) == b1) atomicAdd(h2 + ((key >> 10) & 0x7FFu), 1u);
    });
    __syncthreads();
    choose_bin_a2a(h2, 1, 0, sc, false);
    const u32 p2 = (b1 << 11) | sc.bin;
    if (sc.binsz == sc.kr) {
        T = (p2 << 10) | 0x3FFu;
        need = TAKE_ALL;
        return;
    }
    clear_own(h);
    __syncthreads();
    each_key<ROW>(x, L, bkey, n, [&](u32 key) {
        if ((key >> 10) == p2) atomicAdd(h + (key & 0x3FFu), 1u);
    });
    __syncthreads();
    choose_bin_a2a(h, 1, 0, sc, false);
    T = (p2 << 10) | sc.bin;
    need = sc.kr;
}

// The bound tau of the keys a sampled row keeps (TAKE_ALL when the row is too short to
// sample): S keys at evenly spread columns of [0, L) (S = SAMPLE, 2 x SAMPLE for rows longer
// than SAMPLE_LONG, 4 x SAMPLE past 2 x SAMPLE_LONG: a sample key stands for at most 256
// columns up to L = 1M, so that a row keeps at most about 5K keys there, mean + 4.4 standard
// deviations inside the 10240 kept keys of the 9-16-row plan); about k * S / L of them are
// expected at or below the row's k-th key, and tau is the top of the
// 22-bit prefix of the sample key at that rank plus SIGMAS (3) standard deviations and 4. A
// pure function of the row (every CTA that calls it on the same row gets the same tau). h2
// must be zero and is left zero; sc.kr is k again after the caller's next barrier.
// SK: sample keys a thread, at most (S <= SK * NT). issued(): called by every thread once
// the sample's loads are issued (before their values are used) or, for a row not sampled, at
// once: the split kernel starts its slice's bulk copies there, behind the sample's loads.
struct NoOp {
    __device__ __forceinline__ void operator()() const {}
};
template <int SK, bool ISSUE = false, class F = NoOp>
__device__ __forceinline__ u32 sample_tau_of(const float* __restrict__ x, int L, int S, int k, u32* h2, Scalars& sc,
                                             F&& issued = NoOp()) {
    u32 tau = TAKE_ALL;
    const u32 mean = (u32)(((i64)k * S + L - 1) / L);
    const u32 want = mean + (u32)(SIGMAS * sqrtf((float)mean)) + 4u;
    if (want >= (u32)S) issued();
    if (want < (u32)S) {
        u32 sk[SK];
        if (ISSUE) {  // all loads issued first, then issued(), then their counts
            float sv[SK];
#pragma unroll
            for (int u = 0; u < SK; ++u) {
                const i64 j = (i64)threadIdx.x + u * NT;
                sv[u] = j < S ? __ldg(x + ((2 * j + 1) * L) / (2 * S)) : 0.f;
            }
            issued();
#pragma unroll
            for (int u = 0; u < SK; ++u) {
                const i64 j = (i64)threadIdx.x + u * NT;
                sk[u] = 0u;
                if (j < S) {
                    sk[u] = order_key(sv[u]);
                    atomicAdd(h2 + (sk[u] >> 21), 1u);
                }
            }
        } else {  // each load's count as it arrives (topk_solo)
#pragma unroll
            for (int u = 0; u < SK; ++u) {
                const i64 j = (i64)threadIdx.x + u * NT;
                sk[u] = 0u;
                if (j < S) {
                    sk[u] = order_key(__ldg(x + ((2 * j + 1) * L) / (2 * S)));
                    atomicAdd(h2 + (sk[u] >> 21), 1u);
                }
            }
        }
        if (threadIdx.x == 0) sc.kr = want;
        __syncthreads();
        choose_bin_a2a(h2, 1, 0, sc, false);
        const u32 bs = sc.bin;
        clear_own(h2);
        __syncthreads();
#pragma unroll
        for (int u = 0; u < SK; ++u)
            if (u * NT + (int)threadIdx.x < S && (sk[u] >> 21) == bs) atomicAdd(h2 + ((sk[u] >> 10) & 0x7FFu), 1u);
        __syncthreads();
        choose_bin_a2a(h2, 1, 0, sc, false);
        tau = (bs << 21) | (sc.bin << 10) | 0x3FFu;
        clear_own(h2);
        if (threadIdx.x == 0) sc.kr = (u32)k;  // read after the caller's next barrier
    }
    return tau;
}

// The fourfold sample is a separate instantiation, so that rows of L <= 2 x SAMPLE_LONG keep
// the loop of two keys a thread (one loop of four keys a thread for every row made the
// shorter rows slower).
template <bool ISSUE = false, class F = NoOp>
__device__ __forceinline__ u32 sample_tau(const float* __restrict__ x, int L, int k, u32* h2, Scalars& sc,
                                          F&& issued = NoOp()) {
    if (L > 2 * SAMPLE_LONG)
        return sample_tau_of<4 * SAMPLE / NT, ISSUE>(x, L, 4 * SAMPLE, k, h2, sc, issued);
    return sample_tau_of<2 * SAMPLE / NT, ISSUE>(x, L, L > SAMPLE_LONG ? 2 * SAMPLE : SAMPLE, k, h2, sc, issued);
}

// The bits [8u, 8u + 8) (U = 8) or [32u, 32u + 32) (U = 32) of bitmap m.
template <int U>
__device__ __forceinline__ u32 unit_bits(const u32* m, int u) {
    return U == 32 ? m[u] : (m[u >> 2] >> ((u & 3) * 8)) & 0xFFu;
}

// Ordered emission from the bitmaps of the row's nw words: thread t owns a run of bytes
// (short rows, so that every thread has some) or of words, counts its winners, one block
// scan places its first one, and it writes them in column order.
template <int U>
__device__ __forceinline__ void emit_units(const u32* blt, const u32* beq, int nu, u32 need, int* __restrict__ orow,
                                           Scalars& sc) {
    const int per = (nu + NT - 1) / NT;
    const int a = min((int)threadIdx.x * per, nu), b = min(a + per, nu);
    u32 nl = 0, ne = 0;
    int u0 = a;
    if (U == 32 && (a & 3) == 0) {  // 16-byte loads: 2-way bank conflicts, not 8-way, at 8 words a thread
        for (; u0 + 4 <= b; u0 += 4) {
            const uint4 l = *reinterpret_cast<const uint4*>(blt + u0), e = *reinterpret_cast<const uint4*>(beq + u0);
            nl += __popc(l.x) + __popc(l.y) + __popc(l.z) + __popc(l.w);
            ne += __popc(e.x) + __popc(e.y) + __popc(e.z) + __popc(e.w);
        }
    }
    for (int u = u0; u < b; ++u) {
        nl += __popc(unit_bits<U>(blt, u));
        ne += __popc(unit_bits<U>(beq, u));
    }
    u32 lt_b = nl, eq_b = ne;
    block_scan2(lt_b, eq_b, sc.wsum);
    if (nl == 0 && (ne == 0 || eq_b >= need)) return;
    for (int u = a; u < b; ++u) {
        const u32 ml = unit_bits<U>(blt, u);
        u32 all = ml | unit_bits<U>(beq, u);
        while (all) {
            const int bit = __ffs(all) - 1;
            all &= all - 1;
            const int col = u * U + bit;
            if ((ml >> bit) & 1u) {
                orow[lt_b + min(eq_b, need)] = col;
                ++lt_b;
            } else {
                if (eq_b < need) orow[lt_b + eq_b] = col;
                ++eq_b;
            }
        }
    }
}

__device__ __forceinline__ void emit_bitmaps(const u32* blt, const u32* beq, int nw, u32 need,
                                             int* __restrict__ orow, Scalars& sc) {
    if (nw < NT) emit_units<8>(blt, beq, 4 * nw, need, orow, sc);
    else emit_units<32>(blt, beq, nw, need, orow, sc);
}

// Unordered emission (stable=False): winners take output slots in any order. Keys < T take
// slots [0, nlt) and the first `need` keys == T to reserve a slot take [nlt, nlt + need)
// (nlt = k - need; need = TAKE_ALL: every key <= T wins, nlt = k and no key counts as
// equal). sc.slot must be zero before the first call.
//
// emit4: this thread's winners among four columns c: ml / me (bit u) mark c's key u as < T /
// == T. One warp scan of the packed counts (at most 4 + 4 a thread, 128 a warp: 16 bits
// each) and one shared atomic a counter a warp reserve the slots. Called by whole warps.
__device__ __forceinline__ void emit4(u32 ml, u32 me, uint4 c, u32 nlt, u32 need, int* __restrict__ orow,
                                      Scalars& sc) {
    if (__ballot_sync(0xFFFFFFFFu, (ml | me) != 0) == 0) return;
    const u32 lane = threadIdx.x & 31, own = (u32)__popc(ml) | (u32)__popc(me) << 16;
    u32 incl = own;
#pragma unroll
    for (int s = 1; s < 32; s <<= 1) {
        const u32 y = __shfl_up_sync(0xFFFFFFFFu, incl, s);
        if (lane >= (u32)s) incl += y;
    }
    u32 pl = 0, pe = 0;
    if (lane == 31) {
        if (incl & 0xFFFFu) pl = atomicAdd(&sc.slot[0], incl & 0xFFFFu);
        if (incl >> 16) pe = atomicAdd(&sc.slot[1], incl >> 16);
    }
    const u32 before = incl - own;
    pl = __shfl_sync(0xFFFFFFFFu, pl, 31) + (before & 0xFFFFu);
    pe = __shfl_sync(0xFFFFFFFFu, pe, 31) + (before >> 16);
    const u32 col[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        if ((ml >> u) & 1u) {
            orow[pl++] = (int)col[u];
        } else if ((me >> u) & 1u) {
            if (pe < need) orow[nlt + pe] = (int)col[u];
            ++pe;
        }
    }
}

// The masks of emit4 for the four keys q (only the first `valid` count).
__device__ __forceinline__ void win_masks(uint4 q, u32 valid, u32 T, bool all, u32& ml, u32& me) {
    const u32 key[4] = {q.x, q.y, q.z, q.w};
    ml = me = 0u;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        const bool ok = (u32)u < valid;
        ml |= (u32)(ok && (key[u] < T || (all && key[u] == T))) << u;
        me |= (u32)(ok && !all && key[u] == T) << u;
    }
}

// The n kept keys (direct: key j sits at column j; else its column is bcol[j]), four a
// thread by 16-byte shared loads (bkey and bcol 16-byte aligned, readable up to n rounded up
// to 4).
__device__ __forceinline__ void emit_any(const u32* bkey, const u32* bcol, u32 n, bool direct, u32 T, u32 need, int k,
                                         int* __restrict__ orow, Scalars& sc) {
    const bool all = need == TAKE_ALL;
    const u32 nlt = all ? (u32)k : (u32)k - need;
    for (u32 b = 0; b < n; b += 4 * NT) {
        const u32 j = b + 4 * threadIdx.x;
        u32 ml = 0u, me = 0u;
        uint4 c = make_uint4(j, j + 1, j + 2, j + 3);
        if (j < n) {
            win_masks(*reinterpret_cast<const uint4*>(bkey + j), n - j, T, all, ml, me);
            if (!direct && (ml | me)) c = *reinterpret_cast<const uint4*>(bcol + j);
        }
        emit4(ml, me, c, nlt, need, orow, sc);
    }
}

// The row [0, L) of x read once more from global memory (the sample missed, unordered).
__device__ __forceinline__ void emit_any_row(const float* __restrict__ x, int L, u32 T, u32 need, int k,
                                             int* __restrict__ orow, Scalars& sc) {
    const bool all = need == TAKE_ALL;
    const u32 nlt = all ? (u32)k : (u32)k - need;
    visit_row(x, 0, L, [&](int i, bool ok, uint4 q) {
        u32 ml, me;
        win_masks(q, ok ? 4u : 0u, T, all, ml, me);
        emit4(ml, me, make_uint4(i, i + 1, i + 2, i + 3), nlt, need, orow, sc);
    }, [&](int i, bool ok, u32 key) {
        u32 ml, me;
        win_masks(make_uint4(key, 0u, 0u, 0u), ok ? 1u : 0u, T, all, ml, me);
        emit4(ml, me, make_uint4(i, 0u, 0u, 0u), nlt, need, orow, sc);
    });
}

// The select, marks and ordered emission of a row [0, L) of x (k < L) by this CTA alone,
// once its n keys are in shared memory (solo_row's layout): the row itself at its columns
// (direct), or the kept keys <= a sampled bound with their columns, whose first digits h
// has counted (h2 zero, the bitmaps zero, sc.kr = k). When the kept keys cannot hold the
// k-th key (n < k, or more than the buffer), the row is selected from global memory instead.
// ordered = false (stable=False) emits the winners in any order (emit_any, or emit_any_row
// after the global select) and never touches the bitmaps: its plans have none (words = 0).
__device__ __forceinline__ void finish_row(const float* __restrict__ x, int L, int k, int* __restrict__ orow,
                                           u32* smem, int buf, int words, u32 n, bool direct, bool ordered,
                                           Scalars& sc) {
    u32* h = smem;
    u32* h2 = smem + BINS;
    u32* blt = smem + 2 * BINS;
    u32* beq = blt + words;
    u32* bkey = beq + words;
    const u32 cap = (u32)buf / 2;
    u32* bcol = bkey + cap;
    const int nw = (L + 31) >> 5;
    u32 T, need;
    if (threadIdx.x == 0) sc.slot[0] = sc.slot[1] = 0u;  // read after select_keys' barriers
    if (n >= (u32)k && n <= (direct ? (u32)buf : cap)) {
        select_keys<false>(h, h2, sc, x, L, bkey, (int)n, T, need);
        STAMP(3);
        if (!ordered) {
            STAMP(4);
            emit_any(bkey, bcol, n, direct, T, need, k, orow, sc);
            STAMP(5);
            return;
        }
        if (direct) {  // keys sit at their columns: a warp's ballot is one bitmap word
            for (int i = threadIdx.x; i < nw * 32; i += NT) {
                const bool ok = i < L;
                const u32 key = ok ? bkey[i] : 0u;
                const u32 ml = __ballot_sync(0xFFFFFFFFu, ok && key < T), me = __ballot_sync(0xFFFFFFFFu, ok && key == T);
                if ((threadIdx.x & 31) == 0) {
                    blt[i >> 5] = ml;
                    beq[i >> 5] = me;
                }
            }
        } else {
            for (u32 j = threadIdx.x; j < n; j += NT) {
                const u32 key = bkey[j], c = bcol[j];
                if (key < T) atomicOr(blt + (c >> 5), 1u << (c & 31));
                else if (key == T) atomicOr(beq + (c >> 5), 1u << (c & 31));
            }
        }
    } else {
        // The sample missed: digit passes over the row, then one more read marks the winners.
        for (int b = threadIdx.x; b < 2 * BINS; b += NT) smem[b] = 0;
        __syncthreads();
        visit_global(x, 0, L, [&](int, bool ok, u32 key) {
            if (ok) atomicAdd(h + (key >> 21), 1u);
        });
        __syncthreads();
        select_keys<true>(h, h2, sc, x, L, bkey, 0, T, need);
        STAMP(3);
        if (!ordered) {  // no bitmaps (the unordered plans have none): emit while reading
            emit_any_row(x, L, T, need, k, orow, sc);
            return;
        }
        visit_row(x, 0, L, [&](int i, bool ok, uint4 q) {
            u32 ml, me;  // keys == T all go to beq: the emission takes the first `need` of them
            win_masks(q, ok ? 4u : 0u, T, false, ml, me);
            if (ml) atomicOr(blt + (i >> 5), ml << (i & 31));
            if (me) atomicOr(beq + (i >> 5), me << (i & 31));
        }, [&](int i, bool ok, u32 key) {
            if (ok && key < T) atomicOr(blt + (i >> 5), 1u << (i & 31));
            else if (ok && key == T) atomicOr(beq + (i >> 5), 1u << (i & 31));
        });
    }
    __syncthreads();
    STAMP(4);

    emit_bitmaps(blt, beq, nw, need, orow, sc);
    STAMP(5);
}

// One row [0, L) of x (k < L) by this CTA alone, into orow (docs/cuda-kernel.md §4.2). smem:
// 2 x 2048 counts, two bitmaps of `words` words (>= L / 32, a multiple of 4; none when not
// ordered), `buf` words
// (rows of L <= buf kept whole; longer ones keep at most buf / 2 keys with their columns).
__device__ __forceinline__ void solo_row(const float* __restrict__ x, int L, int k, int* __restrict__ orow, u32* smem,
                                      int buf, int words, bool ordered, Scalars& sc) {
    u32* h = smem;                // first-digit counts (then the third digit's)
    u32* h2 = smem + BINS;        // the sample's digits, then the second digit's counts
    u32* blt = smem + 2 * BINS;   // column bitmap: keys < T
    u32* beq = blt + words;       // column bitmap: keys == T
    u32* bkey = beq + words;      // the row's keys (direct), or kept keys then their columns
    const u32 cap = (u32)buf / 2;
    u32* bcol = bkey + cap;
    const int nw = (L + 31) >> 5;  // bitmap words of the row
    const bool direct = L <= buf;
    for (int b = threadIdx.x; b < 2 * BINS; b += NT) smem[b] = 0;
    if (!direct && ordered)
        for (int b = threadIdx.x; b < nw; b += NT) blt[b] = beq[b] = 0;
    if (threadIdx.x == 0) {
        sc.cnt = 0;
        sc.kr = (u32)k;
    }
    __syncthreads();

    if (direct) {
        read_slice(x, 0, L, h, bkey);
    } else {
        const u32 tau = sample_tau(x, L, k, h2, sc);
        STAMP(2);
        visit_row(x, 0, L, [&](int i, bool ok, uint4 q) {  // not batched: split.cu's keep_slice
            keep4(ok && q.x <= tau, ok && q.y <= tau, ok && q.z <= tau, ok && q.w <= tau, q, i, bkey, bcol, cap, h,
                  &sc.cnt);
        }, [&](int i, bool ok, u32 key) {
            keep4(ok && key <= tau, 0u, 0u, 0u, make_uint4(key, 0u, 0u, 0u), i, bkey, bcol, cap, h, &sc.cnt);
        });
    }
    STAMP(1);
    __syncthreads();

    finish_row(x, L, k, orow, smem, buf, words, direct ? (u32)L : sc.cnt, direct, ordered, sc);
}
