// dsa_ops backend `cuda`: the exact top-k of contract §1 (docs/contract.md) for decode and
// prefill rows: the cluster kernel (topk_rows, topk_rows_many). Design: docs/cuda-kernel.md §4.
//
// A row is split over a cluster of C CTAs (C = 1..16, a launch parameter); CTA q owns the
// slice [lo, hi) of the row's window. Three radix passes over the order keys (11 + 11 + 10
// bits) find the k-th smallest key T and how many keys equal to T are taken (`need`); each
// CTA counts into its own 2048-bin shared histogram and the cluster's histograms are summed
// through distributed shared memory after one cluster barrier per pass. The row is read
// from global memory once when the slice fits the CTA's shared stage (then every later
// pass reads shared memory), else the second pass collects the keys of the chosen first
// digit into shared memory (three reads), else every pass re-reads the row (four reads).
// The emission is ordered: each CTA writes its winners in ascending column order at the
// offset of the CTAs before it, ties taken lowest column first. So `stable` costs nothing
// and both modes give the reference's bytes.
//
// Graph safety: nothing is read but the row's window [s, s + L), with L read on the device;
// no workspace, no global atomics, no state carried between launches.

#include "common.cuh"
#include "solo_row.cuh"  // solo_row: a short row, by CTA 0 alone

// All threads of the row's CTAs; a plain CTA barrier when the row has one CTA (no fence).
__device__ __forceinline__ void row_sync(int C) {
    if (C == 1) __syncthreads();
    else cluster_sync();
}

enum : int { A2A_MAX = 4 };  // clusters up to this size sum every histogram in every CTA (one barrier a pass)

// The same choice for larger clusters, with O(BINS) distributed-shared-memory loads a CTA
// instead of O(C * BINS): CTA q sums bins [q*S, (q+1)*S) (S = BINS / C) over the cluster
// into tot, and its slice's total into sc.slice[p]; after one more cluster barrier every
// CTA finds the slice holding the wanted key, then the bin inside it from that slice's owner.
__device__ void choose_bin_rs(const u32* h, u32* tot, u32 C, u32 rank, int p, Scalars& sc) {
    const u32 S = BINS / C, kr = sc.kr;
    u32 part = 0;
    for (u32 j = threadIdx.x; j < S; j += NT) {
        u32 b = rank * S + j, v[16];
#pragma unroll
        for (u32 c = 0; c < 16; ++c)
            if (c < C) v[c] = c == rank ? h[b] : load_remote(remote_addr(h + b, c));
        u32 sum = 0;
#pragma unroll
        for (u32 c = 0; c < 16; ++c)
            if (c < C) sum += v[c];
        tot[b] = sum;
        part += sum;
    }
#pragma unroll
    for (int d = 16; d; d >>= 1) part += __shfl_xor_sync(0xFFFFFFFFu, part, d);
    if ((threadIdx.x & 31) == 0 && part) atomicAdd(&sc.slice[p], part);
    cluster_sync();
    if (threadIdx.x < 32) {
        u32 c = threadIdx.x;
        u32 v = c < C ? (c == rank ? sc.slice[p] : load_remote(remote_addr(&sc.slice[p], c))) : 0u, incl = v;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            u32 y = __shfl_up_sync(0xFFFFFFFFu, incl, d);
            if (c >= (u32)d) incl += y;
        }
        u32 hit = __ballot_sync(0xFFFFFFFFu, c < C && incl - v < kr && kr <= incl);
        if (c == (u32)(__ffs(hit) - 1)) {
            sc.qs = c;
            sc.kq = kr - (incl - v);
        }
    }
    __syncthreads();
    const u32 q = sc.qs, kq = sc.kq;
    u32 j = 2 * threadIdx.x, a0 = 0, a1 = 0;  // S <= 1024: two bins a thread
    if (j < S) {
        const u32* t = tot + q * S + j;
        if (q == rank) { a0 = t[0]; a1 = t[1]; }
        else { a0 = load_remote(remote_addr(t, q)); a1 = load_remote(remote_addr(t + 1, q)); }
    }
    u32 total, s2 = a0 + a1;
    u32 before = block_scan(s2, sc.wsum, total);
    if (j < S && before < kq && kq <= before + s2) {
        bool second = kq > before + a0;
        sc.bin = q * S + j + (second ? 1u : 0u);
        sc.kr = kq - before - (second ? a0 : 0u);
        sc.binsz = second ? a1 : a0;
    }
    __syncthreads();
    add_own_below(h, sc);
}

// After the pass's row barrier: choose the pass's bin (sc.bin, sc.kr, sc.lt updated).
__device__ __forceinline__ void choose_bin(const u32* h, u32* tot, u32 C, u32 rank, int p, Scalars& sc) {
    if (C <= A2A_MAX) choose_bin_a2a(h, C, rank, sc);
    else choose_bin_rs(h, tot, C, rank, p, sc);
}

// The keys [a, b) of the slice (window-relative columns; a - lo a multiple of 4), from the
// shared stage (STAGED) or the row; f(i, key) in column order.
template <bool STAGED, class F>
__device__ __forceinline__ void sweep(const float* __restrict__ x, const u32* stage, int lo, int a, int b, F&& f) {
    if (STAGED) {
        const uint4* p = reinterpret_cast<const uint4*>(stage + (a - lo));
        int i = a;
        for (; i + 4 <= b; i += 4) {
            uint4 q = *p++;
            f(i, q.x); f(i + 1, q.y); f(i + 2, q.z); f(i + 3, q.w);
        }
        for (; i < b; ++i) f(i, stage[i - lo]);
    } else if ((reinterpret_cast<unsigned long long>(x + a) & 15) == 0) {
        const float4* p = reinterpret_cast<const float4*>(x + a);
        int i = a;
        for (; i + 4 <= b; i += 4) {
            float4 v = __ldg(p++);
            f(i, order_key(v.x)); f(i + 1, order_key(v.y)); f(i + 2, order_key(v.z)); f(i + 3, order_key(v.w));
        }
        for (; i < b; ++i) f(i, order_key(__ldg(x + i)));
    } else {
        for (int i = a; i < b; ++i) f(i, order_key(__ldg(x + i)));
    }
}

// Ordered emission of this CTA's winners: keys < T, and the first `taken` keys == T, in
// ascending column order, to orow[base + rank among them]. Thread t owns the keys
// [lo + t*m, lo + (t+1)*m) (m = 4 x an odd number: the 16-byte shared loads of 8 threads
// in a row hit 8 different bank groups): it counts them, one block scan places its first
// winner, and only threads that own a winner sweep their keys again to write them.
template <bool STAGED>
__device__ void emit(const float* __restrict__ x, const u32* stage, int lo, int hi, int m, u32 T, u32 taken,
                     u32 base, int* __restrict__ orow, u32* wsum) {
    const int a = min(lo + (int)threadIdx.x * m, hi), b = min(a + m, hi);
    u32 nl = 0, ne = 0;
    sweep<STAGED>(x, stage, lo, a, b, [&](int, u32 key) {
        nl += key < T;
        ne += key == T;
    });
    u32 lt_b = nl, eq_b = ne;
    block_scan2(lt_b, eq_b, wsum);
    if (nl == 0 && (ne == 0 || eq_b >= taken)) return;
    sweep<STAGED>(x, stage, lo, a, b, [&](int i, u32 key) {
        if (key < T) {
            orow[base + lt_b + min(eq_b, taken)] = i;
            ++lt_b;
        } else if (key == T) {
            if (eq_b < taken) orow[base + lt_b + eq_b] = i;
            ++eq_b;
        }
    });
}

// Unstaged rows, second read of the slice: warp w reads its run [lo + w*SW, lo + (w+1)*SW)
// in order (32 keys a step, coalesced), counts the keys below the first-digit bin b1 into
// sc.wa[w], and appends the keys of bin b1 with their columns to this CTA's list (local,
// at `own`: keys then columns) and to the leader's buffer (gkey/gcol from sc.off).
__device__ void second_read(const float* __restrict__ x, int lo, int hi, int SW, u32 b1, u32* gkey, u32* gcol,
                            u32* own, u32 cap, u32 rank, Scalars& sc) {
    const u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5, lm = lanemask_lt();
    const int r0 = min(lo + (int)w * SW, hi), r1 = min(r0 + SW, hi);
    u32* okey = own;  // keys at own[0, cap), columns at own[cap, 2 cap); at most sc.binsz <= cap of them
    u32* ocol = own + cap;
    u32 below = 0;
    for (int base = r0; base < r1; base += 32 * U1) {
        float v[U1];
#pragma unroll
        for (int u = 0; u < U1; ++u) {
            int i = base + u * 32 + (int)lane;
            v[u] = i < r1 ? __ldg(x + i) : 0.f;
        }
        u32 vote[U1], n = 0;
#pragma unroll
        for (int u = 0; u < U1; ++u) {
            int i = base + u * 32 + (int)lane;
            bool ok = i < r1;
            u32 d1 = order_key(v[u]) >> 21;
            below += __popc(__ballot_sync(0xFFFFFFFFu, ok && d1 < b1));
            vote[u] = __ballot_sync(0xFFFFFFFFu, ok && d1 == b1);
            n += __popc(vote[u]);
        }
        if (n) {  // one shared atomic for the U1 steps (an atomic a step is a latency chain)
            u32 pos = 0;
            if (lane == 0) pos = atomicAdd(&sc.cnt, n);
            pos = __shfl_sync(0xFFFFFFFFu, pos, 0);
#pragma unroll
            for (int u = 0; u < U1; ++u) {
                if ((vote[u] >> lane) & 1u) {
                    u32 p = pos + __popc(vote[u] & lm), key = order_key(v[u]), i = (u32)(base + u * 32 + (int)lane);
                    okey[p] = key;
                    ocol[p] = i;
                    put(gkey + sc.off + p, 0, rank, key);
                    put(gcol + sc.off + p, 0, rank, i);
                }
                pos += __popc(vote[u]);
            }
        }
    }
    if (lane == 0) sc.wa[w] = below;
}

// Unstaged rows, ordered emission after the leader's hand-out (sc.T, sc.base, sc.taken):
// the CTA's own candidates give each warp run its keys < T and == T, a warp scan gives each
// run its first slot and ties, then every warp reads its run again in order and writes its
// winners by warp votes (no CTA barrier inside the read; a warp stops once its run is done).
__device__ void emit_runs(const float* __restrict__ x, int lo, int hi, int SW, const u32* own, u32 cap,
                          int* __restrict__ orow, Scalars& sc) {
    const u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5, lm = lanemask_lt();
    const u32 T = sc.T, n_own = sc.cnt;
    const u32* okey = own;
    const u32* ocol = own + cap;
    if (threadIdx.x < NWARP) {
        sc.wl[threadIdx.x] = 0;
        sc.we[threadIdx.x] = 0;
    }
    __syncthreads();
    for (u32 j = threadIdx.x; j < n_own; j += NT) {
        u32 key = okey[j], ww = (ocol[j] - (u32)lo) / (u32)SW;
        if (key < T) atomicAdd(&sc.wl[ww], 1u);
        else if (key == T) atomicAdd(&sc.we[ww], 1u);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        u32 c = threadIdx.x;
        u32 lt = c < NWARP ? sc.wa[c] + sc.wl[c] : 0u, eq = c < NWARP ? sc.we[c] : 0u, ie = eq;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            u32 y = __shfl_up_sync(0xFFFFFFFFu, ie, d);
            if (c >= (u32)d) ie += y;
        }
        u32 before = ie - eq, taken = min(eq, sc.taken > before ? sc.taken - before : 0u);
        u32 sel = lt + taken, is = sel;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            u32 y = __shfl_up_sync(0xFFFFFFFFu, is, d);
            if (c >= (u32)d) is += y;
        }
        if (c < NWARP) {
            sc.wbase[c] = sc.base + is - sel;
            sc.wtake[c] = taken;
            sc.wl[c] = lt;  // the run's keys < T, for its early stop
        }
    }
    __syncthreads();
    const int r0 = min(lo + (int)w * SW, hi), r1 = min(r0 + SW, hi);
    const u32 base = sc.wbase[w], take = sc.wtake[w], lt_all = sc.wl[w];
    u32 r_lt = 0, r_eq = 0;
    for (int b0 = r0; b0 < r1 && (r_lt < lt_all || r_eq < take); b0 += 32 * U1) {
        float v[U1];
#pragma unroll
        for (int u = 0; u < U1; ++u) {
            int i = b0 + u * 32 + (int)lane;
            v[u] = i < r1 ? __ldg(x + i) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < U1; ++u) {
            int i = b0 + u * 32 + (int)lane;
            bool ok = i < r1;
            u32 key = order_key(v[u]);
            u32 bl = __ballot_sync(0xFFFFFFFFu, ok && key < T), be = __ballot_sync(0xFFFFFFFFu, ok && key == T);
            if (bl | be) {
                u32 a = r_lt + __popc(bl & lm), t = r_eq + __popc(be & lm);
                if ((bl >> lane) & 1u) orow[base + a + min(t, take)] = i;
                else if (((be >> lane) & 1u) && t < take) orow[base + a + t] = i;
                r_lt += __popc(bl);
                r_eq += __popc(be);
            }
        }
    }
}

__device__ __forceinline__ void topk_body(
    const float* __restrict__ logits, i64 pitch, int width, const int* __restrict__ lens,
    const int* __restrict__ starts, const int* __restrict__ ends, int mode, int next_n, int k,
    int* __restrict__ out, int C, int stage_keys, int cand_keys, int solo_max);

// One CTA a multiprocessor (few rows: up to 128 registers a thread) and two (many rows).
#define TOPK_ENTRY(NAME, BLOCKS)                                                                          \
    extern "C" __global__ void __launch_bounds__(NT, BLOCKS) NAME(                                        \
        const float* __restrict__ logits, i64 pitch, int width, const int* __restrict__ lens,            \
        const int* __restrict__ starts, const int* __restrict__ ends, int mode, int next_n, int k,       \
        int* __restrict__ out, int C, int stage_keys, int cand_keys, int solo_max PROFILE_PARAM) {          \
        PROFILE_START();                                                                                  \
        topk_body(logits, pitch, width, lens, starts, ends, mode, next_n, k, out, C, stage_keys, cand_keys,  \
                  solo_max);                                                                              \
    }
TOPK_ENTRY(topk_rows, 1)
TOPK_ENTRY(topk_rows_many, 2)

__device__ __forceinline__ void topk_body(
    const float* __restrict__ logits, i64 pitch, int width, const int* __restrict__ lens,
    const int* __restrict__ starts, const int* __restrict__ ends, int mode, int next_n, int k,
    int* __restrict__ out, int C, int stage_keys, int cand_keys, int solo_max) {
    extern __shared__ __align__(16) u32 smem[];
    __shared__ Scalars sc;
    STAMP(0);
    u32* h0 = smem;
    u32* h1 = smem + BINS;
    u32* tot = smem + 2 * BINS;  // reduce-scatter totals
    u32* stage = smem + 3 * BINS;

    const u32 rank = C > 1 ? cluster_rank() : 0u;
    const int r = blockIdx.x / C;
    int s, L;
    row_window(mode, r, width, next_n, lens, starts, ends, s, L);
    int* orow = out + (i64)r * k;

    if (L <= k) {  // every column wins: 0..L-1, then -1 (no barrier: the whole cluster is here)
        int per = (k + C - 1) / C;
        int j0 = (int)rank * per, j1 = min(j0 + per, k);
        for (int j = j0 + (int)threadIdx.x; j < j1; j += NT) orow[j] = j < L ? j : -1;
        return;
    }

    const float* x = logits + (i64)r * pitch + s;
    if (L <= solo_max) {  // a short row: CTA 0 selects it alone (solo.cu), the others leave
        if (rank == 0)
            solo_row(x, L, k, orow, smem, (solo_max + 7) & ~7, (((solo_max + 31) >> 5) + 3) & ~3, true, sc);
        return;
    }
    const int ch = (int)(((((i64)L + C - 1) / C) + 3) & ~3LL);
    const int lo = (int)min((i64)rank * ch, (i64)L), hi = (int)min((i64)lo + ch, (i64)L);
    const int m = 4 * (((ch + 4 * NT - 1) / (4 * NT)) | 1);  // keys a thread owns in the emission
    const bool staged = NT * m <= stage_keys;                // the same answer in every CTA of the row

    for (int b = threadIdx.x; b < 2 * BINS; b += NT) smem[b] = 0;
    if (threadIdx.x == 0) {
        sc.kr = (u32)k;
        sc.lt = 0;
        sc.cnt = 0;
        sc.slice[0] = sc.slice[1] = sc.slice[2] = 0;
    }
    __syncthreads();

    // Pass 1: bits 31..21 of every key of the slice (kept in the stage when it fits).
    read_slice(x, lo, hi, h0, staged ? stage : nullptr);
    STAMP(1);
    row_sync(C);
    choose_bin(h0, tot, C, rank, 0, sc);
    const u32 b1 = sc.bin;
    STAMP(2);

    const bool gather = sc.binsz <= (u32)cand_keys && (staged || sc.binsz <= (u32)stage_keys / 2);
    const int SW = ((hi - lo + NWARP - 1) / NWARP + 31) & ~31;  // a warp's run of the slice (unstaged rows)
    if (gather) {
        // Gather: every CTA sends the keys of bin b1 (and its count of keys below it) to
        // the leader (CTA 0), which finishes the select alone and hands each CTA its T,
        // first slot and ties; the stage then serves the ordered emission.
        u32* gkey = stage + stage_keys;
        u32* gcol = gkey + cand_keys;
        if (threadIdx.x < 32) {
            u32 c = threadIdx.x;
            u32 n_c = c < rank ? load_remote(remote_addr(h0 + b1, c)) : 0u;
#pragma unroll
            for (int d = 16; d; d >>= 1) n_c += __shfl_xor_sync(0xFFFFFFFFu, n_c, d);
            if (c == 0) sc.off = n_c;
        }
        __syncthreads();  // sc.off, and sc.lt complete
        if (threadIdx.x == 0) {
            put(&sc.ltc[rank], 0, rank, sc.lt);
            put(&sc.offc[rank], 0, rank, sc.off);
        }
        if (!staged) {
            second_read(x, lo, hi, SW, b1, gkey, gcol, stage, (u32)stage_keys / 2, rank, sc);
        } else {
            // Thread t sends the hits among its own keys [t*m, (t+1)*m) of the slice: count
            // them, one warp scan and one shared atomic a warp reserve its slots, then write.
            const int a = min(lo + (int)threadIdx.x * m, hi), b = min(a + m, hi);
            u32 hits = 0;
            sweep<true>(x, stage, lo, a, b, [&](int, u32 key) { hits += (key >> 21) == b1; });
            u32 lane = threadIdx.x & 31, incl = hits;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                u32 y = __shfl_up_sync(0xFFFFFFFFu, incl, d);
                if (lane >= (u32)d) incl += y;
            }
            u32 wbase = 0;
            if (lane == 31 && incl) wbase = atomicAdd(&sc.cnt, incl);
            u32 pos = sc.off + __shfl_sync(0xFFFFFFFFu, wbase, 31) + incl - hits;
            if (hits) {
                sweep<true>(x, stage, lo, a, b, [&](int i, u32 key) {
                    if ((key >> 21) == b1) {
                        put(gkey + pos, 0, rank, key);
                        put(gcol + pos, 0, rank, (u32)i);
                        ++pos;
                    }
                });
            }
        }
        STAMP(3);
        row_sync(C);
        if (rank == 0) {
            const int M = (int)sc.binsz;
            for (int j = threadIdx.x; j < M; j += NT) atomicAdd(h1 + ((gkey[j] >> 10) & 0x7FFu), 1u);
            __syncthreads();
            choose_bin_a2a(h1, 1, 0, sc, false);
            const u32 p2 = (b1 << 11) | sc.bin;
            STAMP(5);
            for (int b = threadIdx.x; b < BINS; b += NT) h0[b] = 0;  // no CTA reads it any more
            __syncthreads();
            for (int j = threadIdx.x; j < M; j += NT)
                if ((gkey[j] >> 10) == p2) atomicAdd(h0 + (gkey[j] & 0x3FFu), 1u);
            __syncthreads();
            choose_bin_a2a(h0, 1, 0, sc, false);
            const u32 T = (p2 << 10) | sc.bin, need = sc.kr;
            STAMP(6);
            // CTA c's candidates are gkey[off_c, off_c + n_c) (off_c in sc.offc[c], written
            // by CTA c): warp c counts those < T and == T (C <= 16 = the warps of a CTA).
            {
                const u32 w = threadIdx.x >> 5, lane = threadIdx.x & 31;
                if (w < (u32)C) {
                    int o0 = (int)sc.offc[w], o1 = w + 1 < (u32)C ? (int)sc.offc[w + 1] : M;
                    u32 nl = 0, ne = 0;
                    for (int j = o0 + (int)lane; j < o1; j += 32) {
                        u32 key = gkey[j];
                        nl += key < T;
                        ne += key == T;
                    }
#pragma unroll
                    for (int d = 16; d; d >>= 1) {
                        nl += __shfl_xor_sync(0xFFFFFFFFu, nl, d);
                        ne += __shfl_xor_sync(0xFFFFFFFFu, ne, d);
                    }
                    if (lane == 0) {
                        sc.pfl[w] = nl;
                        sc.pfe[w] = ne;
                    }
                }
            }
            __syncthreads();
            if (threadIdx.x < 32) {  // lane c: CTA c's ties taken and first slot
                u32 c = threadIdx.x;
                u32 lt = c < (u32)C ? sc.ltc[c] + sc.pfl[c] : 0u;
                u32 eq = c < (u32)C ? sc.pfe[c] : 0u, ie = eq;
#pragma unroll
                for (int d = 1; d < 32; d <<= 1) {
                    u32 y = __shfl_up_sync(0xFFFFFFFFu, ie, d);
                    if (c >= (u32)d) ie += y;
                }
                u32 before = ie - eq, taken = min(eq, need > before ? need - before : 0u);
                u32 sel = lt + taken, is = sel;
#pragma unroll
                for (int d = 1; d < 32; d <<= 1) {
                    u32 y = __shfl_up_sync(0xFFFFFFFFu, is, d);
                    if (c >= (u32)d) is += y;
                }
                if (c < (u32)C) {
                    put(&sc.T, c, 0, T);
                    put(&sc.base, c, 0, is - sel);
                    put(&sc.taken, c, 0, taken);
                }
            }
        }
        STAMP(4);
        row_sync(C);  // after this no CTA touches another's shared memory
        STAMP(7);
        if (staged) emit<true>(x, stage, lo, hi, m, sc.T, sc.taken, sc.base, orow, sc.wsum);
        else emit_runs(x, lo, hi, SW, stage, (u32)stage_keys / 2, orow, sc);
        STAMP(8);
        return;
    }

    // Otherwise every pass runs over the cluster: the stage, or the candidate buffer, or
    // the row again.
    const u32 cap = (u32)stage_keys / 2;  // candidates (key, column) when the slice is not staged
    u32* ckey = stage;
    u32* ccol = stage + cap;
    if (!staged) {  // collect the first-digit bin's keys if every CTA's share fits
        if (threadIdx.x < 32) {  // lane c reads CTA c's count of the bin
            u32 c = threadIdx.x;
            u32 most = c < (u32)C ? (c == rank ? h0[b1] : load_remote(remote_addr(h0 + b1, c))) : 0u;
#pragma unroll
            for (int d = 16; d; d >>= 1) most = max(most, __shfl_xor_sync(0xFFFFFFFFu, most, d));
            if (c == 0) sc.collect = most <= cap;
        }
        __syncthreads();
    }
    const bool collect = !staged && sc.collect;

    // Pass 2: bits 20..10 of the keys whose first digit is b1.
    auto count2 = [&](int i, bool ok, u32 key) {
        bool hit = ok && (key >> 21) == b1;
        if (hit) atomicAdd(h1 + ((key >> 10) & 0x7FFu), 1u);
        if (collect) {  // one shared atomic a warp (same-address atomics serialise)
            u32 live = __activemask(), vote = __ballot_sync(live, hit);
            if (vote) {
                u32 lane = threadIdx.x & 31, lead = __ffs(vote) - 1, pos = 0;
                if (lane == lead) pos = atomicAdd(&sc.cnt, (u32)__popc(vote));
                pos = __shfl_sync(live, pos, lead) + __popc(vote & lanemask_lt());
                if (hit) {
                    ckey[pos] = key;
                    ccol[pos] = (u32)i;
                }
            }
        }
    };
    if (staged) {
        visit_stage(stage, hi - lo, [&](int, u32 key) { count2(0, true, key); });
    } else {
        visit_global(x, lo, hi, count2);
    }
    STAMP(3);
    row_sync(C);
    choose_bin(h1, tot, C, rank, 1, sc);
    const u32 p2 = (b1 << 11) | sc.bin;
    STAMP(4);

    // Pass 3: bits 9..0 of the keys whose first 22 bits are p2 (into h0: every CTA has
    // read it, since all of them passed the barrier above after pass 1's choice).
    for (int b = threadIdx.x; b < BINS; b += NT) h0[b] = 0;
    __syncthreads();
    auto count3 = [&](int, bool ok, u32 key) {
        if (ok && (key >> 10) == p2) atomicAdd(h0 + (key & 0x3FFu), 1u);
    };
    if (staged) {
        visit_stage(stage, hi - lo, [&](int, u32 key) { count3(0, true, key); });
    } else if (collect) {
        int n = (int)sc.cnt;
        for (int j = threadIdx.x; j < n; j += NT) count3(0, true, ckey[j]);
    } else {
        visit_global(x, lo, hi, count3);
    }
    STAMP(5);
    row_sync(C);
    choose_bin(h0, tot, C, rank, 2, sc);
    const u32 T = (p2 << 10) | sc.bin;
    STAMP(6);
    const u32 need = sc.kr;  // keys equal to T the row takes, lowest columns first
    __syncthreads();         // sc.lt is complete

    // Exchange (keys < T, keys == T) with the cluster: CTA q starts after CTAs 0..q-1.
    if (threadIdx.x == 0) {
        sc.xchg[0] = sc.lt;
        sc.xchg[1] = h0[sc.bin];
    }
    row_sync(C);
    if (threadIdx.x < 32) {  // lane c < rank reads CTA c's pair; lane 0 adds them up in order
        u32 c = threadIdx.x, lt_c = 0, eq_c = 0;
        if (c < rank) {
            lt_c = load_remote(remote_addr(&sc.xchg[0], c));
            eq_c = load_remote(remote_addr(&sc.xchg[1], c));
        }
        u32 base = 0, eq_before = 0;
        for (u32 j = 0; j < rank; ++j) {
            u32 lt_j = __shfl_sync(0xFFFFFFFFu, lt_c, j), eq_j = __shfl_sync(0xFFFFFFFFu, eq_c, j);
            u32 left = need > eq_before ? need - eq_before : 0u;
            base += lt_j + min(eq_j, left);
            eq_before += eq_j;
        }
        if (c == 0) {
            u32 left = need > eq_before ? need - eq_before : 0u;
            sc.base = base;
            sc.taken = min(sc.xchg[1], left);
        }
    }
    if (C > 1) cluster_arrive();  // done reading the other CTAs' shared memory
    __syncthreads();
    STAMP(7);
    const u32 base = sc.base, taken = sc.taken;
    if (staged) emit<true>(x, stage, lo, hi, m, T, taken, base, orow, sc.wsum);
    else emit<false>(x, stage, lo, hi, m, T, taken, base, orow, sc.wsum);
    STAMP(8);
    if (C > 1) cluster_wait();  // no CTA leaves while another may still read its shared memory
}
