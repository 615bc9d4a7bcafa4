"""On-disk cubin cache: one file per (source and headers hash, arch, NVRTC version, options).

The folder is ``$DSA_OPS_CUDA_CACHE`` if set, else ``$XDG_CACHE_HOME/dsa_ops/cuda``, else
``~/.cache/dsa_ops/cuda``. Files are written to a temporary name and renamed, so two
processes compiling the same kernel at once both end with a whole file. A cache that
cannot be written (read-only home) only costs a compile per process.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

# Bumped when the key's meaning or the file format changes.
FORMAT = 1


def cache_dir() -> Path:
    """The folder cubins are kept in (not created here)."""
    explicit = os.environ.get("DSA_OPS_CUDA_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dsa_ops" / "cuda"


def source_hash(source: str) -> str:
    """sha256 of the source text (hex): any edit of a kernel makes a new cubin."""
    return hashlib.sha256(source.encode()).hexdigest()


def program_hash(source: str, headers: Optional[Mapping[str, str]] = None) -> str:
    """sha256 (hex) of a program: its source, then each named header's name and text. With no
    headers, :func:`source_hash`."""
    if not headers:
        return source_hash(source)
    h = hashlib.sha256(source_hash(source).encode())
    for name, text in headers.items():
        h.update(b"\0" + name.encode() + b"\0" + source_hash(text).encode())
    return h.hexdigest()


def cache_key(source: str, arch: str, nvrtc_version: tuple[int, int], options: Sequence[str] = (),
              headers: Optional[Mapping[str, str]] = None) -> str:
    """Hex key of one build: the source and its named headers, the target, the compiler and its
    options."""
    h = hashlib.sha256()
    for part in (f"format={FORMAT}", program_hash(source, headers), arch, "nvrtc=%d.%d" % nvrtc_version, *options):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def cubin_path(name: str, key: str, folder: Optional[Path] = None) -> Path:
    """Where the build of ``name`` with ``key`` lives."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
    return (folder or cache_dir()) / f"{safe}-{key[:32]}.cubin"


def read(path: Path) -> Optional[bytes]:
    """The cached cubin, or None when absent or empty (a torn write never leaves one)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return data or None


def write(path: Path, data: bytes) -> bool:
    """Store ``data`` at ``path`` atomically; False (and nothing raised) if the folder is not writable."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return True
    except OSError:
        return False


def get_or_build(name: str, source: str, arch: str, nvrtc_version: tuple[int, int],
                 options: Sequence[str], build: Callable[[], bytes],
                 folder: Optional[Path] = None, headers: Optional[Mapping[str, str]] = None) -> tuple[bytes, bool]:
    """(cubin, was it cached): read the cached build, or ``build()`` it and store it."""
    path = cubin_path(name, cache_key(source, arch, nvrtc_version, options, headers), folder)
    data = read(path)
    if data is not None:
        return data, True
    data = build()
    write(path, data)
    return data, False
