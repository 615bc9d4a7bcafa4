"""A CUDA C++ program compiled at first use and launched on torch's current stream.

``Program(name, source, headers=...)`` holds the source of one or more ``extern "C"
__global__`` kernels, and the named headers its ``#include "..."`` lines find.
``program.function(kernel, device)`` builds the cubin for the device's
architecture (NVRTC, or the on-disk cache), loads it into the device's context and returns a
:class:`Function`; the first call per (program, device) does that work, later calls are a
dict lookup. Nothing is compiled or loaded while the current stream is being captured
into a CUDA graph: that raises :class:`CaptureError`, so the caller warms up first.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from dsa_ops.backends.cuda import cache, driver, nvrtc

_INT32 = (-(1 << 31), (1 << 31) - 1)


class CaptureError(RuntimeError):
    """A kernel's first use (compile / load) was attempted during CUDA-graph capture."""


def pack_args(args: Sequence[Any], device_index: Optional[int] = None) -> tuple[ctypes.Array, list]:
    """The ``void*[]`` kernel-parameter array for ``args`` and the values it points to.

    A tensor passes its data pointer (it must live on ``device_index`` when given); a
    Python int an ``int`` (32-bit: wider ones must be given as ``ctypes.c_int64`` /
    ``c_uint64``); a float a ``float``; a ctypes scalar itself.
    """
    import torch

    values: list = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            if device_index is not None and (a.device.type != "cuda" or a.device.index != device_index):
                raise ValueError(f"args[{i}]: expected a tensor on cuda:{device_index}, got one on {a.device}")
            values.append(ctypes.c_void_p(a.data_ptr()))
        elif isinstance(a, bool):
            values.append(ctypes.c_int(int(a)))
        elif isinstance(a, int):
            if not _INT32[0] <= a <= _INT32[1]:
                raise ValueError(f"args[{i}]: {a} does not fit an int32 parameter; pass ctypes.c_int64 for a 64-bit one")
            values.append(ctypes.c_int(a))
        elif isinstance(a, float):
            values.append(ctypes.c_float(a))
        elif isinstance(a, ctypes._SimpleCData):
            values.append(a)
        else:
            raise ValueError(f"args[{i}]: expected a tensor, int, float or ctypes scalar, got {type(a).__name__}")
    params = (ctypes.c_void_p * max(1, len(values)))(
        *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
    return params, values


def _check_dims(what: str, dims: Sequence[int]) -> tuple[int, int, int]:
    d = tuple(int(x) for x in dims) + (1,) * (3 - len(dims))
    if len(d) != 3 or min(d) < 1:
        raise ValueError(f"{what}: expected 1 to 3 positive sizes, got {tuple(dims)}")
    return d  # type: ignore[return-value]


@dataclass
class Function:
    """One loaded kernel on one device."""

    name: str
    handle: int
    device_index: int
    arch: str
    max_shared: int = 48 * 1024
    attrs: dict = field(default_factory=dict)

    def __call__(self, grid: Sequence[int], block: Sequence[int], args: Sequence[Any], shared: int = 0,
                 cluster: Optional[Sequence[int]] = None, pdl: bool = False, stream: Optional[int] = None) -> None:
        """Launch on ``stream`` (a CUstream handle; default torch's current stream of the device).

        ``cluster``: CTAs per cluster along each grid dimension (the grid must divide by
        it); ``pdl``: programmatic dependent launch (see :func:`driver.launch_config`).
        """
        import torch

        g, b = _check_dims("grid", grid), _check_dims("block", block)
        if cluster is not None:
            c = _check_dims("cluster", cluster)
            if any(gi % ci for gi, ci in zip(g, c)):
                raise ValueError(f"cluster: the grid {g} must be a multiple of the cluster shape {c}")
        if not 0 <= shared <= self.max_shared:
            raise ValueError(f"shared: {shared} bytes; {self.name} was loaded for at most {self.max_shared}")
        if stream is None:
            stream = torch.cuda.current_stream(self.device_index).cuda_stream
        params, keep = pack_args(args, self.device_index)
        cfg, arr = driver.launch_config(g, b, shared, stream, cluster, pdl)
        driver.launch(self.handle, cfg, params)
        del keep, arr


class Program:
    """CUDA C++ source of ``extern "C"`` kernels, built per device at first use. ``headers``:
    include name -> text for the source's ``#include "name"`` lines (NVRTC's named headers);
    ``options``: NVRTC options (``-DNAME``); both are part of the cubin's cache key."""

    def __init__(self, name: str, source: str, options: Sequence[str] = (),
                 headers: Optional[Mapping[str, str]] = None) -> None:
        self.name, self.source, self.options = name, source, tuple(options)
        self.headers = dict(headers or {})
        self._lock = threading.Lock()
        self._modules: dict[tuple[int, int], int] = {}  # (device, context) -> CUmodule
        self._functions: dict[tuple, Function] = {}

    @property
    def digest(self) -> str:
        """sha256 (hex) of the source and its headers: any edit of a kernel file changes it."""
        return cache.program_hash(self.source, self.headers)

    def cubin(self, arch: str) -> tuple[bytes, bool]:
        """(cubin for ``arch``, whether it came from the disk cache)."""
        return cache.get_or_build(
            self.name, self.source, arch, nvrtc.version(), self.options,
            lambda: nvrtc.compile_cubin(self.source, self.name + ".cu", arch, self.options, self.headers)[0],
            headers=self.headers)

    def function(self, kernel: str, device: Any = None, max_shared: int = 48 * 1024,
                 non_portable_cluster: bool = False) -> Function:
        """The loaded ``kernel`` on ``device`` (default: the current CUDA device).

        ``max_shared``: the most dynamic shared memory a launch will ask for (above 48 KiB the
        function's limit is raised at load); ``non_portable_cluster``: allow clusters of more
        than 8 CTAs (16 on Hopper). CaptureError during graph capture if not yet loaded.
        """
        import torch

        idx = torch.cuda.current_device() if device is None else torch.device(device).index
        if idx is None:
            idx = torch.cuda.current_device()
        key = (kernel, idx, max_shared, non_portable_cluster)
        fn = self._functions.get(key)
        if fn is not None:
            return fn
        if torch.cuda.is_current_stream_capturing():
            raise CaptureError(
                f"{self.name}.{kernel} is not yet loaded on cuda:{idx}, and compiling or loading a kernel is not "
                "allowed during CUDA-graph capture; run the op once before capturing (a warm-up call)")
        with self._lock, torch.cuda.device(idx):
            torch.cuda.init()
            ctx = driver.current_context(idx)
            cc = torch.cuda.get_device_capability(idx)
            arch = nvrtc.arch_for(cc, nvrtc.supported_archs())
            mod = self._modules.get((idx, ctx))
            if mod is None:
                mod = driver.load_module(self.cubin(arch)[0])
                self._modules[(idx, ctx)] = mod
            handle = driver.get_function(mod, kernel)
            if max_shared > 48 * 1024:
                driver.set_function_attribute(handle, driver.FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES, max_shared)
            if non_portable_cluster:
                driver.set_function_attribute(handle, driver.FUNC_ATTR_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
            attrs = {"registers": driver.function_attribute(handle, driver.FUNC_ATTR_NUM_REGS),
                     "local_bytes": driver.function_attribute(handle, driver.FUNC_ATTR_LOCAL_SIZE_BYTES)}
            fn = Function(kernel, handle, idx, arch, max_shared, attrs)
            self._functions[key] = fn
            return fn
