"""Developer tools that run without a GPU: the offline sm_90 compile of the radix kernel."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
TOOL = Path(__file__).resolve().parents[1] / "tools" / "offline_sass.py"
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def _tool():
    spec = importlib.util.spec_from_file_location("offline_sass", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(not os.access(BIN / "cuobjdump", os.X_OK) or not os.access(BIN / "ptxas", os.X_OK),
                    reason="this Triton ships no ptxas / cuobjdump")
def test_offline_sass_reports_the_read_loop(capsys, tmp_path):
    """The shipped row-mode build compiles for sm_90 here, and the report finds the
    bracket's read loop (a tool that silently lost it would mislead kernel work)."""
    tool = _tool()
    sass = tmp_path / "k.sass"
    assert tool.main(["--mode", "row", "--sass", str(sass)]) == 0
    out = capsys.readouterr().out
    from dsa_ops.backends.triton import radix_launch as rl

    assert f"row mode, 4 warps, maxnreg {rl.ROW_MAXNREG}" in out
    assert "registers " in out and "bracket read loop 0x" in out, out
    assert "ATOMG" in sass.read_text()
    with pytest.raises(SystemExit, match="not a parameter"):
        tool.main(["NOT_A_PARAM=1"])
