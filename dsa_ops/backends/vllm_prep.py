"""The per-call work the vLLM adapters do around a kernel, in at most one launch.

Contract §1.1 wants every row's length clamped to [0, W], from either lengths layout
(one per row, or one per request with ``next_n``), and ``vllm_cooperative`` wants its
output filled with -1 first (the kernel may leave slots unwritten). Done with torch ops
that is three to four kernels (cast, clamp, cast back, fill): several microseconds per
call in a CUDA graph, as much as the top-k itself at 4K. Here it is one Triton program
per row that writes the row's clamped int32 length and, when asked, fills the row's
output with -1.

:func:`kernel_reads_as_is` says when no launch is needed at all: ``persistent_topk``'s own
paths clamp every length to [0, min(stride, max_seq_len)] for the row counts named there,
so a per-row int32 contiguous ``lengths`` can go to the kernel untouched.

Off CUDA, or where Triton does not import, the same values come from torch ops
(:func:`dsa_ops.backends.rows.decode_ends`); that path is what the CPU tests' doubles see.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from dsa_ops.backends.rows import decode_ends

# persistent_topk (vLLM 0.33.0, csrc/topk.cu): rows <= 32 run persistent_topk_kernel, which
# clamps a length to [0, min(stride, max_seq_len)]; rows > 64 with max_seq_len at or above
# sampled_topk's kMinSampledLength run sampled_topk_kernel, which clamps to
# [0, min(max_seq_len, W)]. Rows 33..64 (and shorter max_seq_len above 64 rows) run
# FilteredTopK, which reads lengths unclamped. (Those row splits hold on GPUs with at
# least 144 KiB of shared memory per block: SM80, SM90, SM100. With less than 128 KiB
# every row count runs persistent_topk_kernel, so clamping here is merely unneeded; no
# GPU we know has 128-144 KiB, the one band where > 64 rows would skip the clamp unsafely.)
PERSISTENT_CLAMPING_MAX_ROWS = 32
SAMPLED_MIN_ROWS = 65
SAMPLED_MIN_LENGTH = {512: 98304, 1024: 65536, 2048: 65536}


def kernel_reads_as_is(lengths: Tensor, rows: int, width: int, k: int) -> bool:
    """Whether ``persistent_topk`` (given max_seq_len = W) clamps these lengths itself.

    True for an int32, contiguous, one-per-row ``lengths`` on the row counts whose kernel
    path clamps (module constants). Host facts only, so a captured graph keeps its choice.
    """
    if lengths.dtype != torch.int32 or not lengths.is_contiguous() or lengths.numel() != rows:
        return False
    if rows <= PERSISTENT_CLAMPING_MAX_ROWS:
        return True
    return rows >= SAMPLED_MIN_ROWS and width >= SAMPLED_MIN_LENGTH.get(k, 1 << 62)


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def prep(len_ptr, ends_ptr, out_ptr, out_pitch, next_n, width, K,
             PER_REQUEST: tl.constexpr, FILL: tl.constexpr, BLOCK_K: tl.constexpr):
        r = tl.program_id(0)
        if PER_REQUEST:
            n = tl.load(len_ptr + r // next_n).to(tl.int64) - next_n + 1 + r % next_n
        else:
            n = tl.load(len_ptr + r).to(tl.int64)
        n = tl.minimum(tl.maximum(n, 0), width)
        tl.store(ends_ptr + r, n.to(tl.int32))
        if FILL:
            row = out_ptr + r.to(tl.int64) * out_pitch
            for off in range(0, K, BLOCK_K):
                cols = off + tl.arange(0, BLOCK_K)
                tl.store(row + cols, tl.full([BLOCK_K], -1, tl.int32), mask=cols < K)

    return prep


def _triton_ok(logits: Tensor) -> bool:
    if logits.device.type != "cuda":
        return False
    try:
        _kernel()
    except Exception:  # no triton here: the torch path below gives the same values
        return False
    return True


def launch(logits: Tensor, lengths: Tensor, next_n: int, out: Tensor | None) -> Tensor:
    """The one Triton launch of :func:`ends_and_fill` (no device check: on CPU tensors it
    runs only under ``TRITON_INTERPRET=1``, which is how the CPU tests exercise it)."""
    rows, width = logits.shape
    flat = lengths.reshape(-1)
    per_request = flat.numel() != rows  # validate.decode_layout has ruled out anything else
    ends = torch.empty(rows, dtype=torch.int32, device=logits.device)
    k = out.shape[1] if out is not None else 1
    _kernel()[(rows,)](flat, ends, out if out is not None else ends, out.stride(0) if out is not None else 0,
                       next_n, width, k, PER_REQUEST=per_request, FILL=out is not None,
                       BLOCK_K=min(1024, max(16, 1 << (k - 1).bit_length())))
    return ends


def ends_and_fill(logits: Tensor, lengths: Tensor, next_n: int, out: Tensor | None) -> Tensor:
    """Per-row lengths clamped to [0, W] as a contiguous int32 (R,) tensor; when ``out`` is
    given, also fill it with -1. One launch on CUDA with Triton, torch ops elsewhere."""
    if not _triton_ok(logits) or (out is not None and out.stride(1) != 1):
        ends = decode_ends(logits, lengths, next_n, torch.int32)
        if out is not None:
            out.fill_(-1)
        return ends
    return launch(logits, lengths, next_n, out)
