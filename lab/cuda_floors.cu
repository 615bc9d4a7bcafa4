// Floors of a native decode top-k on Hopper: each kernel is one step of the chain (a launch,
// a cluster launch, one read of a row with a 2048-bin histogram of the top 11 key bits, and
// the exchange of the histograms between the CTAs that split a row). Measured by
// lab/cuda_floors.py, which checks every kernel against torch first.
//
// No headers: NVRTC compiles this as is (cluster and PDL steps are inline PTX).
// Rows are 16-byte aligned (pitch % 4 == 0): reads are float4, and never reach column L.

#define BINS 2048
#define SHIFT 21  // 32 - 11: the top 11 bits of the order key

// Contract key: sign clear -> bits ^ 0x7FFFFFFF, sign set -> bits; the smallest keys win.
__device__ __forceinline__ unsigned order_key(float f) {
    unsigned b = __float_as_uint(f);
    return b ^ (((b >> 31) - 1u) & 0x7FFFFFFFu);
}

__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

__device__ __forceinline__ unsigned cluster_size() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
    return r;
}

// Every thread of every CTA of the cluster: release this CTA's shared-memory writes, wait
// for all, acquire theirs.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The shared::cluster address of `p` (this CTA's shared memory) in CTA `cta` of the cluster.
__device__ __forceinline__ unsigned remote_addr(const void* p, unsigned cta) {
    unsigned long long g = reinterpret_cast<unsigned long long>(p);
    unsigned long long s;
    asm volatile("cvta.to.shared.u64 %0, %1;" : "=l"(s) : "l"(g));
    unsigned r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"((unsigned)s), "r"(cta));
    return r;
}

__device__ __forceinline__ unsigned load_remote(unsigned addr) {
    unsigned v;
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
    return v;
}

// MODE 0: one shared atomic a key; 1: keys of a warp with the same bin merged first
// (__match_any_sync), one atomic a group; 2: no histogram, count keys with bin < 1024
// (the read alone; the count lands in bin 0). Lanes past the range use bin BINS, a spare
// slot, so whole warps always take part in the match.
template <int MODE>
__device__ __forceinline__ void count_key(unsigned* h, float v, bool ok, unsigned& c) {
    unsigned bin = ok ? (order_key(v) >> SHIFT) : BINS;
    if (MODE == 0) {
        if (ok) atomicAdd(h + bin, 1u);
    } else if (MODE == 1) {
        unsigned peers = __match_any_sync(0xFFFFFFFFu, bin);
        if ((threadIdx.x & 31) == __ffs(peers) - 1 && bin < BINS) atomicAdd(h + bin, __popc(peers));
    } else {
        c += bin < 1024;
    }
}

// Histogram of row[lo, hi) into h (lo a multiple of 4). Every thread runs the same number
// of steps (warp-uniform loop); U float4 loads are issued before any is used.
template <int MODE, int U>
__device__ void hist_range(const float* __restrict__ row, int lo, int hi, unsigned* h) {
    const float4* p = reinterpret_cast<const float4*>(row + lo);
    int n = hi > lo ? hi - lo : 0;
    int nf = n >> 2;
    unsigned c = 0;
    for (int base = 0; base < nf; base += blockDim.x * U) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            int j = base + u * blockDim.x + threadIdx.x;
            v[u] = j < nf ? __ldcs(p + j) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            bool ok = base + u * (int)blockDim.x + (int)threadIdx.x < nf;
            count_key<MODE>(h, v[u].x, ok, c);
            count_key<MODE>(h, v[u].y, ok, c);
            count_key<MODE>(h, v[u].z, ok, c);
            count_key<MODE>(h, v[u].w, ok, c);
        }
    }
    if (threadIdx.x < 32) {  // the 0-3 keys after the last whole float4, by one warp
        int t = lo + 4 * nf + (int)threadIdx.x;
        bool ok = t < hi;
        count_key<MODE>(h, ok ? row[t] : 0.f, ok, c);
    }
    if (MODE == 2 && c) atomicAdd(h, c);
}

__device__ __forceinline__ void zero_hist(unsigned* h) {
    for (int b = threadIdx.x; b <= BINS; b += blockDim.x) h[b] = 0;
}

// One CTA a row: read [0, L), histogram, write the 2048 bins.
template <int MODE>
__device__ void hist_cta(const float* x, int pitch, const int* lens, unsigned* out) {
    __shared__ unsigned h[BINS + 1];
    int row = blockIdx.x;
    int L = lens[row];
    zero_hist(h);
    __syncthreads();
    hist_range<MODE, 4>(x + (long long)row * pitch, 0, L, h);
    __syncthreads();
    for (int b = threadIdx.x; b < BINS; b += blockDim.x) out[(long long)row * BINS + b] = h[b];
}

// A cluster of N CTAs a row: each reads 1/N of the row into its own histogram; after a
// cluster barrier CTA r sums bins [r*BINS/N, (r+1)*BINS/N) over the N histograms through
// distributed shared memory and writes them; a second barrier keeps every CTA's shared
// memory alive until the others have read it.
template <int MODE>
__device__ void hist_cluster(const float* x, int pitch, const int* lens, unsigned* out) {
    __shared__ unsigned h[BINS + 1];
    unsigned n = cluster_size(), rank = cluster_rank();
    int row = blockIdx.x / n;
    int L = lens[row];
    int slice = (((L + (int)n - 1) / (int)n) + 3) & ~3;
    int lo = min((int)rank * slice, L), hi = min(lo + slice, L);
    zero_hist(h);
    __syncthreads();
    hist_range<MODE, 4>(x + (long long)row * pitch, lo, hi, h);
    cluster_sync();
    int per = BINS / n;
    for (int b = rank * per + threadIdx.x; b < (int)(rank + 1) * per; b += blockDim.x) {
        unsigned s = 0;
        for (unsigned c = 0; c < n; ++c) s += load_remote(remote_addr(h + b, c));
        out[(long long)row * BINS + b] = s;
    }
    cluster_sync();
}

// N plain CTAs a row (no cluster): each adds its non-zero bins to the row's global
// histogram (ws), then one atomic counts the arrivals; the last CTA to arrive copies the
// total out and restores ws and the counter to zero (so a graph replay needs no memset).
template <int MODE>
__device__ void hist_last(const float* x, int pitch, const int* lens, int nsplit, unsigned* ws, unsigned* cnt,
                          unsigned* out) {
    __shared__ unsigned h[BINS + 1];
    __shared__ int last;
    int row = blockIdx.x / nsplit, rank = blockIdx.x % nsplit;
    int L = lens[row];
    int slice = (((L + nsplit - 1) / nsplit) + 3) & ~3;
    int lo = min(rank * slice, L), hi = min(lo + slice, L);
    zero_hist(h);
    __syncthreads();
    hist_range<MODE, 4>(x + (long long)row * pitch, lo, hi, h);
    __syncthreads();
    unsigned* w = ws + (long long)row * BINS;
    for (int b = threadIdx.x; b < BINS; b += blockDim.x)
        if (h[b]) atomicAdd(w + b, h[b]);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(cnt + row, 1u) == (unsigned)nsplit - 1;
    __syncthreads();
    if (last) {
        __threadfence();
        for (int b = threadIdx.x; b < BINS; b += blockDim.x) {
            out[(long long)row * BINS + b] = __ldcg(w + b);
            w[b] = 0;
        }
        if (threadIdx.x == 0) cnt[row] = 0;
    }
}

#define HIST_KERNELS(MODE, NAME)                                                                         \
    extern "C" __global__ void __launch_bounds__(1024) hist_cta_##NAME(const float* x, int pitch,         \
                                                                        const int* lens, unsigned* out) { \
        hist_cta<MODE>(x, pitch, lens, out);                                                             \
    }                                                                                                    \
    extern "C" __global__ void __launch_bounds__(1024) hist_cluster_##NAME(                              \
        const float* x, int pitch, const int* lens, unsigned* out) {                                     \
        hist_cluster<MODE>(x, pitch, lens, out);                                                         \
    }                                                                                                    \
    extern "C" __global__ void __launch_bounds__(1024) hist_last_##NAME(                                 \
        const float* x, int pitch, const int* lens, int nsplit, unsigned* ws, unsigned* cnt,             \
        unsigned* out) {                                                                                 \
        hist_last<MODE>(x, pitch, lens, nsplit, ws, cnt, out);                                           \
    }

HIST_KERNELS(0, atomic)
HIST_KERNELS(1, match)
HIST_KERNELS(2, read)

// A launch and nothing else (one store, so the check can see that it ran).
extern "C" __global__ void empty(int* out) {
    if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = 1;
}

// A cluster launch: each CTA stores (cluster size << 8 | rank), after one cluster barrier if `sync`.
extern "C" __global__ void empty_cluster(int* out, int sync) {
    if (sync) cluster_sync();
    if (threadIdx.x == 0) out[blockIdx.x] = (int)(cluster_size() << 8 | cluster_rank());
}

// Programmatic dependent launch: `first` lets its dependent start early; `second` waits for
// first's completion and memory (griddepcontrol.wait) before reading what first wrote.
extern "C" __global__ void pdl_first(int* out) {
    if (threadIdx.x == 0) out[0] = 1;
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

extern "C" __global__ void pdl_second(int* out) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (threadIdx.x == 0) out[1] = out[0] + 1;
}
