"""Command-line value checks shared by the commands: a bad value is a :class:`UsageError`,
which ``dsa-ops`` prints as one line on stderr before exiting with status 2."""

from __future__ import annotations

import importlib.util
import os

import torch

import dsa_ops
from dsa_ops import policy as P
from dsa_ops.validate import MAX_K


class UsageError(Exception):
    """A command-line value the command cannot use; the message names the option."""


def device(value: str) -> str:
    """``--device``: cpu, or cuda[:N] where this torch build sees that CUDA (or ROCm) device."""
    try:
        dev = torch.device(value)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device: expected cpu or cuda[:N], got {value!r}") from None
    if dev.type == "cpu":
        return value
    if dev.type != "cuda":
        raise UsageError(f"--device: expected cpu or cuda[:N], got {value!r} (the ops run on real data, "
                         f"on the CPU or a CUDA / ROCm GPU)")
    if not torch.cuda.is_available():
        raise UsageError(f"--device {value}: no CUDA device here (torch.cuda.is_available() is False; "
                         f"torch {torch.__version__}); use --device cpu")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise UsageError(f"--device {value}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return value


def at_least(option: str, value: int, low: int) -> int:
    if value < low:
        raise UsageError(f"--{option}: expected an int >= {low}, got {value}")
    return value


def top_k(value: int) -> int:
    """``--k``: the ops' range, 1 ..= dsa_ops.validate.MAX_K."""
    if not 1 <= value <= MAX_K:
        raise UsageError(f"--k: expected 1 <= k <= {MAX_K}, got {value}")
    return value


def compile_backend(name: str) -> str:
    """``--compile-backend``: a name torch.compile knows."""
    import torch._dynamo

    known = torch._dynamo.list_backends(exclude_tags=())
    if name not in known:
        raise UsageError(f"--compile-backend: no torch.compile backend named {name!r}; "
                         f"e.g. inductor, aot_eager, eager")
    need = _BACKEND_PACKAGES.get(name)
    if need is not None:
        if importlib.util.find_spec(need) is None:
            raise UsageError(f"--compile-backend {name}: needs the {need!r} package, which is not installed; "
                             f"e.g. inductor, aot_eager, eager")
    return name


# torch.compile backends that torch registers but that import another package when used.
_BACKEND_PACKAGES = {"tvm": "tvm", "onnxrt": "onnxruntime", "openxla": "torch_xla", "tensorrt": "torch_tensorrt",
                     "torch_tensorrt": "torch_tensorrt", "ipex": "intel_extension_for_pytorch"}


def output_file(option: str, path: str) -> str:
    """A file the command will write at its end: checked before any work, so that a long run
    does not end in a traceback (its folder must exist and be writable; not a folder itself)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"--{option}: {path!r} is a folder; expected a file name")
    if not os.path.isdir(folder):
        raise UsageError(f"--{option}: the folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"--{option}: the folder {folder!r} is not writable")
    return path


def folder_path(option: str, path: str) -> str:
    """A folder the command will write into: refused when a file of that name is in the way."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"--{option}: {path!r} exists and is not a folder")
    return path


def output_dir(option: str, path: str) -> str:
    """A folder the command writes into: created (with its parents) before any work."""
    folder_path(option, path)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--{option}: cannot create {path!r} ({exc.strerror})") from None
    if not os.access(path, os.W_OK):
        raise UsageError(f"--{option}: the folder {path!r} is not writable")
    return path


def policy(path: str | None):
    """``--policy`` (or ``$DSA_OPS_POLICY`` when None): the loaded policy; the message of a bad
    file names the option (or the variable) and the file."""
    try:
        return P.load(path) if path else P.current()
    except ValueError as exc:
        msg = str(exc)
        msg = msg[len("policy: "):] if msg.startswith("policy: ") else msg  # "policy: cannot read ..."
        raise UsageError(f"--policy: {msg}" if path else f"${P.ENV_VAR}: {msg}") from None


def int_list(option: str, value: str, low: int = 1, extra: tuple[str, ...] = (), empty: bool = True) -> list:
    """A comma list of ints >= ``low`` (and the words in ``extra``), e.g. ``--rows 1,8,16``;
    ``empty=False`` refuses a list with no item."""
    words = f" or {', '.join(extra)}" if extra else ""
    out = []
    for item in (x.strip() for x in value.split(",")):
        if not item:
            continue
        if item in extra:
            out.append(item)
            continue
        try:
            n = int(item)
        except ValueError:
            n = None
        if n is None or n < low:
            raise UsageError(f"--{option}: expected a comma list of ints >= {low}{words}, got {item!r} in {value!r}")
        out.append(n)
    if not out and not empty:
        raise UsageError(f"--{option}: expected a comma list of ints >= {low}{words}, got {value!r}")
    return out


def backend_names(option: str, value: str | None) -> list[str]:
    """A comma list of registered backend names (empty: none named; tests' stand-ins count)."""
    known = dsa_ops.backends()
    names = [n.strip() for n in (value or "").split(",") if n.strip()]
    bad = [n for n in names if n not in dsa_ops.backends(include_test_only=True)]
    if bad:
        raise UsageError(f"--{option}: no backend named {', '.join(map(repr, bad))}; registered: {sorted(known)}")
    return names
