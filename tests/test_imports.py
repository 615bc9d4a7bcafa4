"""The package's import graph: acyclic, with no function-local imports of dsa_ops modules in
the core (issue #45), so no module depends on another having finished loading first."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "dsa_ops"
# Entry points whose lazy imports keep a command's start cheap or an optional dependency
# optional; they are leaves (nothing in the package imports them at module level).
LEAVES = ("dsa_ops/commands/", "dsa_ops/tools/", "dsa_ops/cli.py")
# Modules loaded at first use, not by ``import dsa_ops`` (each says why).
LAZY = {
    "dsa_ops.backends.triton.kernels": "imports triton (optional)",
    "dsa_ops.backends.triton.kernels_radix": "imports triton (optional)",
    "dsa_ops.backends.cuda.topk": "the CUDA kernels' host side: loaded at the first cuda call",
}


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module(p): p for p in PKG.rglob("*.py")}


def _imports(path: Path, mods: dict, top_level: bool) -> set[str]:
    """dsa_ops modules imported by ``path``: at module level, or (top_level False) in functions."""
    tree = ast.parse(path.read_text())
    me = _module(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    nodes = tree.body if top_level else [n for f in ast.walk(tree)
                                          if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                                          for n in ast.walk(f)]
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in mods}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.add(sub if sub in mods else base)
    return {m for m in found if m in mods and m != me}


def test_module_level_imports_are_acyclic():
    mods = _modules()
    graph = {m: _imports(p, mods, top_level=True) for m, p in mods.items()}
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                pytest.fail("import cycle: " + " -> ".join(stack[stack.index(d):] + [m, d]) if d in stack
                            else f"import cycle through {m} -> {d}")
            if d not in state:
                visit(d, stack + [m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


def test_no_function_local_imports_of_package_modules():
    """Outside the entry points, a dsa_ops module imports the package's modules at the top."""
    mods = _modules()
    local = {m: sorted(_imports(p, mods, top_level=False)) for m, p in mods.items()
             if not str(p.relative_to(ROOT)).startswith(LEAVES)}
    assert {m: [d for d in ds if d not in LAZY] for m, ds in local.items() if set(ds) - set(LAZY)} == {}
