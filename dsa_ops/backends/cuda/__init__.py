"""Native CUDA kernels without a build step: NVRTC at first use, the driver API to launch.

- :mod:`.nvrtc` finds libnvrtc (torch's CUDA wheels, a toolkit, ``$DSA_OPS_NVRTC``) and
  compiles CUDA C++ to a cubin for the device's architecture (``sm_90a`` on Hopper).
- :mod:`.cache` keeps cubins on disk per (source hash, arch, NVRTC version, options).
- :mod:`.driver` loads cubins and launches through ``cuLaunchKernelEx`` (clusters,
  programmatic dependent launch) on torch's current stream.
- :mod:`.kernel` ties them together: ``Program(name, source).function(kernel)(grid,
  block, args, cluster=...)``; first use never happens inside graph capture.

Importing this package loads no library: NVRTC and libcuda load at the first build or
launch, so CPU-only installs import it freely. This is infrastructure; no ``cuda``
backend is registered yet (docs/cuda-kernel.md).
"""

from dsa_ops.backends.cuda.kernel import CaptureError, Function, Program, pack_args
from dsa_ops.backends.cuda.driver import DriverError
from dsa_ops.backends.cuda.nvrtc import NvrtcError

__all__ = ["CaptureError", "DriverError", "Function", "NvrtcError", "Program", "pack_args"]
