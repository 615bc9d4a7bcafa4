// dsa_ops backend `cuda`: one CTA a row, for prefill chunks and batches of more rows than
// multiprocessors (docs/cuda-kernel.md §4.2): the entry point topk_solo; the select is
// solo_row.cuh's solo_row.

#include "common.cuh"
#include "solo_row.cuh"

extern "C" __global__ void __launch_bounds__(NT, 2) topk_solo(
    const float* __restrict__ logits, i64 pitch, int width, const int* __restrict__ lens,
    const int* __restrict__ starts, const int* __restrict__ ends, int mode, int next_n, int k,
    int* __restrict__ out, int buf, int words, int ordered PROFILE_PARAM) {
    extern __shared__ __align__(16) u32 solo_smem[];
    __shared__ Scalars sc;
    PROFILE_START();
    STAMP(0);
    const int r = blockIdx.x;
    int s, L;
    row_window(mode, r, width, next_n, lens, starts, ends, s, L);
    int* orow = out + (i64)r * k;
    if (L <= k) {
        for (int j = threadIdx.x; j < k; j += NT) orow[j] = j < L ? j : -1;
        return;
    }
    solo_row(logits + (i64)r * pitch + s, L, k, orow, solo_smem, buf, words, ordered != 0, sc);
}
