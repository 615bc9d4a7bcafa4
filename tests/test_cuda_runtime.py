"""The cuda backend's build-and-launch layer on the CPU: cache keys, arch choice, argument
packing, launch structs, error paths (no NVRTC, no driver, first use during capture).
The NVRTC compile tests run where libnvrtc is found and skip elsewhere (CI)."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest
import torch

from dsa_ops.backends.cuda import cache, driver, kernel, nvrtc
from dsa_ops.backends.cuda import CaptureError, DriverError, Function, NvrtcError, Program


def _nvrtc_found() -> bool:
    try:
        nvrtc.load()
        return True
    except NvrtcError:
        return False


needs_nvrtc = pytest.mark.skipif(not _nvrtc_found(), reason="libnvrtc not found (torch CUDA wheels or a toolkit)")

SRC = 'extern "C" __global__ void add_one(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; ' \
      'if (i < n) x[i] += 1.0f; }'


def test_cache_key_covers_source_arch_compiler_and_options():
    base = cache.cache_key(SRC, "sm_90a", (13, 0), ("-lineinfo",))
    assert base == cache.cache_key(SRC, "sm_90a", (13, 0), ("-lineinfo",))
    others = {cache.cache_key(SRC + " ", "sm_90a", (13, 0), ("-lineinfo",)),
              cache.cache_key(SRC, "sm_90", (13, 0), ("-lineinfo",)),
              cache.cache_key(SRC, "sm_90a", (13, 1), ("-lineinfo",)),
              cache.cache_key(SRC, "sm_90a", (13, 0), ())}
    assert base not in others and len(others) == 4
    # options are separated, so ("-a", "b") and ("-ab",) differ
    assert cache.cache_key(SRC, "sm_90", (13, 0), ("-a", "b")) != cache.cache_key(SRC, "sm_90", (13, 0), ("-ab",))
    assert cache.source_hash(SRC) != cache.source_hash(SRC.replace("1.0f", "2.0f"))


def test_cache_key_covers_named_headers():
    base = cache.cache_key(SRC, "sm_90a", (13, 0), ())
    assert cache.cache_key(SRC, "sm_90a", (13, 0), (), {}) == base  # no headers: the key as before
    key = cache.cache_key(SRC, "sm_90a", (13, 0), (), {"a.cuh": "int x;"})
    others = {base, cache.cache_key(SRC, "sm_90a", (13, 0), (), {"a.cuh": "int y;"}),
              cache.cache_key(SRC, "sm_90a", (13, 0), (), {"b.cuh": "int x;"})}
    assert key not in others and len(others) == 3
    prog = Program("p", SRC, headers={"a.cuh": "int x;"})
    assert prog.digest == cache.program_hash(SRC, {"a.cuh": "int x;"}) != Program("p", SRC).digest
    assert Program("p", SRC).digest == cache.source_hash(SRC)


def test_cache_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DSA_OPS_CUDA_CACHE", str(tmp_path / "c"))
    assert cache.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("DSA_OPS_CUDA_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache.cache_dir() == tmp_path / "x" / "dsa_ops" / "cuda"


def test_cubin_path_is_safe_and_keyed(tmp_path):
    p = cache.cubin_path("../evil name", "ab" * 32, tmp_path)
    assert p.parent == tmp_path and "/" not in p.name and p.name.endswith(".cubin") and "abab" in p.name


def test_get_or_build_builds_once_then_reads(tmp_path):
    calls = []

    def build() -> bytes:
        calls.append(1)
        return b"CUBIN"

    assert cache.get_or_build("k", SRC, "sm_90a", (13, 0), (), build, tmp_path) == (b"CUBIN", False)
    assert cache.get_or_build("k", SRC, "sm_90a", (13, 0), (), build, tmp_path) == (b"CUBIN", True)
    assert cache.get_or_build("k", SRC, "sm_80", (13, 0), (), build, tmp_path) == (b"CUBIN", False)
    assert len(calls) == 2
    assert not list(tmp_path.glob("*.tmp*"))


def test_unwritable_cache_still_returns_the_build(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert cache.write(blocker / "x.cubin", b"data") is False
    assert cache.get_or_build("k", SRC, "sm_90a", (13, 0), (), lambda: b"B", blocker) == (b"B", False)


def test_empty_cache_file_is_a_miss(tmp_path):
    p = tmp_path / "e.cubin"
    p.write_bytes(b"")
    assert cache.read(p) is None and cache.read(tmp_path / "absent") is None


@pytest.mark.parametrize("cc, supported, want", [
    ((9, 0), (80, 89, 90, 100), "sm_90a"),
    ((8, 9), (80, 89, 90), "sm_89"),
    ((8, 6), (75, 80, 86), "sm_86"),
    ((12, 1), (90, 100, 120), "sm_120"),
])
def test_arch_for(cc, supported, want):
    assert nvrtc.arch_for(cc, supported) == want


def test_arch_for_a_device_newer_than_nvrtc():
    with pytest.raises(NvrtcError, match="sm_100"):
        nvrtc.arch_for((10, 0), (75, 80, 90))


def test_missing_nvrtc_names_where_it_looked(monkeypatch):
    monkeypatch.setattr(nvrtc, "_LIB", None)
    monkeypatch.setattr(nvrtc, "_NAMES", ("libnvrtc-absent.so.99",))
    monkeypatch.setenv("DSA_OPS_NVRTC", "/nonexistent/libnvrtc.so")
    monkeypatch.setattr(sys, "path", [])
    with pytest.raises(NvrtcError, match="DSA_OPS_NVRTC") as e:
        nvrtc.load()
    assert "/nonexistent/libnvrtc.so" in str(e.value)


def test_nvrtc_candidates_include_wheel_layout(monkeypatch, tmp_path):
    lib = tmp_path / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnvrtc.so.13").write_bytes(b"")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    monkeypatch.delenv("DSA_OPS_NVRTC", raising=False)
    assert nvrtc.candidates()[0] == str(lib / "libnvrtc.so.13")


def test_compile_needs_a_real_arch():
    with pytest.raises(ValueError, match="arch"):
        nvrtc.compile_cubin(SRC, "x.cu", "compute_90")


def test_missing_driver_is_a_clear_error(monkeypatch):
    def no_lib(name, *a, **k):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(driver, "_LIB", None)
    monkeypatch.setattr(driver.ctypes, "CDLL", no_lib)
    with pytest.raises(DriverError, match="libcuda.so.1.*NVIDIA GPU"):
        driver.load()


def test_launch_structs_match_the_driver_abi():
    assert ctypes.sizeof(driver.LaunchAttributeValue) == 64
    assert ctypes.sizeof(driver.LaunchAttribute) == 72 and driver.LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(driver.LaunchConfig) == 56
    assert (driver.LaunchConfig.shared_bytes.offset, driver.LaunchConfig.stream.offset,
            driver.LaunchConfig.attrs.offset, driver.LaunchConfig.num_attrs.offset) == (24, 32, 40, 48)


def test_launch_config_attributes():
    cfg, arr = driver.launch_config((8, 1, 1), (256, 1, 1), 1024, 0x1234, cluster=(4, 1, 1), pdl=True)
    assert list(cfg.grid) == [8, 1, 1] and list(cfg.block) == [256, 1, 1] and cfg.shared_bytes == 1024
    assert cfg.stream == 0x1234 and cfg.num_attrs == 2
    assert (arr[0].id, list(arr[0].value.cluster_dim)) == (driver.LAUNCH_ATTR_CLUSTER_DIMENSION, [4, 1, 1])
    assert (arr[1].id, arr[1].value.flag) == (driver.LAUNCH_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, 1)
    cfg, arr = driver.launch_config((1,), (32,), 0, 0)
    assert cfg.num_attrs == 0


def test_pack_args():
    t = torch.arange(4, dtype=torch.float32)
    params, keep = kernel.pack_args([t, 7, 2.5, ctypes.c_int64(1 << 40), True])
    assert params[0] is not None
    assert ctypes.cast(params[0], ctypes.POINTER(ctypes.c_void_p)).contents.value == t.data_ptr()
    assert ctypes.cast(params[1], ctypes.POINTER(ctypes.c_int)).contents.value == 7
    assert ctypes.cast(params[2], ctypes.POINTER(ctypes.c_float)).contents.value == 2.5
    assert ctypes.cast(params[3], ctypes.POINTER(ctypes.c_int64)).contents.value == 1 << 40
    assert ctypes.cast(params[4], ctypes.POINTER(ctypes.c_int)).contents.value == 1


@pytest.mark.parametrize("arg, match", [(1 << 31, "int32"), ("x", "tensor, int"), (None, "tensor, int")])
def test_pack_args_refuses(arg, match):
    with pytest.raises(ValueError, match=match):
        kernel.pack_args([arg])


def test_pack_args_refuses_a_tensor_on_another_device():
    with pytest.raises(ValueError, match=r"args\[0\].*cuda:0"):
        kernel.pack_args([torch.zeros(1)], device_index=0)


@pytest.mark.parametrize("kw, match", [
    (dict(grid=(0,), block=(32,)), "grid"),
    (dict(grid=(1,), block=(1, 1, 1, 1)), "block"),
    (dict(grid=(6,), block=(32,), cluster=(4,)), "cluster"),
    (dict(grid=(1,), block=(32,), shared=64 * 1024), "shared"),
])
def test_launch_refuses_bad_shapes_before_the_driver(kw, match):
    fn = Function("k", handle=0, device_index=0, arch="sm_90a")
    with pytest.raises(ValueError, match=match):
        fn(args=(), **kw)


def test_first_use_during_graph_capture_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(CaptureError, match="warm-up"):
        Program("capture_probe", SRC).function("add_one")


def test_import_loads_no_library():
    code = ("import dsa_ops.backends.cuda as c; from dsa_ops.backends.cuda import nvrtc, driver; "
            "print(nvrtc._LIB is None and driver._LIB is None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


@needs_nvrtc
def test_nvrtc_compiles_for_hopper():
    cubin, _ = nvrtc.compile_cubin(SRC, "add.cu", "sm_90a")
    assert cubin[:4] == b"\x7fELF"
    assert 90 in nvrtc.supported_archs() and nvrtc.version() >= (12, 0)


@needs_nvrtc
def test_nvrtc_compiles_with_named_headers():
    """#include "name" finds the text given for name (nothing is read from disk), a header
    may include another, and a missing one is a compile error naming it."""
    headers = {"k.cuh": '#pragma once\n#include "v.cuh"\nextern "C" __global__ void k(float* x) { x[0] = V; }\n',
               "v.cuh": "#pragma once\nconstexpr float V = 2.0f;\n"}
    main = '#include "k.cuh"\n#include "k.cuh"\n'  # once: #pragma once holds
    cubin, _ = nvrtc.compile_cubin(main, "m.cu", "sm_90a", headers=headers)
    assert cubin[:4] == b"\x7fELF"
    with pytest.raises(NvrtcError, match="v.cuh"):
        nvrtc.compile_cubin(main, "m.cu", "sm_90a", headers={"k.cuh": headers["k.cuh"]})


@needs_nvrtc
def test_nvrtc_compile_error_carries_the_log():
    with pytest.raises(NvrtcError, match="undefined_name"):
        nvrtc.compile_cubin('extern "C" __global__ void k() { undefined_name(); }', "bad.cu", "sm_90a")


@needs_nvrtc
def test_program_cubin_is_cached_on_disk(monkeypatch, tmp_path):
    monkeypatch.setenv("DSA_OPS_CUDA_CACHE", str(tmp_path))
    prog = Program("cached_probe", SRC)
    first, hit1 = prog.cubin("sm_90a")
    second, hit2 = Program("cached_probe", SRC).cubin("sm_90a")
    assert (hit1, hit2) == (False, True) and first == second
    assert len(list(tmp_path.glob("cached_probe-*.cubin"))) == 1


@needs_nvrtc
def test_floor_kernels_compile_and_reference_holds():
    cuda_floors = pytest.importorskip("lab.cuda_floors", reason="lab/ is in a checkout, not in the wheel")

    cuda_floors.selfcheck()
