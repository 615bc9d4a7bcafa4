"""Adversarial decode rows for the wrapped kernels: -inf rows holding fewer than k finite keys
and thousands of NaNs, columns past L poisoned with +NaN / +inf.

vLLM 0.33.0's cooperative_topk faulted the process on such rows (an illegal memory access);
tests/test_vllm_special_rows.py and lab/vllm_coop_fault.py build them here.
"""

from __future__ import annotations

import torch

from dsa_ops.testing import shape_violation

NEG_NAN = 0xFFC00000  # sign-set quiet NaN
POS_NAN = 0x7FC00000
# The rows of the report: W 133120, k 2048, one row of each length.
ISSUE_LENGTHS = (16384, 131072, 65536, 98304, 32768, 49152, 12288, 12289, 0)
WIDTH = 133120


def bits(value: int) -> torch.Tensor:
    """The fp32 whose bit pattern is ``value`` (a one-element tensor)."""
    return torch.tensor([value], dtype=torch.int64).to(torch.int32).view(torch.float32)


def special_rows(lengths, width=WIDTH, finite=1024, nans=6144, nan_bits=(NEG_NAN,), tail=True, seed=0):
    """-inf rows; per row ``finite`` randn keys and ``nans`` NaNs (cycling through
    ``nan_bits``) at distinct random columns of [0, L); columns >= L alternate +NaN / +inf."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.full((len(lengths), width), float("-inf"))
    for r, length in enumerate(lengths):
        length = max(0, min(int(length), width))
        perm = torch.randperm(length, generator=gen)
        f = perm[:finite]
        x[r, f] = torch.randn(f.numel(), generator=gen)
        n = perm[finite:finite + nans]
        for j, b in enumerate(nan_bits):
            x[r, n[j::len(nan_bits)]] = bits(b)
        if tail and length < width:
            cols = torch.arange(length, width)
            x[r, cols[0::2]] = bits(POS_NAN)
            x[r, cols[1::2]] = float("inf")
    return x


def structural(got: torch.Tensor, lengths: torch.Tensor, width: int, k: int) -> str:
    """'' when every row has the contract's shape (:func:`dsa_ops.testing.shape_violation`:
    min(L, k) distinct indices in [0, L), then -1), else which row breaks it and how."""
    bad = shape_violation(got, lengths.to(torch.int64).clamp(0, width), k)
    return "" if bad is None else f"row {bad[1]}: {bad[0]}"
