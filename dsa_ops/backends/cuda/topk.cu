// dsa_ops backend `cuda`: the exact top-k of contract §1 (docs/contract.md) for decode and
// prefill rows, one kernel. Design: docs/cuda-kernel.md §4.
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
//
// No headers: NVRTC compiles this as is; clusters are inline PTX.

#define NT 512                 // threads a CTA
#define NWARP (NT / 32)
#define BINS 2048              // 11-bit digits (the last pass uses 1024 of them)
#define E 8                    // keys a lane holds in an emission tile
#define TILE (NT * E)
#define U4 4                   // float4 loads in flight a thread in a counting pass
#define U1 16                  // scalar loads in flight a thread (unaligned rows)

typedef unsigned int u32;
typedef long long i64;

// Contract §1.3: sign clear -> bits ^ 0x7FFFFFFF, sign set -> bits; the smallest keys win.
__device__ __forceinline__ u32 order_key(float f) {
    u32 b = __float_as_uint(f);
    return b ^ (((b >> 31) - 1u) & 0x7FFFFFFFu);
}

__device__ __forceinline__ u32 cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

__device__ __forceinline__ void cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}

__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ void cluster_sync() {
    cluster_arrive();
    cluster_wait();
}

// The shared::cluster address of `p` (in this CTA's shared memory) in CTA `cta`.
__device__ __forceinline__ u32 remote_addr(const void* p, u32 cta) {
    u32 s = (u32)__cvta_generic_to_shared(p);
    u32 r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(s), "r"(cta));
    return r;
}

__device__ __forceinline__ u32 load_remote(u32 addr) {
    u32 v;
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
    return v;
}

__device__ __forceinline__ uint4 load_remote4(u32 addr) {
    uint4 v;
    asm volatile("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
    return v;
}

__device__ __forceinline__ u32 lanemask_lt() {
    u32 m;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
    return m;
}

// Per-CTA scalars, in static shared memory (the exchange pair is read by other CTAs).
struct Scalars {
    u32 bin;      // the digit chosen by the last pass
    u32 kr;       // keys still wanted inside that digit's bin
    u32 lt;       // this CTA's keys below the prefix chosen so far (accumulated per pass)
    u32 cnt;      // collected candidates
    u32 collect;  // every CTA's first-digit bin fits its candidate buffer
    u32 base;     // this CTA's first output slot
    u32 taken;    // ties this CTA takes
    u32 xchg[2];  // (lt, eq) of this CTA, read by the CTAs after it
    u32 wsum[2 * NWARP];
};

// Exclusive scan of one value a thread over the CTA; `total` gets the sum. Two barriers.
__device__ __forceinline__ u32 block_scan(u32 v, u32* wsum, u32& total) {
    u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 x = v;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        u32 y = __shfl_up_sync(0xFFFFFFFFu, x, d);
        if (lane >= (u32)d) x += y;
    }
    if (lane == 31) wsum[warp] = x;
    __syncthreads();
    u32 w = lane < NWARP ? wsum[lane] : 0u, wi = w;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        u32 y = __shfl_up_sync(0xFFFFFFFFu, wi, d);
        if (lane >= (u32)d) wi += y;
    }
    u32 before = __shfl_sync(0xFFFFFFFFu, wi - w, warp);
    total = __shfl_sync(0xFFFFFFFFu, wi, NWARP - 1);
    __syncthreads();  // wsum may be reused
    return before + x - v;
}

// After a cluster barrier: sum the C histograms `h` (bins [4t, 4t + 4) a thread), find the
// bin where the running count reaches sc.kr, store it in sc.bin and the keys still wanted
// inside it in sc.kr, and add this CTA's keys in lower bins to sc.lt.
__device__ void choose_bin(const u32* h, u32 C, u32 rank, Scalars& sc) {
    u32 kr = sc.kr;
    u32 t4 = 4 * threadIdx.x;
    uint4 own = *reinterpret_cast<const uint4*>(h + t4);
    uint4 v = own, q[16];
#pragma unroll
    for (u32 c = 0; c < 16; ++c)  // every load issued before the first sum waits on one
        if (c < C && c != rank) q[c] = load_remote4(remote_addr(h + t4, c));
#pragma unroll
    for (u32 c = 0; c < 16; ++c)
        if (c < C && c != rank) { v.x += q[c].x; v.y += q[c].y; v.z += q[c].z; v.w += q[c].w; }
    u32 total;
    u32 s = v.x + v.y + v.z + v.w;
    u32 before = block_scan(s, sc.wsum, total);
    if (before < kr && kr <= before + s) {
        u32 c0 = before, b = t4;
        if (kr > c0 + v.x) { c0 += v.x; ++b;
            if (kr > c0 + v.y) { c0 += v.y; ++b;
                if (kr > c0 + v.z) { c0 += v.z; ++b; } } }
        sc.bin = b;
        sc.kr = kr - c0;
    }
    __syncthreads();
    u32 b = sc.bin;
    u32 mine = (t4 < b ? own.x : 0u) + (t4 + 1 < b ? own.y : 0u) + (t4 + 2 < b ? own.z : 0u) +
               (t4 + 3 < b ? own.w : 0u);
#pragma unroll
    for (int d = 16; d; d >>= 1) mine += __shfl_xor_sync(0xFFFFFFFFu, mine, d);
    if ((threadIdx.x & 31) == 0 && mine) atomicAdd(&sc.lt, mine);
}

// f(i, ok, key) for every i in [lo, hi) of row x (window-relative), called by whole warps
// the same number of times (ok false past hi), so f may use warp votes.
template <class F>
__device__ __forceinline__ void visit_global(const float* __restrict__ x, int lo, int hi, F&& f) {
    int n = hi - lo;
    if (n <= 0) return;
    if ((reinterpret_cast<unsigned long long>(x + lo) & 15) == 0) {
        const float4* p = reinterpret_cast<const float4*>(x + lo);
        int nf = n >> 2;
        for (int base = 0; base < nf; base += NT * U4) {
            float4 v[U4];
#pragma unroll
            for (int u = 0; u < U4; ++u) {
                int j = base + u * NT + (int)threadIdx.x;
                v[u] = j < nf ? __ldg(p + j) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int u = 0; u < U4; ++u) {
                int j = base + u * NT + (int)threadIdx.x;
                bool ok = j < nf;
                int i = lo + 4 * j;
                f(i, ok, order_key(v[u].x));
                f(i + 1, ok, order_key(v[u].y));
                f(i + 2, ok, order_key(v[u].z));
                f(i + 3, ok, order_key(v[u].w));
            }
        }
        if (threadIdx.x < 32) {  // the last 0-3 keys, by warp 0
            int i = lo + 4 * nf + (int)threadIdx.x;
            bool ok = i < hi;
            f(i, ok, ok ? order_key(__ldg(x + i)) : 0u);
        }
    } else {
        for (int base = lo; base < hi; base += NT * U1) {
            float v[U1];
#pragma unroll
            for (int u = 0; u < U1; ++u) {
                int i = base + u * NT + (int)threadIdx.x;
                v[u] = i < hi ? __ldg(x + i) : 0.f;
            }
#pragma unroll
            for (int u = 0; u < U1; ++u) {
                int i = base + u * NT + (int)threadIdx.x;
                f(i, i < hi, order_key(v[u]));
            }
        }
    }
}

// Ordered emission of this CTA's winners: keys < T, and the first `taken` keys == T, in
// ascending column order, to orow[base + rank among them]. Keys come from the shared stage
// (STAGED) or from the row. Two CTA barriers a tile of TILE keys.
template <bool STAGED>
__device__ void emit(const float* __restrict__ x, const u32* stage, int lo, int hi, u32 T, u32 taken,
                     u32 base, int* __restrict__ orow, u32* wsum) {
    u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, lm = lanemask_lt();
    u32 carry_lt = 0, carry_eq = 0;
    for (int t0 = lo; t0 < hi; t0 += TILE) {
        int seg = t0 + (int)warp * 32 * E + (int)lane;
        u32 key[E];
#pragma unroll
        for (int e = 0; e < E; ++e) {
            int i = seg + e * 32;
            if (STAGED) key[e] = i < hi ? stage[i - lo] : 0u;
            else key[e] = i < hi ? order_key(__ldg(x + i)) : 0u;
        }
        u32 bl[E], be[E], wl = 0, we = 0;
#pragma unroll
        for (int e = 0; e < E; ++e) {
            bool ok = seg + e * 32 < hi;
            bl[e] = __ballot_sync(0xFFFFFFFFu, ok && key[e] < T);
            be[e] = __ballot_sync(0xFFFFFFFFu, ok && key[e] == T);
            wl += __popc(bl[e]);
            we += __popc(be[e]);
        }
        if (lane == 0) {
            wsum[warp] = wl;
            wsum[NWARP + warp] = we;
        }
        __syncthreads();
        u32 pl = lane < NWARP ? wsum[lane] : 0u, pe = lane < NWARP ? wsum[NWARP + lane] : 0u;
        u32 il = pl, ie = pe;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            u32 yl = __shfl_up_sync(0xFFFFFFFFu, il, d), ye = __shfl_up_sync(0xFFFFFFFFu, ie, d);
            if (lane >= (u32)d) { il += yl; ie += ye; }
        }
        u32 lt_b = carry_lt + __shfl_sync(0xFFFFFFFFu, il - pl, warp);
        u32 eq_b = carry_eq + __shfl_sync(0xFFFFFFFFu, ie - pe, warp);
        carry_lt += __shfl_sync(0xFFFFFFFFu, il, NWARP - 1);
        carry_eq += __shfl_sync(0xFFFFFFFFu, ie, NWARP - 1);
#pragma unroll
        for (int e = 0; e < E; ++e) {
            u32 a = lt_b + __popc(bl[e] & lm);
            u32 t = eq_b + __popc(be[e] & lm);
            if ((bl[e] >> lane) & 1u) orow[base + a + min(t, taken)] = seg + e * 32;
            else if (((be[e] >> lane) & 1u) && t < taken) orow[base + a + t] = seg + e * 32;
            lt_b += __popc(bl[e]);
            eq_b += __popc(be[e]);
        }
        __syncthreads();  // wsum is rewritten by the next tile
    }
}

// mode 0: decode, one length a row (lens[r]); 1: decode, one a request (lens[r / next_n]
// - next_n + 1 + r % next_n); 2: prefill, window [starts[r], ends[r]). Lengths are clamped
// to [0, width] in 64-bit arithmetic (contract §1.1, §1.4).
__device__ __forceinline__ void row_window(int mode, int r, int width, int next_n, const int* lens,
                                           const int* starts, const int* ends, int& s, int& L) {
    i64 a = 0, b;
    if (mode == 2) {
        a = starts[r];
        b = ends[r];
        a = a < 0 ? 0 : (a > width ? width : a);
        b = b < 0 ? 0 : (b > width ? width : b);
    } else if (mode == 1) {
        b = (i64)lens[r / next_n] - next_n + 1 + r % next_n;
    } else {
        b = lens[r];
    }
    i64 n = b - a;
    n = n < 0 ? 0 : (n > width - a ? width - a : n);
    s = (int)a;
    L = (int)n;
}

extern "C" __global__ void __launch_bounds__(NT) topk_rows(
    const float* __restrict__ logits, i64 pitch, int width, const int* __restrict__ lens,
    const int* __restrict__ starts, const int* __restrict__ ends, int mode, int next_n, int k,
    int* __restrict__ out, int C, int stage_keys) {
    extern __shared__ __align__(16) u32 smem[];
    __shared__ Scalars sc;
    u32* h0 = smem;
    u32* h1 = smem + BINS;
    u32* stage = smem + 2 * BINS;
    const u32 cap = (u32)stage_keys / 2;  // candidates (key, column) when the slice is not staged
    u32* ckey = stage;
    u32* ccol = stage + cap;

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
    const int ch = (int)(((((i64)L + C - 1) / C) + 3) & ~3LL);
    const int lo = (int)min((i64)rank * ch, (i64)L), hi = (int)min((i64)lo + ch, (i64)L);
    const bool staged = ch <= stage_keys;  // the same answer in every CTA of the row

    for (int b = threadIdx.x; b < 2 * BINS; b += NT) smem[b] = 0;
    if (threadIdx.x == 0) {
        sc.kr = (u32)k;
        sc.lt = 0;
        sc.cnt = 0;
    }
    __syncthreads();

    // Pass 1: bits 31..21 of every key of the slice (kept in the stage when it fits).
    visit_global(x, lo, hi, [&](int i, bool ok, u32 key) {
        if (ok) {
            atomicAdd(h0 + (key >> 21), 1u);
            if (staged) stage[i - lo] = key;
        }
    });
    cluster_sync();
    choose_bin(h0, C, rank, sc);
    const u32 b1 = sc.bin;
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
        bool m = ok && (key >> 21) == b1;
        if (m) atomicAdd(h1 + ((key >> 10) & 0x7FFu), 1u);
        if (collect) {
            u32 vote = __ballot_sync(0xFFFFFFFFu, m);
            if (vote) {
                u32 lane = threadIdx.x & 31, lead = __ffs(vote) - 1, pos = 0;
                if (lane == lead) pos = atomicAdd(&sc.cnt, (u32)__popc(vote));
                pos = __shfl_sync(0xFFFFFFFFu, pos, lead) + __popc(vote & lanemask_lt());
                if (m) {
                    ckey[pos] = key;
                    ccol[pos] = (u32)i;
                }
            }
        }
    };
    if (staged) {
        for (int j = threadIdx.x; j < hi - lo; j += NT) count2(lo + j, true, stage[j]);
    } else {
        visit_global(x, lo, hi, count2);
    }
    cluster_sync();
    choose_bin(h1, C, rank, sc);
    const u32 p2 = (b1 << 11) | sc.bin;

    // Pass 3: bits 9..0 of the keys whose first 22 bits are p2 (into h0: every CTA has
    // read it, since all of them passed the barrier above after pass 1's choice).
    for (int b = threadIdx.x; b < BINS; b += NT) h0[b] = 0;
    __syncthreads();
    auto count3 = [&](int, bool ok, u32 key) {
        if (ok && (key >> 10) == p2) atomicAdd(h0 + (key & 0x3FFu), 1u);
    };
    if (staged) {
        for (int j = threadIdx.x; j < hi - lo; j += NT) count3(0, true, stage[j]);
    } else if (collect) {
        int n = (int)sc.cnt;
        for (int j = threadIdx.x; j < n; j += NT) count3(0, true, ckey[j]);
    } else {
        visit_global(x, lo, hi, count3);
    }
    cluster_sync();
    choose_bin(h0, C, rank, sc);
    const u32 T = (p2 << 10) | sc.bin;
    const u32 need = sc.kr;  // keys equal to T the row takes, lowest columns first
    __syncthreads();         // sc.lt is complete

    // Exchange (keys < T, keys == T) with the cluster: CTA q starts after CTAs 0..q-1.
    if (threadIdx.x == 0) {
        sc.xchg[0] = sc.lt;
        sc.xchg[1] = h0[sc.bin];
    }
    cluster_sync();
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
    cluster_arrive();  // done reading the other CTAs' shared memory
    __syncthreads();
    const u32 base = sc.base, taken = sc.taken;
    if (staged) emit<true>(x, stage, lo, hi, T, taken, base, orow, sc.wsum);
    else emit<false>(x, stage, lo, hi, T, taken, base, orow, sc.wsum);
    cluster_wait();  // no CTA leaves while another may still read its shared memory
}
