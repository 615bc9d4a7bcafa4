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
