"""Native CUDA kernels without a build step: NVRTC at first use, the driver API to launch.

- :mod:`.nvrtc` finds libnvrtc (torch's CUDA wheels, a toolkit, ``$DSA_OPS_NVRTC``) and
  compiles CUDA C++ to a cubin for the device's architecture (``sm_90a`` on Hopper).
- :mod:`.cache` keeps cubins on disk per (source and headers hash, arch, NVRTC version, options).
- :mod:`.driver` loads cubins and launches through ``cuLaunchKernelEx`` (clusters,
  programmatic dependent launch) on torch's current stream.
- :mod:`.kernel` ties them together: ``Program(name, source).function(kernel)(grid,
  block, args, cluster=...)``; first use never happens inside graph capture.
- :mod:`.topk` is the backend's host side. Its plan API, for tools and tests:
  ``plan(rows, width, stable=True, device=None, shape=None, facts=None)`` returns the
  :class:`~.topk.LaunchPlan` the backend launches (kernel name, grid, cluster dims, shared
  memory, ``arg_types()`` / ``args(...)``); ``device_facts(device)`` the host ints it reads;
  ``program(profile=0)`` the shipped build or a lab build with phase stamps
  (docs/cuda-kernel.md §1 and §7).

Importing this package loads no library: NVRTC and libcuda load at the first build or
launch, so CPU-only installs import it freely. This is infrastructure; no ``cuda``
backend is registered yet (docs/cuda-kernel.md).
"""

from dsa_ops.backends.cuda.kernel import CaptureError, Function, Program, pack_args
from dsa_ops.backends.cuda.driver import DriverError
from dsa_ops.backends.cuda.nvrtc import NvrtcError

_PLAN_API = ("DeviceFacts", "LaunchPlan", "device_facts", "plan", "program")

__all__ = ["CaptureError", "DriverError", "Function", "NvrtcError", "Program", "pack_args", *_PLAN_API]


def __getattr__(name: str):
    """The plan API of :mod:`.topk`, imported at first use (it reads the kernel files)."""
    if name in _PLAN_API:
        from dsa_ops.backends.cuda import topk

        return getattr(topk, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
