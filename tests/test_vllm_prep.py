"""dsa_ops.backends.vllm_prep: the one-launch clamp (+ -1 fill) the vLLM adapters use, run in
Triton's interpreter on the CPU (a child process with TRITON_INTERPRET=1), against the torch
path (dsa_ops.backends.rows.decode_ends); and which lengths persistent_topk may take as is."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from dsa_ops.backends import vllm_prep

CHILD = r"""
import torch
from dsa_ops.backends import vllm_prep
from dsa_ops.backends.rows import decode_ends

g = torch.Generator().manual_seed(5)
cases = 0
for rows, width, next_n, layout, k in [(6, 700, 1, "per_row", 512), (8, 300, 2, "per_request", 64),
                                       (8, 1000, 2, "per_row_2d", 2048), (1, 50, 1, "per_row", 16)]:
    b = rows // next_n
    shape = {"per_row": (rows,), "per_request": (b,), "per_row_2d": (b, next_n)}[layout]
    for dtype in (torch.int32, torch.int64):
        lengths = torch.randint(-20, 3 * width, shape, generator=g).to(dtype)
        x = torch.zeros(rows, width)
        want = decode_ends(x, lengths, next_n, torch.int32)
        got = vllm_prep.launch(x, lengths, next_n, None)
        assert got.dtype == torch.int32 and torch.equal(got, want), (layout, dtype, got, want)
        out = torch.full((rows, k), 7, dtype=torch.int32)
        got = vllm_prep.launch(x, lengths, next_n, out)
        assert torch.equal(got, want) and bool((out == -1).all()), (layout, "fill")
        cases += 1
print("ok", cases)
"""


def test_prep_kernel_matches_the_torch_path_in_the_interpreter():
    pytest.importorskip("triton")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", CHILD], cwd=root, env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert res.stdout.split() == ["ok", "8"], res.stdout


def test_ends_and_fill_off_cuda_uses_torch_ops():
    x = torch.zeros(4, 100)
    out = torch.full((4, 16), 3, dtype=torch.int32)
    ends = vllm_prep.ends_and_fill(x, torch.tensor([-1, 5, 100, 400]), 1, out)
    assert ends.tolist() == [0, 5, 100, 100] and ends.dtype == torch.int32 and bool((out == -1).all())


@pytest.mark.parametrize("rows, width, k, dtype, shape, want", [
    (32, 4096, 2048, torch.int32, (32,), True),
    (33, 4096, 2048, torch.int32, (33,), False),
    (65, 65536, 2048, torch.int32, (65,), True),
    (65, 65536, 512, torch.int32, (65,), False),  # k = 512 samples only from 96K
    (65, 98304, 512, torch.int32, (65,), True),
    (8, 4096, 2048, torch.int64, (8,), False),  # the kernel reads int32
    (8, 4096, 2048, torch.int32, (4,), False),  # one per request: needs the layout work
])
def test_kernel_reads_as_is(rows, width, k, dtype, shape, want):
    lengths = torch.zeros(shape, dtype=dtype)
    assert vllm_prep.kernel_reads_as_is(lengths, rows, width, k) is want
