"""The console script: help, the GPU-only commands refuse on CPU, explain runs."""

from __future__ import annotations

import pytest
import torch

from dsa_ops import cli


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for name in cli.COMMANDS:
        assert name in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
@pytest.mark.parametrize("command", [["calibrate"], ["bench"], ["bench", "--e2e"]])
def test_gpu_commands_refuse_on_cpu(command, capsys):
    assert cli.main(command) == 2
    err = capsys.readouterr().err
    assert "GPU" in err or "CUDA" in err


def test_explain_prints_rewrites_guards_and_uuid(capsys):
    assert cli.main(["explain", "--width", "4096", "--layers", "2"]) == 0
    text = capsys.readouterr().out
    assert text.count("-> dsa_ops::topk_decode_reference") == 2
    assert "L['max_seqlen_k'] <= 32767" in text and "32768 <= L['max_seqlen_k']" in text
    assert "pass uuid: " in text


def test_explain_with_policy_file(tmp_path, capsys):
    from dsa_ops import policy as P

    path = tmp_path / "p.json"
    P.save(P.Policy(decode=(P.Rule("torch_topk", "from file"),), prefill=(P.Rule("reference"),),
                    prefill_threshold=100, name="filetest"), path)
    assert cli.main(["explain", "--policy", str(path), "--width", "4096", "--layers", "1"]) == 0
    text = capsys.readouterr().out
    assert "-> dsa_ops::topk_decode_torch_topk" in text and "from file" in text
    assert "policy: filetest" in text and "L['max_seqlen_k'] <= 99" in text


def _no_cuda_build() -> bool:
    return not torch.cuda.is_available()


BAD = [
    (["demo", "--k", "0"], "--k: expected 1 <= k <= 4096, got 0"),
    (["demo", "--k", "5000"], "--k: expected 1 <= k <= 4096, got 5000"),
    (["demo", "--layers", "0"], "--layers: expected an int >= 1, got 0"),
    (["demo", "--width", "-5"], "--width: expected an int >= 1, got -5"),
    (["demo", "--batch", "0"], "--batch: expected an int >= 1, got 0"),
    (["demo", "--device", "meta"], "--device: expected cpu or cuda[:N], got 'meta'"),
    (["demo", "--device", "bogus"], "--device: expected cpu or cuda[:N], got 'bogus'"),
    (["demo", "--compile-backend", "nope"], "--compile-backend: no torch.compile backend named 'nope'"),
    (["explain", "--k", "0"], "--k: expected 1 <= k <= 4096, got 0"),
    (["explain", "--layers", "0"], "--layers: expected an int >= 1, got 0"),
    (["explain", "--width", "-5"], "--width: expected an int >= 1, got -5"),
    (["explain", "--device", "meta"], "--device: expected cpu or cuda[:N], got 'meta'"),
    (["explain", "--policy", "/nonexistent/p.json"], "policy: cannot read '/nonexistent/p.json'"),
    # bench / calibrate check their values before they look for a GPU (on one they used to end in
    # a KeyError or ValueError traceback)
    (["bench", "--backends", "nope"], "--backends: no backend named 'nope'; registered:"),
    (["bench", "--rows", "x"], "--rows: expected a comma list of ints >= 1, got 'x'"),
    (["bench", "--widths", "0"], "--widths: expected a comma list of ints >= 1, got '0'"),
    (["bench", "--lengths", "4096,mixed,y"], "--lengths: expected a comma list of ints >= 0 or mixed, got 'y'"),
    (["bench", "--k", "0"], "--k: expected 1 <= k <= 4096, got 0"),
    (["bench", "--e2e", "--e2e-backends", "zz"], "--e2e-backends: no backend named 'zz'"),
    (["calibrate", "--backends", "nope"], "--backends: no backend named 'nope'; registered:"),
    (["calibrate", "--k", "5000"], "--k: expected 1 <= k <= 4096, got 5000"),
]
if _no_cuda_build():
    BAD += [(["demo", "--device", "cuda"], "--device cuda: no CUDA device here"),
            (["explain", "--device", "cuda"], "--device cuda: no CUDA device here")]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_values_are_one_line_and_exit_2(argv, message, capsys):
    """Issue #24 item 7: like bench on a CPU, a value a command cannot use is one line on
    stderr naming the option, and exit status 2 (no traceback)."""
    assert cli.main(argv) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"dsa-ops {argv[0]}: ") and message in lines[0], cap.err
    assert "Traceback" not in cap.err + cap.out


def test_bad_policy_file_from_the_environment(tmp_path, monkeypatch, capsys):
    path = tmp_path / "p.json"
    path.write_text('{"decode": [{"backend": "nope"}]}')
    monkeypatch.setenv("DSA_OPS_POLICY", str(path))
    assert cli.main(["demo", "--width", "64", "--layers", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dsa-ops demo: $DSA_OPS_POLICY: policy (") and "decode[0].backend" in err, err


def test_demo_runs_and_checks_every_layer(capsys):
    """The README's first command, at a smaller width: eager and compiled results match the
    reference on every layer, the pass rewrote one node a layer, new lengths replay."""
    assert cli.main(["demo", "--width", "4096", "--layers", "3", "--batch", "5"]) == 0
    out = capsys.readouterr().out
    assert "IndexerTopKPass rewrote 3 generic dsa_ops::topk_decode node(s)" in out
    for name in ("eager", "compiled", "compiled, new lengths"):
        assert f"  {name}: matches the reference on all 3 layers" in out
    assert out.rstrip().endswith("demo OK")
