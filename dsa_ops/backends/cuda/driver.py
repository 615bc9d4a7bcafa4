"""The CUDA driver API through ctypes: load a cubin, set function attributes, launch.

Only what the cuda backend needs: modules are loaded into the context that is current on
the calling thread, which is the device's primary context that torch uses, so torch
tensors and ``torch.cuda.current_stream()`` serve directly as kernel arguments and stream.
A missing ``libcuda.so.1`` (no NVIDIA driver) is a :class:`DriverError` saying so.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Optional, Sequence

_LOCK = threading.Lock()
_LIB: Optional[ctypes.CDLL] = None

# cuda.h enums (values fixed by the driver ABI)
FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
FUNC_ATTR_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
FUNC_ATTR_NUM_REGS = 4
FUNC_ATTR_LOCAL_SIZE_BYTES = 3
LAUNCH_ATTR_CLUSTER_DIMENSION = 4
LAUNCH_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6
DEV_ATTR_MULTIPROCESSOR_COUNT = 16
DEV_ATTR_CC_MAJOR = 75
DEV_ATTR_CC_MINOR = 76
DEV_ATTR_MAX_SHARED_PER_BLOCK_OPTIN = 97
DEV_ATTR_MAX_SHARED_PER_MULTIPROCESSOR = 81


class DriverError(RuntimeError):
    """The driver is missing, or a driver call failed (the message names the call)."""


class LaunchAttributeValue(ctypes.Union):
    """CUlaunchAttributeValue: a 64-byte union; only the members used here are named."""

    _fields_ = [("pad", ctypes.c_char * 64), ("cluster_dim", ctypes.c_uint * 3), ("flag", ctypes.c_int)]


class LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: id (an enum), 4 bytes of padding, the value union (72 bytes)."""

    _fields_ = [("id", ctypes.c_int), ("_pad", ctypes.c_char * 4), ("value", LaunchAttributeValue)]


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (56 bytes on 64-bit hosts)."""

    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_bytes", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttribute)),
                ("num_attrs", ctypes.c_uint)]


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i, u, cp = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_char_p
    P = ctypes.POINTER
    sigs = {
        "cuInit": (u,),
        "cuDriverGetVersion": (P(i),),
        "cuGetErrorString": (i, P(cp)),
        "cuGetErrorName": (i, P(cp)),
        "cuDeviceGet": (P(i), i),
        "cuDeviceGetAttribute": (P(i), i, i),
        "cuCtxGetCurrent": (P(p),),
        "cuCtxSetCurrent": (p,),
        "cuDevicePrimaryCtxRetain": (P(p), i),
        "cuModuleLoadData": (P(p), p),
        "cuModuleUnload": (p,),
        "cuModuleGetFunction": (P(p), p, cp),
        "cuFuncSetAttribute": (p, i, i),
        "cuFuncGetAttribute": (P(i), i, p),
        "cuLaunchKernelEx": (P(LaunchConfig), p, P(p), P(p)),
        "cuStreamIsCapturing": (p, P(i)),
    }
    for name, args in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = list(args)
        fn.restype = i
    return lib


def load() -> ctypes.CDLL:
    """libcuda, loaded and initialised once; DriverError when there is no NVIDIA driver."""
    global _LIB
    with _LOCK:
        if _LIB is None:
            try:
                lib = _bind(ctypes.CDLL("libcuda.so.1"))
            except OSError as e:
                raise DriverError(f"the CUDA driver library libcuda.so.1 could not be loaded ({e}): the cuda "
                                  "backend needs an NVIDIA GPU and its driver") from None
            except AttributeError as e:
                raise DriverError(f"the CUDA driver is too old for the cuda backend (needs CUDA 12.0+): {e}") from None
            status = lib.cuInit(0)
            if status != 0:
                raise DriverError(f"cuInit failed: {_describe(lib, status)}")
            _LIB = lib
        return _LIB


def _describe(lib: ctypes.CDLL, status: int) -> str:
    name, text = ctypes.c_char_p(), ctypes.c_char_p()
    lib.cuGetErrorName(status, ctypes.byref(name))
    lib.cuGetErrorString(status, ctypes.byref(text))
    return f"{(name.value or b'?').decode()} ({status}): {(text.value or b'').decode()}"


def check(status: int, what: str) -> None:
    """Raise DriverError naming ``what`` for a non-zero CUresult."""
    if status != 0:
        raise DriverError(f"{what} failed: {_describe(load(), status)}")


def driver_version() -> int:
    """The driver's CUDA version, e.g. 13000."""
    v = ctypes.c_int()
    check(load().cuDriverGetVersion(ctypes.byref(v)), "cuDriverGetVersion")
    return v.value


def device_attribute(device: int, attr: int) -> int:
    lib = load()
    dev, v = ctypes.c_int(), ctypes.c_int()
    check(lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    check(lib.cuDeviceGetAttribute(ctypes.byref(v), attr, dev), "cuDeviceGetAttribute")
    return v.value


def current_context(device: int) -> int:
    """The context current on this thread (torch's primary context once torch used the
    device); makes the device's primary context current if none is."""
    lib = load()
    ctx = ctypes.c_void_p()
    check(lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if not ctx.value:
        dev = ctypes.c_int()
        check(lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return int(ctx.value)


def load_module(image: bytes) -> int:
    """Load a cubin (or PTX) image into the current context; the CUmodule handle."""
    mod = ctypes.c_void_p()
    buf = ctypes.create_string_buffer(image, len(image))
    check(load().cuModuleLoadData(ctypes.byref(mod), buf), "cuModuleLoadData")
    return int(mod.value)


def get_function(module: int, name: str) -> int:
    fn = ctypes.c_void_p()
    check(load().cuModuleGetFunction(ctypes.byref(fn), ctypes.c_void_p(module), name.encode()),
          f"cuModuleGetFunction({name!r})")
    return int(fn.value)


def set_function_attribute(fn: int, attr: int, value: int) -> None:
    check(load().cuFuncSetAttribute(ctypes.c_void_p(fn), attr, value), f"cuFuncSetAttribute({attr}, {value})")


def function_attribute(fn: int, attr: int) -> int:
    v = ctypes.c_int()
    check(load().cuFuncGetAttribute(ctypes.byref(v), attr, ctypes.c_void_p(fn)), f"cuFuncGetAttribute({attr})")
    return v.value


def stream_is_capturing(stream: int) -> bool:
    """Whether ``stream`` (a CUstream handle) is being captured into a graph."""
    status = ctypes.c_int()
    check(load().cuStreamIsCapturing(ctypes.c_void_p(stream), ctypes.byref(status)), "cuStreamIsCapturing")
    return status.value != 0  # CU_STREAM_CAPTURE_STATUS_NONE == 0


def _dim3(d: Sequence[int]) -> list[int]:
    return [int(x) for x in d] + [1] * (3 - len(d))


def launch_config(grid: Sequence[int], block: Sequence[int], shared_bytes: int, stream: int,
                  cluster: Optional[Sequence[int]] = None, pdl: bool = False) -> tuple[LaunchConfig, object]:
    """A CUlaunchConfig and the attribute array it points into (keep both alive until the launch).

    ``cluster``: the cluster shape in CTAs (grid must be a multiple of it); ``pdl``: allow
    this launch to start before the previous kernel on the stream ends (programmatic
    dependent launch; the kernel waits with ``griddepcontrol.wait``).
    """
    attrs = []
    if cluster is not None:
        a = LaunchAttribute(id=LAUNCH_ATTR_CLUSTER_DIMENSION)
        a.value.cluster_dim[:] = _dim3(cluster)
        attrs.append(a)
    if pdl:
        a = LaunchAttribute(id=LAUNCH_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION)
        a.value.flag = 1
        attrs.append(a)
    arr = (LaunchAttribute * max(1, len(attrs)))(*attrs)
    cfg = LaunchConfig(shared_bytes=int(shared_bytes), stream=ctypes.c_void_p(stream),
                       attrs=ctypes.cast(arr, ctypes.POINTER(LaunchAttribute)), num_attrs=len(attrs))
    cfg.grid[:] = _dim3(grid)
    cfg.block[:] = _dim3(block)
    return cfg, arr


def launch(fn: int, cfg: LaunchConfig, params: ctypes.Array) -> None:
    """cuLaunchKernelEx of ``fn`` with ``params`` (an array of pointers to each argument)."""
    check(load().cuLaunchKernelEx(ctypes.byref(cfg), ctypes.c_void_p(fn), params, None), "cuLaunchKernelEx")
