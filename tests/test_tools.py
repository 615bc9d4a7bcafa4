"""The lab's probes (``lab/``, in a checkout, outside the wheel) that run without a GPU: the
offline sm_90 compile of the radix kernel, the stall report, the read and floor probes' kernels
under the interpreter, each run the way its docstring says (``python -m lab.<probe>`` from the
repository root). Skips where ``lab`` is not importable (an installed wheel without a checkout)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("lab", reason="lab/ is in a checkout, not in the wheel")
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def _tool():
    return importlib.import_module("lab.offline_sass")


def _run_module(name, *args):
    """``python -m lab.<name> ARGS`` from the repository root, as the docs say."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, "-m", f"lab.{name}", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


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


def test_ncu_stalls_groups_samples_by_loop(capsys, tmp_path):
    """lab.ncu_stalls on a made-up source page: a 3-instruction loop with 90 of 100
    samples (60 long scoreboard, 30 wait), and the rows of an address range."""
    mod = importlib.import_module("lab.ncu_stalls")
    head = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_long_sb",
            "stall_wait", "stall_long_sb (Not Issued)"]
    body = [["0x100", "MOV R1, R2 ;", "10", "5", "0", "0", "0"],
            ["0x110", "LDG.E R3, [R4] ;", "30", "50", "0", "30", "0"],
            ["0x120", "FADD R5, R3, R1 ;", "60", "50", "60", "0", "60"],
            ["0x130", "@P0 BRA 0x110 ;", "0", "50", "0", "0", "0"]]
    page = tmp_path / "sass.csv"
    page.write_text("\n".join(",".join(f'"{c}"' for c in r) for r in [["Kernel Name", "k"], head] + body) + "\n")
    mod.main(["ncu_stalls", str(page), "0x110", "0x120"])
    out = capsys.readouterr().out
    assert "100 samples over 4 instructions" in out
    assert "loop 0x110-0x130: 3 instructions, 0.0M executed, 90.0 % of samples (long_sb 67 %, wait 33 %)" in out
    assert "0x120      60 long_sb" in out and "0x100" not in out.split("overall:")[1]


def test_read_probe_selfcheck():
    """The read probe's kernels (shipped lane loads, vector loads, cp.async, TMA) count the
    same keys as torch on ragged windows, under the interpreter on the CPU."""
    res = _run_module("read_probe", "--selfcheck")
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert [line.split(":")[0] for line in res.stdout.split()[::2]] == ["lanes", "flat", "async", "tma"], res.stdout


def test_floor_probe_selfcheck():
    """The floor probe's kernels (a read and count with barriers or a last arriver, the
    sample sort, the bin choice) agree with torch on small shapes under the interpreter, and
    the skeletons' bin choice is stored and checked (a discarded one may be compiled away)."""
    res = _run_module("floor_probe", "--selfcheck")
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    lines = res.stdout.splitlines()
    assert len(lines) == 5 and all(line.endswith(": ok") for line in lines), res.stdout
    assert "read P=4 L=16384 bar=0 last sort choose: ok" in lines and "read P=1 L=4096 bar=2 sort choose: ok" in lines


def test_host_cost_runs_and_reports_every_form(tmp_path):
    """``python -m lab.host_cost`` prints a row per call form and writes its JSON
    (a smoke run with few calls; the numbers are measured on the device, not asserted)."""
    import json

    res = _run_module("host_cost", "--calls", "20", "--json", str(tmp_path / "h.json"))
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [line for line in res.stdout.splitlines() if line.startswith("| no-op |")]
    assert len(rows) == 7, res.stdout
    got = json.loads((tmp_path / "h.json").read_text())["us"]["no-op"]
    assert set(got) == {r.split(" | ")[1] for r in rows} and all(v > 0 for v in got.values())


def test_split_replays_facts_from_made_up_stamps():
    """lab.cuda_split_replays reads a launch's nanosecond stamps: two rows of two
    CTAs, the second row's leader starting 3 us late and spending 50 us in its finish; the
    facts must name the placement spread, the span and the leaders' slowest phases."""
    import torch

    tool = importlib.import_module("lab.cuda_split_replays")
    d = torch.zeros(4, 16, dtype=torch.float64)
    # stamps: 0 start, 2 sample, 6 read, 7 exchange, 1 count, 5 end (leaders: CTAs 0 and 2)
    for cta, t0, finish in ((0, 1000, 2000), (2, 4000, 50000)):
        d[cta, [0, 2, 6, 7, 1, 5]] = torch.tensor([t0, t0 + 1500, t0 + 4000, t0 + 4500, t0 + 5000,
                                                    t0 + 5000 + finish], dtype=torch.float64)
    d[1, [0, 2, 6]] = torch.tensor([1200, 2700, 5000], dtype=torch.float64)  # a non-leader: no 7 / 1 / 5
    d[3, [0, 2, 6]] = torch.tensor([4100, 5600, 8000], dtype=torch.float64)
    f = tool._launch_facts(d, cluster=2)
    assert f["start_spread_us"] == pytest.approx(3.1)
    assert f["span_us"] == pytest.approx((4000 + 5000 + 50000 - 1000) / 1e3)
    assert f["sample_max_us"] == pytest.approx(1.5) and f["read_max_us"] == pytest.approx(2.5)
    assert f["finish_max_us"] == pytest.approx(50.0) and f["count_max_us"] == pytest.approx(0.5)
    assert tool._case("12x1048576x32768:split:8:16384+any") == (12, 1048576, 32768, "split:8:16384+any")
    with pytest.raises(SystemExit, match="ROWSxWIDTHxLENGTH"):
        tool._case("12x32768:auto")


@pytest.mark.parametrize("tool", ["probe_radix", "read_probe", "ncu_radix", "ncu_cuda_topk", "ncu_stalls"])
def test_hand_parsed_tools_answer_help(tool):
    """Tools that read sys.argv by hand print their docstring for --help and exit 0, before
    they touch a GPU or take --help for a file name."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    run = subprocess.run([sys.executable, "-m", f"lab.{tool}", "--help"], capture_output=True,
                         text=True, timeout=120, env=env)
    doc = importlib.util.find_spec(f"lab.{tool}")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Traceback" not in run.stderr and run.stdout.strip(), (run.stdout, run.stderr)
    assert doc is not None and run.stdout.split()[0] in Path(doc.origin).read_text()
