"""Build vLLM 0.33.0's indexer top-k ops from its source release, without the vLLM wheel.

The ops (``top_k_per_row_decode``, ``top_k_per_row_prefill``, ``persistent_topk``,
``cooperative_topk``) are what the ``vllm``, ``vllm_persistent`` and ``vllm_cooperative``
backends call. vLLM's wheel pins its own torch; this tool compiles vLLM's unchanged CUDA
sources against the torch that is installed, into ``<dest>/vllm/_C_stable_libtorch.so``
next to a small ``<dest>/vllm/__init__.py``, so that with ``<dest>`` on ``PYTHONPATH`` the
backends' probe (``import vllm._C_stable_libtorch``) finds them under ``torch.ops._C``.
docs/vllm-kernels.md is the walk-through. Two steps::

    # anywhere with the source release (no GPU needed): copy the few files the ops need
    python -m dsa_ops.tools.build_vllm_topk extract --sdist vllm-0.33.0.tar.gz --dest vllm-topk-src
    # on the CUDA machine (nvcc, ninja, torch with CUDA):
    python -m dsa_ops.tools.build_vllm_topk build --src vllm-topk-src --dest vllm-topk
    PYTHONPATH=vllm-topk python -c "import dsa_ops; print(dsa_ops.backends()['vllm_cooperative'].availability())"

The C++ glue (op registration, module entry point, two stable-ABI shims that torch 2.11
lacks) is :mod:`dsa_ops.tools.vllm_topk_glue`; the vLLM files are compiled as shipped.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VLLM_VERSION = "0.33.0"
# The translation units that define the four ops' host functions and kernels.
SOURCES = ("topk.cu", "sampler.cu", "cooperative_topk.cu")
# Headers the sources name that ship with torch / CUDA, not with vLLM: never copied.
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
MODULE = "_C_stable_libtorch"
# Hopper's arch-specific target: cooperative_topk uses thread-block clusters and TMA.
DEFAULT_ARCH = "9.0a"
DEFINES = ("-DUSE_CUDA", "-DVLLM_ENABLE_COOPERATIVE_TOPK=1")
# torch's extension builder disables half / bf16 operators; vLLM's build does not, and
# sampler.cu's other kernels use them.
NVCC_UNDEFINES = ("-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
                  "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__")


def needed_files(csrc: Path) -> list[str]:
    """:data:`SOURCES` and every quoted ``#include`` they reach inside ``csrc`` (relative
    paths, sorted). An include that is not a file under ``csrc`` (torch, CUDA) is skipped."""
    todo = list(SOURCES) + ["ops.h"]
    seen: set[str] = set()
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        path = csrc / rel
        if not path.is_file():
            if rel in SOURCES:
                raise ValueError(f"src: {path} is missing; expected vLLM {VLLM_VERSION}'s csrc/{rel}")
            continue
        seen.add(rel)
        for inc in _INCLUDE.findall(path.read_text(errors="replace")):
            for cand in (os.path.normpath(os.path.join(os.path.dirname(rel), inc)), inc):
                if (csrc / cand).is_file():
                    todo.append(cand)
                    break
    return sorted(seen)


def _csrc_of(sdist: Path, tmp: Path) -> Path:
    """The ``csrc`` folder of a source release given as a .tar.gz or an unpacked folder."""
    if sdist.is_dir():
        root = sdist
    elif sdist.is_file() and sdist.name.endswith((".tar.gz", ".tgz")):
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if "/csrc/" in m.name and m.isfile()]
            tar.extractall(tmp, members=members, filter="data")
        tops = [p for p in tmp.iterdir() if p.is_dir()]
        if len(tops) != 1:
            raise ValueError(f"sdist: {sdist} does not unpack to one folder (got {[p.name for p in tops]})")
        root = tops[0]
    else:
        raise ValueError(f"sdist: expected vllm-{VLLM_VERSION}.tar.gz or its unpacked folder, got {sdist}")
    csrc = root / "csrc"
    if not csrc.is_dir():
        raise ValueError(f"sdist: {root} has no csrc/ folder; is it vLLM's source release?")
    return csrc


def extract(sdist: Path, dest: Path) -> list[str]:
    """Copy the csrc files the four ops need from a vLLM source release into ``dest``."""
    with tempfile.TemporaryDirectory() as tmp:
        csrc = _csrc_of(sdist, Path(tmp))
        files = needed_files(csrc)
        for rel in files:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(csrc / rel, dest / rel)
    (dest / "VLLM_VERSION").write_text(VLLM_VERSION + "\n")
    return files


def write_glue(folder: Path) -> list[Path]:
    """Write the glue sources into ``folder``; returns (compat header, shims, registration)."""
    from dsa_ops.tools import vllm_topk_glue as glue

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name, text in (("dsa_ops_compat.h", glue.COMPAT_H), ("dsa_ops_shims.cpp", glue.SHIMS_CPP),
                       ("dsa_ops_register.cpp", glue.REGISTER_CPP)):
        (folder / name).write_text(text.lstrip())
        out.append(folder / name)
    return out


def compile_library(src: Path, build: Path, arch: str, jobs: int, verbose: bool) -> Path:
    """Compile the sources and the glue with torch's extension builder; returns the .so.

    Runs in a child process: torch's builder loads the library it builds, which registers
    the ops, and the parent must stay free to import the installed copy afterwards.
    """
    missing = [s for s in SOURCES if not (src / s).is_file()]
    if missing:
        raise ValueError(f"src: {src} lacks {missing}; run the 'extract' step first")
    compat, shims, register = write_glue(build / "glue")
    sources = [str(src / s) for s in SOURCES] + [str(register), str(shims)]
    include = ("-include", str(compat))
    spec = {
        "name": MODULE,
        "sources": sources,
        "extra_cflags": ["-O3", "-std=c++17", *DEFINES, *include],
        "extra_cuda_cflags": ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "--expt-extended-lambda",
                              *DEFINES, *NVCC_UNDEFINES, *include],
        "extra_include_paths": [str(src)],
        "build_directory": str(build),
        "verbose": verbose,
        "is_python_module": False,
    }
    env = dict(os.environ, TORCH_CUDA_ARCH_LIST=arch, MAX_JOBS=str(jobs))
    code = ("import json, sys, torch.utils.cpp_extension as ce; "
            "spec = json.loads(sys.argv[1]); ce.load(**spec); print('built')")
    import json

    subprocess.run([sys.executable, "-c", code, json.dumps(spec)], env=env, check=True)
    lib = build / f"{MODULE}.so"
    if not lib.is_file():
        raise RuntimeError(f"the build finished but {lib} is missing")
    return lib


def install(lib: Path, dest: Path) -> Path:
    """Place the library as ``dest/vllm/_C_stable_libtorch.so`` with a minimal package."""
    pkg = dest / "vllm"
    pkg.mkdir(parents=True, exist_ok=True)
    init = pkg / "__init__.py"
    ours = ("dsa_ops.tools.build_vllm_topk", "dsa_ops.devtools.build_vllm_topk")  # the tool's old home too
    if init.exists() and not any(m in init.read_text() for m in ours):
        raise ValueError(f"dest: {pkg} holds another vllm package; choose an empty --dest")
    init.write_text(
        '"""vLLM 0.33.0\'s indexer top-k ops only, built by dsa_ops.tools.build_vllm_topk.\n\n'
        "Not vLLM: only vllm._C_stable_libtorch exists here. Remove this folder from\n"
        'PYTHONPATH before installing the real vLLM."""\n\n'
        f'__version__ = "{VLLM_VERSION}+topk-only"\n'
    )
    target = pkg / f"{MODULE}.so"
    shutil.copy2(lib, target)
    return target


def check(dest: Path) -> str:
    """Import the installed copy in a fresh interpreter and name the ops it registered."""
    code = ("import torch, vllm._C_stable_libtorch as m; "
            "names = ['top_k_per_row_decode', 'top_k_per_row_prefill', 'persistent_topk', 'cooperative_topk']; "
            "missing = [n for n in names if not hasattr(torch.ops._C, n)]; "
            "print('missing: ' + ', '.join(missing) if missing else 'ok: torch.ops._C.' + ', '.join(names)); "
            "raise SystemExit(1 if missing else 0)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(dest), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"the installed ops do not import: {proc.stdout}{proc.stderr}")
    return proc.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dsa_ops.tools.build_vllm_topk", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="step", required=True)
    e = sub.add_parser("extract", help="copy the csrc files the four ops need out of vLLM's source release")
    e.add_argument("--sdist", required=True, type=Path, help=f"vllm-{VLLM_VERSION}.tar.gz or its unpacked folder")
    e.add_argument("--dest", required=True, type=Path, help="folder to copy them into")
    b = sub.add_parser("build", help="compile them against the installed torch and install vllm/_C_stable_libtorch.so")
    b.add_argument("--src", required=True, type=Path, help="the folder 'extract' wrote")
    b.add_argument("--dest", required=True, type=Path, help="folder to put on PYTHONPATH (gets vllm/)")
    b.add_argument("--build-dir", type=Path, default=None, help="object files (default: <dest>/build)")
    b.add_argument("--arch", default=DEFAULT_ARCH, help=f"TORCH_CUDA_ARCH_LIST value (default: {DEFAULT_ARCH})")
    b.add_argument("--jobs", type=int, default=os.cpu_count() or 4, help="parallel compiler jobs")
    b.add_argument("--verbose", action="store_true", help="print the compiler commands")
    args = p.parse_args(argv)
    if args.step == "extract":
        files = extract(args.sdist, args.dest)
        size = sum((args.dest / f).stat().st_size for f in files)
        print(f"copied {len(files)} files ({size // 1024} KiB) to {args.dest}: {' '.join(files)}")
        return 0
    lib = compile_library(args.src.resolve(), (args.build_dir or args.dest / "build").resolve(), args.arch,
                          args.jobs, args.verbose)
    target = install(lib, args.dest)
    print(f"installed {target}")
    print(check(args.dest))
    print(f"use it with: export PYTHONPATH={args.dest.resolve()}${{PYTHONPATH:+:$PYTHONPATH}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
