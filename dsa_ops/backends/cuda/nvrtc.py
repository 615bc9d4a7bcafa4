"""NVRTC through ctypes: CUDA C++ source -> cubin for one architecture, at run time.

No CUDA toolkit is needed at install time. The library is looked up, in order, at
``$DSA_OPS_NVRTC`` (a path to the shared library), in the ``nvidia/*/lib`` folders that
torch's CUDA wheels install on ``sys.path`` (``nvidia/cu13/lib`` for CUDA 13 wheels,
``nvidia/cuda_nvrtc/lib`` for CUDA 12 ones), under ``$CUDA_HOME`` / ``$CUDA_PATH`` and
``/usr/local/cuda``, then by the loader's own search. A missing library is a
:class:`NvrtcError` that says where it looked.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading
from typing import Mapping, Optional, Sequence

_LOCK = threading.Lock()
_LIB: Optional[ctypes.CDLL] = None
_NAMES = ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so")


class NvrtcError(RuntimeError):
    """NVRTC is missing, or a compile failed (the message holds NVRTC's log)."""


def candidates() -> list[str]:
    """Paths tried before the loader's own search, most specific first."""
    found: list[str] = []
    explicit = os.environ.get("DSA_OPS_NVRTC")
    if explicit:
        found.append(explicit)
    for entry in sys.path:
        for sub in ("cu13", "cuda_nvrtc", "cu12"):
            for name in _NAMES:
                found += sorted(glob.glob(os.path.join(entry or ".", "nvidia", sub, "lib", name)))
    for env in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(env)
        if root:
            found += [os.path.join(root, "lib64", n) for n in _NAMES]
    found += [os.path.join("/usr/local/cuda/lib64", n) for n in _NAMES]
    return list(dict.fromkeys(found))


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i, sz, cp = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_char_p
    sigs = {
        "nvrtcVersion": (ctypes.POINTER(i), ctypes.POINTER(i)),
        "nvrtcGetErrorString": (i,),
        "nvrtcCreateProgram": (ctypes.POINTER(p), cp, cp, i, ctypes.POINTER(cp), ctypes.POINTER(cp)),
        "nvrtcCompileProgram": (p, i, ctypes.POINTER(cp)),
        "nvrtcGetProgramLogSize": (p, ctypes.POINTER(sz)),
        "nvrtcGetProgramLog": (p, cp),
        "nvrtcGetCUBINSize": (p, ctypes.POINTER(sz)),
        "nvrtcGetCUBIN": (p, cp),
        "nvrtcGetNumSupportedArchs": (ctypes.POINTER(i),),
        "nvrtcGetSupportedArchs": (ctypes.POINTER(i),),
        "nvrtcDestroyProgram": (ctypes.POINTER(p),),
    }
    for name, args in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = list(args)
        fn.restype = cp if name == "nvrtcGetErrorString" else i
    return lib


def load() -> ctypes.CDLL:
    """The NVRTC library, loaded once; NvrtcError naming every place tried if absent."""
    global _LIB
    with _LOCK:
        if _LIB is not None:
            return _LIB
        tried = candidates()
        errors = []
        for path in tried + list(_NAMES):
            if os.sep in path and not os.path.exists(path):
                continue
            try:
                lib = _bind(ctypes.CDLL(path))
                _preload_builtins(path)
                _LIB = lib
                return _LIB
            except (OSError, AttributeError) as e:
                errors.append(f"{path}: {e}")
        raise NvrtcError(
            "NVRTC (libnvrtc) not found: the cuda backend compiles its kernels at first use and needs the "
            "NVRTC library that torch's CUDA wheels ship (nvidia/*/lib on sys.path) or a CUDA toolkit "
            f"($CUDA_HOME); set DSA_OPS_NVRTC to its path. Looked at: {tried + list(_NAMES)}"
            + (f"; load errors: {errors}" if errors else ""))


def _preload_builtins(path: str) -> None:
    """Load libnvrtc-builtins from the folder ``path`` came from: NVRTC opens it by name at
    compile time, which the loader finds only on its search path (not so for wheels) or
    when a library of that name is already loaded."""
    folder = os.path.dirname(path)
    if not folder:
        return
    for b in sorted(glob.glob(os.path.join(folder, "libnvrtc-builtins.so.*"))):
        if ".alt." not in b:
            try:
                ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                pass


def _check(lib: ctypes.CDLL, status: int, what: str) -> None:
    if status != 0:
        msg = lib.nvrtcGetErrorString(status)
        raise NvrtcError(f"{what} failed: {msg.decode() if msg else status} ({status})")


def version() -> tuple[int, int]:
    """(major, minor) of the loaded NVRTC."""
    lib = load()
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def supported_archs() -> tuple[int, ...]:
    """The sm numbers (e.g. 90) this NVRTC compiles for."""
    lib = load()
    n = ctypes.c_int()
    _check(lib, lib.nvrtcGetNumSupportedArchs(ctypes.byref(n)), "nvrtcGetNumSupportedArchs")
    arr = (ctypes.c_int * n.value)()
    _check(lib, lib.nvrtcGetSupportedArchs(arr), "nvrtcGetSupportedArchs")
    return tuple(arr)


def compile_cubin(source: str, name: str, arch: str, options: Sequence[str] = (),
                  headers: Optional[Mapping[str, str]] = None) -> tuple[bytes, str]:
    """Compile ``source`` (file name ``name`` in messages) for ``arch`` (``sm_90a``, ``sm_80``).

    ``headers``: include name -> text, what ``#include "name"`` finds (NVRTC's named headers;
    nothing is read from disk). Returns (cubin bytes, compile log). NvrtcError with the log on
    a compile error.
    """
    if not arch.startswith("sm_"):
        raise ValueError(f"arch: expected a real architecture such as 'sm_90a', got {arch!r}")
    lib = load()
    prog = ctypes.c_void_p()
    items = list((headers or {}).items())
    texts = (ctypes.c_char_p * max(1, len(items)))(*[t.encode() for _, t in items])
    names = (ctypes.c_char_p * max(1, len(items)))(*[n.encode() for n, _ in items])
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), len(items),
                                       texts if items else None, names if items else None),
           "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={arch}", "--std=c++17", *options]
        argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        status = lib.nvrtcCompileProgram(prog, len(opts), argv)
        size = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
        buf = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        log = buf.value.decode(errors="replace")
        if status != 0:
            raise NvrtcError(f"compiling {name} for {arch} failed:\n{log}")
        _check(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
        cubin = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return cubin.raw, log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def arch_for(capability: tuple[int, int], supported: Sequence[int]) -> str:
    """The cubin target for a device of ``capability``: ``sm_90a`` on Hopper (clusters,
    ``setmaxnreg`` and the rest of its arch-specific set), ``sm_XY`` elsewhere.

    A device newer than every architecture this NVRTC knows cannot run a cubin built for an
    older one unless that is the same major version; then the newest such one is used.
    """
    major, minor = capability
    sm = 10 * major + minor
    if sm in supported:
        return "sm_90a" if sm == 90 else f"sm_{sm}"
    same_major = [s for s in supported if s // 10 == major and s < sm]
    if same_major:
        return f"sm_{max(same_major)}"
    raise NvrtcError(f"this NVRTC compiles for sm {sorted(supported)}, not for the device's sm_{sm}; "
                     "a newer NVRTC (torch's CUDA wheels, or a CUDA toolkit) is needed")
