// dsa_ops backend `cuda`: one row split over a thread-block cluster under one sampled bound
// (docs/cuda-kernel.md §4.3), for decode batches of up to 64 rows: the entry point topk_split
// (uses solo_row.cuh's sample_tau, keep4, finish_row and solo_row).
//
// - Every CTA of the row's cluster computes the same bound tau from the same sample of the
//   row (sample_tau is a pure function of the row), then reads its slice of the row once and
//   keeps its keys <= tau with their columns in its own shared memory. With `stage` words
//   (unordered plans up to W = SAMPLE_LONG), thread 0 first hands the slice (its first
//   4 * (stage / 4) keys) to the bulk copy engine, which lands it in shared memory while the
//   sample is read and chosen; the keep then reads shared memory.
//   A slice of RING_MIN keys or more streams through those words instead, as a ring of
//   RING_SLOT-word slots that the bulk copy engine refills while the CTA keeps from the
//   others (keep_ring).
// - Each CTA reserves room in the leader's (CTA 0's) buffer with one cluster-scope atomic on
//   the leader's count and copies its kept keys there (the leader keeps its own slice's keys
//   straight into that buffer, through the same count).
// - After one cluster barrier the leader holds every key <= tau of the row, and finishes alone
//   (finish_row: select over the kept keys, then column bitmaps and the ordered emission, or
//   with stable=False one unordered pass over the kept keys); the others
//   leave. Too few or too many kept keys send the leader to the digit passes over global
//   memory (finish_row's fallback): the result never depends on the sample.
// - Rows of L <= solo_max are selected by CTA 0 alone from the start (solo_row, kept whole).

#include "common.cuh"
#include "solo_row.cuh"

// The slice's bulk copies start behind the sample's loads only in clusters of fewer
// CTAs than this (a row's 16 CTAs have short slices, and ran slower with that order).
enum : int { SAMPLE_FIRST_CTAS = 16 };

// Ask L2 for the 128-byte lines that this thread's first batch of visit_row(x, lo, hi) loads
// will read, so that they arrive while the sample is being read and chosen.
__device__ __forceinline__ void prefetch_first(const float* __restrict__ x, int lo, int hi) {
    if ((reinterpret_cast<unsigned long long>(x + lo) & 15) != 0) return;
    const int nf = (hi - lo) >> 2;
#pragma unroll
    for (int u = 0; u < U4; ++u) {
        const int j = u * NT + (int)threadIdx.x;
        if (j < nf && (j & 7) == 0) asm volatile("prefetch.global.L2 [%0];" ::"l"(x + lo + 4 * j));
    }
}

enum : int { KEEPB_MIN = 49152 };  // keep_slice batches slices of at least this many keys (topk.py reads it)
enum : int { KEEP_D = 4 };  // keep_slice, batched: 16-byte loads a thread in a batch

// Ask L2 for the 128-byte lines of batch b (KEEP_D 16-byte chunks a thread) of keep_slice's
// nf chunks at p.
__device__ __forceinline__ void prefetch_batch(const float4* p, int nf, int b) {
#pragma unroll
    for (int u = 0; u < KEEP_D; ++u) {
        const int j = (b * KEEP_D + u) * NT + (int)threadIdx.x;
        if (j < nf && (j & 7) == 0) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + j));
    }
}

// Keep the keys <= tau of this CTA's slice [lo, hi) of row x (window-relative columns) with
// their columns, at slots reserved from *cnt as keep4 does (cl: a cluster-scope atomic, the
// leader's count; slots past cap counted, not written). Called by whole CTAs.
// - Slices of KEEPB_MIN keys or more (16-byte aligned) are read in batches: a thread loads
//   KEEP_D 16-byte chunks, asks L2 for the next batch's lines, and one warp scan and one
//   shared atomic a warp reserve the whole batch's slots (fewer instructions a key: the
//   read of a long slice by many CTAs is bandwidth-bound).
// - Shorter slices take keep4 a chunk through visit_row, which looks at each chunk as soon
//   as it arrives (their read is latency-bound, and batching slowed it). solo_row reads
//   unbatched at every length (batched, its prefill times moved both ways: no gain).
__device__ __forceinline__ void keep_slice(const float* __restrict__ x, int lo, int hi, u32 tau, u32* bkey, u32* bcol,
                                           u32 cap, u32* cnt, bool cl) {
    const int n = hi - lo;
    if (n < KEEPB_MIN || (reinterpret_cast<unsigned long long>(x + lo) & 15) != 0) {
        visit_row(x, lo, hi, [&](int i, bool ok, uint4 q) {
            keep4(ok && q.x <= tau, ok && q.y <= tau, ok && q.z <= tau, ok && q.w <= tau, q, i, bkey, bcol, cap,
                  nullptr, cnt, cl);
        }, [&](int i, bool ok, u32 key) {
            keep4(ok && key <= tau, 0u, 0u, 0u, make_uint4(key, 0u, 0u, 0u), i, bkey, bcol, cap, nullptr, cnt, cl);
        });
        return;
    }
    const float4* p = reinterpret_cast<const float4*>(x + lo);
    const int nf = n >> 2;
    const u32 lane = threadIdx.x & 31;
    for (int base = 0; base < nf; base += NT * KEEP_D) {  // the same trip count in every thread
        float4 v[KEEP_D];
#pragma unroll
        for (int u = 0; u < KEEP_D; ++u) {
            const int j = base + u * NT + (int)threadIdx.x;
            v[u] = j < nf ? __ldg(p + j) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        prefetch_batch(p, nf, base / (NT * KEEP_D) + 1);  // the next batch's lines
        uint4 q[KEEP_D];
        u32 m[KEEP_D], c = 0;
#pragma unroll
        for (int u = 0; u < KEEP_D; ++u) {
            const bool ok = base + u * NT + (int)threadIdx.x < nf;
            q[u] = make_uint4(order_key(v[u].x), order_key(v[u].y), order_key(v[u].z), order_key(v[u].w));
            m[u] = (u32)(ok && q[u].x <= tau) | (u32)(ok && q[u].y <= tau) << 1 | (u32)(ok && q[u].z <= tau) << 2 |
                   (u32)(ok && q[u].w <= tau) << 3;
            c += __popc(m[u]);
        }
        if (__ballot_sync(0xFFFFFFFFu, c != 0) == 0) continue;
        u32 at = warp_reserve(c, cnt, cl);
#pragma unroll
        for (int u = 0; u < KEEP_D; ++u) {
            if (m[u] == 0u) continue;
            const u32 i = (u32)(lo + 4 * (base + u * NT + (int)threadIdx.x));
            const u32 key[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if ((m[u] >> e) & 1u) {
                    if (at < cap) {
                        bkey[at] = key[e];
                        bcol[at] = i + (u32)e;
                    }
                    ++at;
                }
            }
        }
    }
    if (threadIdx.x < 32) {  // the last 0-3 keys, by warp 0
        const int i = lo + 4 * nf + (int)lane;
        const bool ok = i < hi;
        const u32 key = ok ? order_key(__ldg(x + i)) : 0u;
        keep4(ok && key <= tau, 0u, 0u, 0u, make_uint4(key, 0u, 0u, 0u), i, bkey, bcol, cap, nullptr, cnt, cl);
    }
}

enum : u32 { STAGE_CHUNK = 32768u };  // bytes a bulk copy instruction moves
enum : int { RING_SLOT = 8192 };  // keep_ring: words (keys) a slot of the ring (32 KB)
enum : int { RING_MIN = 49152 };  // slices of this many keys or more stream through the ring (topk.py reads it)
enum : int { RING_MAX = 8 };  // mbarriers, so slots at most

// Thread 0: initialise the mbarrier at shared address b for one arrival a phase.
__device__ __forceinline__ void bar_init(u32 b) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b) : "memory");
}

// Thread 0: arrive on the mbarrier at b expecting nb bytes, and start the bulk copy (the copy
// engine, async proxy) of nb bytes (a multiple of 16) from global g to shared d, completing
// on it. The fence orders this thread's view of shared memory (the barrier's initialisation,
// the CTA's reads of a slot it refills, after a __syncthreads) before the copy engine's.
__device__ __forceinline__ void bulk_load(u32 d, const char* g, u32 nb, u32 b) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }" ::"r"(b), "r"(nb)
                 : "memory");
    for (u32 o = 0; o < nb; o += STAGE_CHUNK)
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                         d + o),
                     "l"(g + o), "r"(min(STAGE_CHUNK, nb - o)), "r"(b)
                     : "memory");
}

// Thread 0: start the bulk copy of nb bytes (a multiple of 16) from global g to shared dst,
// completing on the mbarrier at bar (initialised here).
__device__ __forceinline__ void stage_start(u32* dst, const float* g, u32 nb, unsigned long long* bar) {
    const u32 b = (u32)__cvta_generic_to_shared(bar);
    bar_init(b);
    bulk_load((u32)__cvta_generic_to_shared(dst), reinterpret_cast<const char*>(g), nb, b);
}

// Wait until the phase of the mbarrier at bar of the given parity has completed (its bulk
// copy has landed).
__device__ __forceinline__ void stage_wait(unsigned long long* bar, u32 parity = 0) {
    const u32 b = (u32)__cvta_generic_to_shared(bar);
    u32 done = 0;
    while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(b), "r"(parity)
                     : "memory");
}

// keep_slice's keep over ns staged 16-byte chunks at shared address st (columns lo, lo + 4, ...).
__device__ __forceinline__ void keep_staged(u32 st, int ns, int lo, u32 tau, u32* bkey, u32* bcol, u32 cap, u32* cnt,
                                            bool cl) {
    for (int base = 0; base < ns; base += NT) {  // the same trip count in every thread
        const int j = base + (int)threadIdx.x;
        const bool ok = j < ns;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (ok)
            asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                         : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                         : "r"(st + 16u * (u32)j));
        const uint4 q = make_uint4(order_key(v.x), order_key(v.y), order_key(v.z), order_key(v.w));
        keep4(ok && q.x <= tau, ok && q.y <= tau, ok && q.z <= tau, ok && q.w <= tau, q, lo + 4 * j, bkey, bcol, cap,
              nullptr, cnt, cl);
    }
}

// Thread 0: start the copies of chunks [c0, c1) (sb bytes each, the last one shorter) of the
// nb bytes at g, chunk c into slot c % slots at shared st, on bars[c % slots].
__device__ __forceinline__ void ring_fill(u32 st, const float* g, u32 nb, u32 sb, int slots,
                                          unsigned long long* bars, int c0, int c1) {
    for (int c = c0; c < c1; ++c)
        bulk_load(st + (u32)(c % slots) * sb, reinterpret_cast<const char*>(g) + (i64)c * sb,
                  min(sb, nb - (u32)c * sb), (u32)__cvta_generic_to_shared(bars + c % slots));
}

// keep_slice's keep over the nf 16-byte chunks at g (columns lo, lo + 4, ...), landed by the
// bulk copy engine in `slots` slots of `per` chunks at shared st: the CTA keeps from one slot
// while the copy engine fills the others, and thread 0 refills a slot once every thread is
// past it (one __syncthreads a slot). bars: the slots' mbarriers, initialised, no phase
// completed; `started`: the first min(slots, chunks) copies were started already. The stage
// is the case of one slot holding all nf chunks (started before the sample). Called by whole
// CTAs.
__device__ __forceinline__ void keep_ring(const float* __restrict__ g, int nf, int lo, u32 st, int slots, int per,
                                          unsigned long long* bars, bool started, u32 tau, u32* bkey, u32* bcol,
                                          u32 cap, u32* cnt, bool cl) {
    const u32 nb = 16u * (u32)nf, sb = 16u * (u32)per;
    const int nc = nf > 0 ? (int)((nb + sb - 1) / sb) : 0;
    if (!started && threadIdx.x == 0) ring_fill(st, g, nb, sb, slots, bars, 0, min(slots, nc));
    for (int c = 0; c < nc; ++c) {  // the same trip count in every thread
        const int sl = c % slots;
        stage_wait(bars + sl, (u32)(c / slots) & 1u);
        keep_staged(st + (u32)sl * sb, (int)(min(sb, nb - (u32)c * sb) >> 4), lo + c * 4 * per, tau, bkey, bcol,
                    cap, cnt, cl);
        if (c + slots < nc) {
            __syncthreads();  // every thread is past slot sl
            if (threadIdx.x == 0) ring_fill(st, g, nb, sb, slots, bars, c + slots, c + slots + 1);
        }
    }
}

extern "C" __global__ void __launch_bounds__(NT, 2) topk_split(
    const float* __restrict__ logits, i64 pitch, int width, const int* __restrict__ lens,
    const int* __restrict__ starts, const int* __restrict__ ends, int mode, int next_n, int k,
    int* __restrict__ out, int C, int buf, int words, int solo_max, int ordered, int stage PROFILE_PARAM) {
    extern __shared__ __align__(16) u32 split_smem[];
    __shared__ Scalars sc;
    PROFILE_START();
    STAMP(0);
    const u32 rank = C > 1 ? cluster_rank() : 0u;
    const int r = blockIdx.x / C;
    int s, L;
    row_window(mode, r, width, next_n, lens, starts, ends, s, L);
    int* orow = out + (i64)r * k;
    if (L <= k) {  // every column wins: the cluster's CTAs split the writes (no barrier)
        const int per = (k + C - 1) / C;
        const int j0 = (int)rank * per, j1 = min(j0 + per, k);
        for (int j = j0 + (int)threadIdx.x; j < j1; j += NT) orow[j] = j < L ? j : -1;
        return;
    }
    const float* x = logits + (i64)r * pitch + s;
    if (C == 1 || L <= solo_max) {  // CTA 0 alone (the same answer in every CTA of the row)
        if (rank == 0) solo_row(x, L, k, orow, split_smem, buf, words, ordered != 0, sc);
        return;
    }

    u32* h = split_smem;  // solo_row's layout (finish_row reads it)
    u32* h2 = h + BINS;
    u32* blt = h + 2 * BINS;
    u32* beq = blt + words;
    u32* bkey = beq + words;
    const u32 cap = (u32)buf / 2;
    u32* bcol = bkey + cap;
    const int ch = (int)(((((i64)L + C - 1) / C) + 3) & ~3LL);  // a multiple of 4: aligned slices
    const int lo = (int)min((i64)rank * ch, (i64)L), hi = (int)min((i64)lo + ch, (i64)L);
    __shared__ __align__(8) unsigned long long stage_bar[RING_MAX];
    __shared__ int stage_n;  // read back after the sample (not held in registers through it): the
    __shared__ int ring_n;   // staged chunks, or the ring's slots (0: not streamed)
    const u32 st = (u32)__cvta_generic_to_shared(bkey + buf);
    const bool sf = C < SAMPLE_FIRST_CTAS;  // the copies start behind the sample's loads
    {  // 16-byte chunks of the slice staged in the `stage` words after the buffer, or streamed
       // through them as a ring (slices of RING_MIN keys or more, when two slots fit); else
       // slices of KEEPB_MIN keys or more are read in batches; unaligned rows are not staged
        const bool al = (reinterpret_cast<unsigned long long>(x + lo) & 15) == 0;
        const int slots = al && hi - lo >= RING_MIN ? min(RING_MAX, stage / RING_SLOT) : 0;
        const int ring = slots >= 2 ? slots : 0;
        const int ns = !ring && hi - lo < KEEPB_MIN && al ? min((hi - lo) >> 2, stage >> 2) : 0;
        if (ns == 0) prefetch_first(x, lo, hi);
        if (threadIdx.x == 0) {
            stage_n = ns;
            ring_n = ring;
            if (ns > 0 && !sf) stage_start(bkey + buf, x + lo, 16u * (u32)ns, stage_bar);
            if (ns > 0 && sf) bar_init((u32)__cvta_generic_to_shared(stage_bar));  // copied in `issued`
            for (int b = 0; b < ring; ++b) bar_init((u32)__cvta_generic_to_shared(stage_bar + b));
        }
    }
    for (int b = threadIdx.x; b < 2 * BINS; b += NT) h[b] = 0;
    if (rank == 0 && ordered)  // the unordered plans have no bitmaps
        for (int b = threadIdx.x; b < (L + 31) >> 5; b += NT) blt[b] = beq[b] = 0;
    if (threadIdx.x == 0) {
        sc.cnt = 0;
        sc.kr = (u32)k;
    }
    __syncthreads();   // the counts and sc are set before this CTA's atomics (sample_tau's, keep_slice's)
    cluster_arrive();  // the leader's count is zero before any CTA adds to it (waited on below)

    // sf: the slice's bulk copies start once the sample's loads are issued, so that those loads
    // are not queued behind the copy (the one-shot stage, and the ring's first slots); clusters
    // of SAMPLE_FIRST_CTAS or more (one row's 16 CTAs: short slices) start them before the sample
    const u32 tau = sample_tau<true>(x, L, k, h2, sc, [&] {
        if (!sf || threadIdx.x != 0) return;
        const int n1 = stage_n, r1 = ring_n;
        if (r1) {
            const u32 nb = 16u * (u32)((hi - lo) >> 2), sb = 16u * (RING_SLOT / 4);
            ring_fill(st, x + lo, nb, sb, r1, stage_bar, 0, min(r1, (int)((nb + sb - 1) / sb)));
        } else if (n1 > 0) {
            bulk_load(st, reinterpret_cast<const char*>(x + lo), 16u * (u32)n1,
                      (u32)__cvta_generic_to_shared(stage_bar));
        }
    });
    STAMP(2);
    const int ns = stage_n, ring = ring_n;
    // the leader keeps straight into its buffer, through its count, by cluster-scope atomics
    // (the ring's slice, or the staged chunks as one slot, then the rest: the last 0-3 keys,
    // or the unstaged part of the slice)
    const int nr = ring ? (hi - lo) >> 2 : ns;
    keep_ring(x + lo, nr, lo, st, ring ? ring : 1, ring ? RING_SLOT / 4 : max(ns, 1), stage_bar, !ring || sf,
              tau, bkey, bcol, cap, &sc.cnt, rank == 0);
    keep_slice(x, lo + 4 * nr, hi, tau, bkey, bcol, cap, &sc.cnt, rank == 0);
    STAMP(6);
    if (rank == 0) {
        cluster_wait();
        cluster_arrive();
        cluster_wait();  // every CTA's keys are in the buffer, and the count is final
    } else {
        __syncthreads();  // this CTA's count is final
        cluster_wait();   // the leader has started (its count is zero)
        if (threadIdx.x == 0) sc.off = atomic_add_remote(remote_addr(&sc.cnt, 0), sc.cnt);
        __syncthreads();
        const u32 n = min(sc.cnt, cap), base = sc.off;
        for (u32 j = threadIdx.x; j < n && base + j < cap; j += NT) {
            store_remote(remote_addr(bkey + base + j, 0), bkey[j]);
            store_remote(remote_addr(bcol + base + j, 0), bcol[j]);
        }
        cluster_arrive();  // releases the copies to the leader
        cluster_wait();
        return;
    }
    STAMP(7);
    const u32 n = sc.cnt;
    if (n >= (u32)k && n <= cap)
        for (u32 j = threadIdx.x; j < n; j += NT) atomicAdd(h + (bkey[j] >> 21), 1u);
    __syncthreads();
    STAMP(1);
    finish_row(x, L, k, orow, split_smem, buf, words, n, false, ordered != 0, sc);
}
