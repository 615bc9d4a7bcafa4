"""GPU: NVRTC-built kernels launched through the driver API on torch's stream (plain,
cluster, programmatic dependent launch, CUDA-graph capture and replay) and the floor
kernels against torch. Skips without an NVIDIA GPU or without libnvrtc."""

from __future__ import annotations

import pytest
import torch

from dsa_ops.backends.cuda import CaptureError, Program, nvrtc


def _ready() -> str:
    """What these tests need beyond a device (the gpu mark's ``needs``)."""
    if torch.version.cuda is None:
        return "needs an NVIDIA GPU"
    try:
        nvrtc.load()
    except nvrtc.NvrtcError:
        return "libnvrtc not found"
    return ""


pytestmark = pytest.mark.gpu(needs=_ready)

SRC = r'''
extern "C" __global__ void add_scalar(float* x, int n, float v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += v;
}
extern "C" __global__ void add_dyn(const int* lens, float* x) {  // length read on the device
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < lens[0]) x[i] += 1.0f;
}
extern "C" __global__ void ranks(int* out) {
    unsigned r, n;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    if (threadIdx.x == 0) out[blockIdx.x] = (int)(n * 100 + r);
}
'''


@pytest.fixture(scope="module")
def prog() -> Program:
    return Program("test_cuda_gpu", SRC)


def test_launch_on_the_current_stream(prog):
    x = torch.zeros(1000, device="cuda")
    f = prog.function("add_scalar")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        f((4,), (256,), (x, 1000, 2.5))
    s.synchronize()
    assert torch.equal(x, torch.full_like(x, 2.5))
    assert f.arch.startswith("sm_") and f.attrs["registers"] > 0


@pytest.mark.gpu(needs=lambda: "" if torch.cuda.get_device_capability() >= (9, 0) else "thread-block clusters need sm_90+")
@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_cluster_launch(prog, n):
    out = torch.full((4 * n,), -1, dtype=torch.int32, device="cuda")
    prog.function("ranks", non_portable_cluster=True)((4 * n,), (64,), (out,), cluster=(n,))
    b = torch.arange(4 * n, device="cuda")
    assert torch.equal(out, (n * 100 + b % n).to(torch.int32))


def test_graph_replay_reads_device_lengths(prog):
    f = prog.function("add_dyn")
    lens = torch.tensor([10], dtype=torch.int32, device="cuda")
    x = torch.zeros(64, device="cuda")
    f((1,), (64,), (lens, x))  # warm-up outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        f((1,), (64,), (lens, x))
    x.zero_()
    for n in (3, 64, 0):
        lens.fill_(n)
        x.zero_()
        g.replay()
        torch.cuda.synchronize()
        assert int(x.sum()) == n and (n == 64 or float(x[n]) == 0.0)


def test_first_use_inside_capture_raises(prog):
    fresh = Program("test_cuda_gpu_fresh", SRC + "\n// fresh\n")
    g = torch.cuda.CUDAGraph()
    with pytest.raises(CaptureError, match="warm-up"):
        with torch.cuda.graph(g):
            fresh.function("add_scalar")


def test_floor_kernels_match_torch():
    cuda_floors = pytest.importorskip("lab.cuda_floors", reason="lab/ is in a checkout, not in the wheel")

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the floor kernels use clusters and griddepcontrol (sm_90+)")
    cases = cuda_floors.build_cases(torch.device("cuda", torch.cuda.current_device()), quick=True)
    assert len(cases) > 50
    for tag, run, check in cases:
        check()
