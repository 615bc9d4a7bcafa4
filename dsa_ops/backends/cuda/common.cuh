// dsa_ops backend `cuda`: what the three kernels share (topk.cu, solo.cu and split.cu include
// it): types and launch constants, the PTX wrappers (cluster barrier, distributed shared
// memory, cluster-scope atomics), the per-CTA Scalars, CTA-wide scans, the digit choice over
// a few CTAs' histograms (choose_bin_a2a), the row visitors, read_slice, row_window and the
// profiling stamps. Design: docs/cuda-kernel.md §4; the files: docs/cuda-kernel.md §1 and §7.
//
// No system headers: NVRTC compiles the program as is, these files reaching it as named
// headers (dsa_ops/backends/cuda/topk.py); clusters are inline PTX.

#pragma once

// Constants are enumerators: NVRTC emits a namespace-scope constexpr variable as a device
// global (never read, but in the cubin).
enum : int { NT = 512 };           // threads a CTA
enum : int { NWARP = NT / 32 };
enum : int { BINS = 2048 };        // 11-bit digits (the last pass uses 1024 of them)
enum : int { U4 = 4 };             // float4 loads in flight a thread in a counting pass
enum : int { U1 = 16 };            // scalar loads in flight a thread (unaligned rows)

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

// Arrive at the cluster barrier, releasing this CTA's shared-memory writes to the cluster: a
// CTA barrier, then one thread's cluster-scope fence (cumulative over what the CTA barrier
// ordered before it) and a relaxed arrive (barrier.cluster.arrive.release instead makes
// ptxas emit a GPU-scope MEMBAR).
__device__ __forceinline__ void cluster_arrive() {
    __syncthreads();
    if (threadIdx.x == 0) asm volatile("fence.acq_rel.cluster;" ::: "memory");
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ void cluster_sync() {
    cluster_arrive();
    cluster_wait();
}

// Profiling stamps, in lab builds only: -DDSA_OPS_PROFILE=1 stamps the SM's clock64, =2 the
// global nanosecond timer (comparable across CTAs). A lab build's entry points take one more
// parameter after the others (PROFILE_PARAM: the stamp buffer, grid x 16 int64, or null), which
// thread 0 keeps in shared memory (PROFILE_START); STAMP(i): thread 0 writes stamp i of its CTA
// there. The shipped build has neither the parameter nor the stamps (the host plan knows which
// build it launches: dsa_ops/backends/cuda/topk.py).
#ifdef DSA_OPS_PROFILE
__shared__ unsigned long long* stamp_out;  // read by thread 0 only, which set it
__device__ __forceinline__ long long stamp_now() {
#if DSA_OPS_PROFILE == 2
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return (long long)t;
#else
    return clock64();
#endif
}
#define PROFILE_PARAM , unsigned long long* __restrict__ stamps
#define PROFILE_START() \
    if (threadIdx.x == 0) stamp_out = stamps
#define STAMP(i) \
    if (threadIdx.x == 0 && stamp_out != nullptr) stamp_out[(i64)blockIdx.x * 16 + (i)] = stamp_now();
#else
#define PROFILE_PARAM
#define PROFILE_START()
#define STAMP(i)
#endif

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

__device__ __forceinline__ void store_remote(u32 addr, u32 v) {
    asm volatile("st.shared::cluster.u32 [%0], %1;" :: "r"(addr), "r"(v) : "memory");
}

// atomicAdd at cluster scope on this CTA's shared word p (other CTAs of the cluster add to
// it too, through atomic_add_remote), and on CTA-shared address `addr` of another CTA.
__device__ __forceinline__ u32 atomic_add_cluster(u32* p, u32 v) {
    u32 old;
    asm volatile("atom.relaxed.cluster.shared::cta.add.u32 %0, [%1], %2;"
                 : "=r"(old) : "r"((u32)__cvta_generic_to_shared(p)), "r"(v) : "memory");
    return old;
}

__device__ __forceinline__ u32 atomic_add_remote(u32 addr, u32 v) {
    u32 old;
    asm volatile("atom.relaxed.cluster.shared::cluster.add.u32 %0, [%1], %2;" : "=r"(old) : "r"(addr), "r"(v) : "memory");
    return old;
}

// *p = v in CTA `cta`'s copy of this shared variable (a plain store when it is this CTA).
__device__ __forceinline__ void put(u32* p, u32 cta, u32 self, u32 v) {
    if (cta == self) *p = v;
    else store_remote(remote_addr(p, cta), v);
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
    u32 slice[3]; // reduce-scatter: this CTA's sum of its slice of the bins, a pass
    u32 qs, kq;   // the slice holding the wanted key, and the keys wanted inside it
    u32 binsz;    // the row's count of keys in the chosen bin
    u32 off;      // this CTA's first slot in the leader's candidate buffer
    u32 T;        // the k-th key (set by the leader)
    u32 ltc[16];  // leader: each CTA's keys below the first-digit bin (written by that CTA)
    u32 offc[16]; // leader: where each CTA's candidates start (written by that CTA)
    u32 pfl[16], pfe[16];  // leader: each CTA's candidates < T and == T
    u32 wa[NWARP], wl[NWARP], we[NWARP], wbase[NWARP], wtake[NWARP];  // unstaged rows: per warp run
    u32 wsum[2 * NWARP];
    u32 slot[2];  // solo_row.cuh's unordered emission: slots taken by keys < T, keys == T
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

__device__ __forceinline__ void add_own_below(const u32* h, Scalars& sc);

// Exclusive scans of two values a thread over the CTA at once. Two barriers.
__device__ __forceinline__ void block_scan2(u32& a, u32& b, u32* wsum) {
    u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 x = a, y = b;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        u32 xa = __shfl_up_sync(0xFFFFFFFFu, x, d), yb = __shfl_up_sync(0xFFFFFFFFu, y, d);
        if (lane >= (u32)d) { x += xa; y += yb; }
    }
    if (lane == 31) { wsum[warp] = x; wsum[NWARP + warp] = y; }
    __syncthreads();
    u32 wa = lane < NWARP ? wsum[lane] : 0u, wb = lane < NWARP ? wsum[NWARP + lane] : 0u, ia = wa, ib = wb;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        u32 xa = __shfl_up_sync(0xFFFFFFFFu, ia, d), yb = __shfl_up_sync(0xFFFFFFFFu, ib, d);
        if (lane >= (u32)d) { ia += xa; ib += yb; }
    }
    a = __shfl_sync(0xFFFFFFFFu, ia - wa, warp) + x - a;
    b = __shfl_sync(0xFFFFFFFFu, ib - wb, warp) + y - b;
    __syncthreads();
}

// After a cluster barrier: sum the C histograms `h` (bins [4t, 4t + 4) a thread), find the
// bin where the running count reaches sc.kr, store it in sc.bin and the keys still wanted
// inside it in sc.kr, and add this CTA's keys in lower bins to sc.lt.
__device__ void choose_bin_a2a(const u32* h, u32 C, u32 rank, Scalars& sc, bool own_below = true) {
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
        sc.binsz = b == t4 ? v.x : (b == t4 + 1 ? v.y : (b == t4 + 2 ? v.z : v.w));
    }
    __syncthreads();
    if (own_below) add_own_below(h, sc);
}

// This CTA's keys in bins below sc.bin of its own histogram, added to sc.lt.
__device__ __forceinline__ void add_own_below(const u32* h, Scalars& sc) {
    u32 b = sc.bin, t4 = 4 * threadIdx.x;
    uint4 own = *reinterpret_cast<const uint4*>(h + t4);
    u32 mine = (t4 < b ? own.x : 0u) + (t4 + 1 < b ? own.y : 0u) + (t4 + 2 < b ? own.z : 0u) +
               (t4 + 3 < b ? own.w : 0u);
#pragma unroll
    for (int d = 16; d; d >>= 1) mine += __shfl_xor_sync(0xFFFFFFFFu, mine, d);
    if ((threadIdx.x & 31) == 0 && mine) atomicAdd(&sc.lt, mine);
}

// Every column i in [lo, hi) of row x (window-relative), called by whole warps the same
// number of times (ok false past hi), so the callbacks may use warp votes: f4(i, ok, keys)
// for the four keys i..i+3 of each 16-byte load when x + lo is 16-byte aligned, and
// f1(i, ok, key) for the last 0-3 keys (warp 0) and for every key of an unaligned row.
template <class F4, class F1>
__device__ __forceinline__ void visit_row(const float* __restrict__ x, int lo, int hi, F4&& f4, F1&& f1) {
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
                f4(lo + 4 * j, j < nf,
                   make_uint4(order_key(v[u].x), order_key(v[u].y), order_key(v[u].z), order_key(v[u].w)));
            }
        }
        if (threadIdx.x < 32) {  // the last 0-3 keys, by warp 0
            int i = lo + 4 * nf + (int)threadIdx.x;
            bool ok = i < hi;
            f1(i, ok, ok ? order_key(__ldg(x + i)) : 0u);
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
                f1(i, i < hi, order_key(v[u]));
            }
        }
    }
}

// f(i, ok, key) for every column of the row, one key at a time (see visit_row).
template <class F>
__device__ __forceinline__ void visit_global(const float* __restrict__ x, int lo, int hi, F&& f) {
    visit_row(x, lo, hi, [&](int i, bool ok, uint4 q) {
        f(i, ok, q.x);
        f(i + 1, ok, q.y);
        f(i + 2, ok, q.z);
        f(i + 3, ok, q.w);
    }, f);
}

// f(key) for the n staged keys, two 16-byte shared loads a thread in flight.
template <class F>
__device__ __forceinline__ void visit_stage(const u32* stage, int n, F&& f) {
    const uint4* p = reinterpret_cast<const uint4*>(stage);
    int nq = n >> 2;
    for (int j = threadIdx.x; j < nq; j += 2 * NT) {
        uint4 q0 = p[j], q1 = j + NT < nq ? p[j + NT] : make_uint4(0, 0, 0, 0);
        f(4 * j, q0.x); f(4 * j + 1, q0.y); f(4 * j + 2, q0.z); f(4 * j + 3, q0.w);
        if (j + NT < nq) {
            int i = 4 * (j + NT);
            f(i, q1.x); f(i + 1, q1.y); f(i + 2, q1.z); f(i + 3, q1.w);
        }
    }
    if ((int)threadIdx.x < (n & 3)) f(4 * nq + (int)threadIdx.x, stage[4 * nq + threadIdx.x]);
}

// Pass 1: the 11-bit histogram of the slice's keys [lo, hi) into h, and the keys into the
// stage (when not null; 16-byte stores where the row is aligned).
__device__ void read_slice(const float* __restrict__ x, int lo, int hi, u32* h, u32* stage) {
    visit_row(x, lo, hi, [&](int i, bool ok, uint4 q) {
        if (ok) {
            atomicAdd(h + (q.x >> 21), 1u);
            atomicAdd(h + (q.y >> 21), 1u);
            atomicAdd(h + (q.z >> 21), 1u);
            atomicAdd(h + (q.w >> 21), 1u);
            if (stage) *reinterpret_cast<uint4*>(stage + (i - lo)) = q;
        }
    }, [&](int i, bool ok, u32 key) {
        if (ok) {
            atomicAdd(h + (key >> 21), 1u);
            if (stage) stage[i - lo] = key;
        }
    });
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
