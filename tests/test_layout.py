"""Product and lab apart (issue 45): the wheel packages ``dsa_ops*`` and ``passes*`` only, the
package never imports the checkout's ``lab/``, and every tool the README names for users
runs from the installed package."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import pytest

        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_wheel_holds_the_package_only():
    cfg = _pyproject()["tool"]["setuptools"]
    assert cfg["packages"]["find"]["include"] == ["dsa_ops*", "passes*"]
    data = cfg.get("package-data", {})
    assert all(k.startswith(("dsa_ops", "passes")) for k in data), data
    assert not re.search(r"devtools|\blab\b", repr(data)), data
    assert not (ROOT / "dsa_ops" / "devtools").exists()


def test_the_package_never_imports_the_lab():
    imports = re.compile(r"^\s*(?:from|import)\s+lab\b", re.M)
    hits = [str(p.relative_to(ROOT)) for d in ("dsa_ops", "passes") for p in sorted((ROOT / d).rglob("*.py"))
            if imports.search(p.read_text(encoding="utf-8"))]
    assert hits == []


def test_every_tool_the_readme_names_ships(tmp_path):
    """``python -m X`` in the README: X is a module of the package (so it runs from a wheel)
    or a ``lab.`` probe, which the README calls checkout-only."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"python -m ([\w.]+)", text)) - {"pytest"}
    assert "dsa_ops.tools.build_vllm_topk" in named
    assert "outside the wheel" in text.lower() and "lab/" in text
    for mod in sorted(n for n in named if not n.startswith("lab.")):
        assert mod.split(".")[0] in ("dsa_ops", "passes"), mod
        assert importlib.util.find_spec(mod) is not None, mod
    run = subprocess.run([sys.executable, "-m", "dsa_ops.tools.build_vllm_topk", "--help"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "extract" in run.stdout, run.stderr[-2000:]
