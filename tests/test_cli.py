"""The console script: help, the GPU-only commands refuse on CPU, explain runs."""

from __future__ import annotations

import os

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
@pytest.mark.parametrize("command", [["calibrate"], ["bench"], ["bench", "--e2e"], ["bench", "--stock"]])
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


def _policy_md_table() -> dict[str, list[tuple[int, str]]]:
    """docs/policy.md's table of the default rules: family -> [(#, backend), ...]."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "policy.md").read_text(encoding="utf-8")
    rows: dict[str, list[tuple[int, str]]] = {"decode": [], "prefill": []}
    for fam, n, backend in re.findall(r"^\| (decode|prefill) \| (\d+) \| [^|]+ \| `(\w+)`", text, flags=re.M):
        rows[fam].append((int(n), backend))
    return rows


def test_explain_numbers_rules_as_the_policy_doc_does(capsys):
    """explain's "decode rule N" is the N of docs/policy.md's table of the default rules,
    which lists every default rule in order, numbered from 1."""
    from dsa_ops import policy as P

    table = _policy_md_table()
    for fam in ("decode", "prefill"):
        rules = getattr(P.DEFAULT, fam)
        assert table[fam] == [(i, r.backend) for i, r in enumerate(rules, 1)], fam
    assert cli.main(["explain", "--width", "4096", "--layers", "1"]) == 0
    n = next(i for i, b in table["decode"] if b == "reference")
    assert f"why: decode rule {n}: pure PyTorch reference" in capsys.readouterr().out


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
    (["explain", "--policy", "/nonexistent/p.json"], "--policy: cannot read '/nonexistent/p.json'"),
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
    # checked before any timing: a run must not end in a traceback, nor report unchecked outputs as ok
    (["bench", "--reps", "5"], "--reps: expected an int >= 30, got 5"),
    (["bench", "--verify-rows", "0"], "--verify-rows: expected an int >= 1, got 0"),
    (["bench", "--rows", "", "--prefill-c", ""], "nothing to time"),
    (["bench", "--e2e", "--e2e-contexts", ""], "--e2e-contexts: expected a comma list of ints >= 1, got ''"),
    (["bench", "--out", "README.md"], "--out: 'README.md' exists and is not a folder"),
    (["calibrate", "--out", "/nonexistent/p.json"], "--out: the folder '/nonexistent' does not exist"),
    (["calibrate", "--context-mix", "4096:0.5,x"], "--context-mix: expected L:weight items"),
    (["calibrate", "--rows", "0"], "--rows: expected a comma list of ints >= 1, got '0'"),
    (["calibrate", "--from-measurements", "/nonexistent/c.json"], "--from-measurements: cannot read"),
    (["calibrate", "--from-measurements", "README.md"], "--from-measurements: 'README.md' holds no calibrate"),
    (["bench", "--policy", "p.json"], "--policy: only --stock routes by a policy"),
    (["bench", "--stock", "--e2e"], "--stock and --e2e: two different benches"),
    (["bench", "--stock", "--backends", "cuda"], "--backends: --stock times stock vLLM's choice"),
    (["bench", "--stock", "--policy", "/nonexistent/p.json"], "--policy: cannot read '/nonexistent/p.json'"),
    (["calibrate", "--out", "p.md"], "--report: 'p.md' is also --out"),
    # a rebuild names what the stored run lacks, and a faulting backend alone is no candidate set
    (["calibrate", "--from-measurements", "docs/benchmarks/h100-cal.json", "--backends", "reference"],
     "--backends: reference not measured in 'docs/benchmarks/h100-cal.json' (measured: cuda,"),
    (["calibrate", "--from-measurements", "docs/benchmarks/h100-cal.json", "--context-mix", "4096:0.5,1234:0.5"],
     "--context-mix: L = [1234] not measured in 'docs/benchmarks/h100-cal.json' (measured L: [4096, 32768, 131072])"),
    (["calibrate", "--from-measurements", "docs/benchmarks/h100-cal.json", "--rows", "1,2"],
     "--rows: only for a measuring run; --from-measurements rebuilds from the stored grid"),
    (["calibrate", "--from-measurements", "docs/benchmarks/h100-cal.json", "--quick"], "--quick: only for a measuring"),
    (["calibrate", "--from-measurements", "docs/benchmarks/h100-cal.json", "--k", "1024"],
     "--k 1024: 'docs/benchmarks/h100-cal.json' was measured at k = 2048"),
    (["calibrate", "--backends", "vllm_cooperative"], "--backends: vllm_cooperative has a known fault on legal input"),
    (["calibrate", "--out", "p.json", "--report", "/nonexistent/r.md"], "--report: the folder '/nonexistent' does not"),
    (["demo", "--compile-backend", "tvm"], "--compile-backend tvm: needs the 'tvm' package"),
]
if _no_cuda_build():
    BAD += [(["demo", "--device", "cuda"], "--device cuda: no CUDA device here"),
            (["explain", "--device", "cuda"], "--device cuda: no CUDA device here")]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_values_are_one_line_and_exit_2(argv, message, capsys, monkeypatch):
    """Issue #24 item 7: like bench on a CPU, a value a command cannot use is one line on
    stderr naming the option, and exit status 2 (no traceback)."""
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # README.md, a writable folder
    assert cli.main(argv) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"dsa-ops {argv[0]}: ") and message in lines[0], cap.err
    assert "Traceback" not in cap.err + cap.out


BAD_ROW_BANDS = [
    ({"min_rows": 5, "max_rows": 5}, "decode[0].max_rows: expected more than min_rows (5), got 5 (an empty band)"),
    ({"min_rows": -1}, "decode[0].min_rows: expected a non-negative int or null, got -1"),
    ({"max_rows": "64"}, "decode[0].max_rows: expected a non-negative int or null, got '64'"),
    ({"min_rows": None}, "decode[0].min_rows: expected a non-negative int, got null"),
    ({"max_rows": True}, "decode[0].max_rows: expected a non-negative int or null, got True"),
]


@pytest.mark.parametrize("command", [["explain"], ["bench", "--stock"]])
@pytest.mark.parametrize("band, message", BAD_ROW_BANDS, ids=[str(b) for b, _ in BAD_ROW_BANDS])
def test_bad_row_band_in_a_policy_file_names_the_option_and_field(band, message, command, tmp_path, capsys):
    """A --policy file with a bad min_rows / max_rows: one line naming --policy, the file and
    the field, exit 2, before anything is compiled or timed."""
    import json

    path = tmp_path / "p.json"
    path.write_text(json.dumps({"decode": [{"backend": "cuda", **band}]}))
    assert cli.main([*command, "--policy", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"dsa-ops {command[0]}: --policy: policy ({path}): {message}", err


@pytest.mark.parametrize("argv, option", [(["explain", "--rows", "100000"], "--rows 100000"),
                                          (["demo", "--batch", "100000"], "--batch 100000")])
def test_inputs_too_big_for_the_device_are_a_usage_error(argv, option, monkeypatch, capsys):
    """explain --rows / demo --batch x --width whose key cache cannot be allocated: one line naming
    both options and the size, exit 2 (was the allocator's traceback)."""
    from dsa_ops.commands import demo

    def no_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(demo, "random_inputs", no_memory)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dsa-ops {argv[0]}: {option} x --width 8192: the step's key cache (100000 x 8192 x 32 "
                          f"fp32, 97.7 GiB) does not fit on cpu"), err


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


def test_bench_side_by_side_counts_targets_from_the_runs_own_timings():
    """bench.md's issue-23 table: cuda against 0.8x raw cooperative_topk and against vllm's
    prefill, from the records of the same run; a wrong output never holds; no peer, no table."""
    from dsa_ops.commands.bench import _side_by_side

    def rec(fam, rows, length, backend, us, verified="ok"):
        return {"family": fam, "rows": rows, "width": 133120 if fam == "decode" else length, "length": length,
                "backend": backend, "median_us": us, "verified": verified}

    records = [
        rec("decode", 64, 131072, "cuda", 37.5), rec("decode", 64, 131072, "vllm_cooperative:raw", 47.0),
        rec("decode", 1, 4096, "cuda", 8.6), rec("decode", 1, 4096, "vllm_cooperative:raw", 7.5),
        rec("decode", 8, 4096, "cuda", 5.0, verified="WRONG"), rec("decode", 8, 4096, "vllm_cooperative:raw", 7.6),
        rec("decode", 16, 4096, "cuda", 5.0),  # no peer timed here: no row
        rec("prefill", 16384, 131072, "cuda", 3677.0), rec("prefill", 16384, 131072, "vllm", 5990.0),
        rec("prefill", 16384, 16384, "cuda", 720.0), rec("prefill", 16384, 16384, "vllm", 710.0),
    ]
    names = ["cuda", "vllm", "vllm_cooperative", "vllm_cooperative:raw", "reference"]
    text = _side_by_side(records, names)
    assert "| decode | 64 | 133120 | 131072 | 47.0 | 37.6 | 37.5 (0.80x, holds) |" in text
    assert "| decode | 1 | 133120 | 4096 | 7.5 | 6.0 | 8.6 (1.15x) |" in text
    assert "| decode | 8 | 133120 | 4096 | 7.6 | 6.1 | 5.0 (0.66x) |" in text  # wrong: never holds
    assert "| 16 | 133120 | 4096 |" not in text
    assert "| prefill | 16384 | 131072 | 131072 | 5990.0 | 5990.0 | 3677.0 (0.61x, holds) |" in text
    assert "| prefill | 16384 | 16384 | 16384 | 710.0 | 710.0 | 720.0 (1.01x) |" in text
    assert "- cuda: decode target held at 1 of 3 shapes; prefill at 1 of 2 chunks." in text
    assert "vllm_cooperative us (/ peer)" not in text and "reference us" not in text  # peers and reference: no column
    assert _side_by_side([r for r in records if r["backend"] == "cuda"], names) == ""


def test_help_and_bench_notes_name_no_issue_numbers(capsys):
    """What a user reads (every command's --help, the notes bench writes into bench.md) says
    what the targets are rather than citing the tracker ("the issue-23 targets")."""
    import re

    from dsa_ops.commands import bench

    ref = re.compile(r"\bissues?[- ]?#?\d+|\bthe issue'?s?\b", re.I)
    texts = {"bench.SIDES_NOTE": bench.SIDES_NOTE}
    for name in cli.COMMANDS:
        with pytest.raises(SystemExit):
            cli.main([name, "--help"])
        texts[f"{name} --help"] = capsys.readouterr().out
    assert {k: ref.findall(v) for k, v in texts.items() if ref.search(v)} == {}


def test_bench_adapter_cost_past_64_rows_compares_cooperative_with_raw_persistent():
    """Past vLLM's 64-row cooperative limit the vllm_cooperative adapter runs persistent_topk, so
    the adapter-cost table takes raw persistent_topk as its raw side there."""
    from dsa_ops.commands.bench import _overhead_table

    recs = [{"family": "decode", "rows": r, "width": 100, "length": 50, "backend": b, "median_us": us}
            for r in (64, 65) for b, us in (("vllm_cooperative:raw+fill", 5.0), ("vllm_cooperative", 6.0),
                                            ("vllm_persistent:raw", 7.0))]
    text = _overhead_table(recs, ["vllm_cooperative:raw+fill", "vllm_persistent:raw"])
    assert "| 64 | 100 | 50 | - | 5.0 / 6.0 / +1.0 |" in text and "| 65 | 100 | 50 | - | 7.0 / 6.0 / -1.0 |" in text


def test_bench_e2e_reads_its_backend_list_as_the_option_check_does(tmp_path, monkeypatch):
    """--e2e-backends 'reference, torch_topk' passes the option check (names stripped); the run
    must time those two (it looked up ' torch_topk' and raised)."""
    import argparse

    from dsa_ops import e2e
    from dsa_ops.commands import bench_e2e

    seen = []

    def fake_bench(names, contexts, batches, reps, progress):
        seen.append((names, contexts, batches))
        return [{"context": 4096, "batch": 1, "backend": n, "step_us": 1.0, "kernels": 3, "mismatches": 0}
                for n in names]

    monkeypatch.setattr(e2e, "bench_e2e", fake_bench)
    args = argparse.Namespace(e2e_backends="reference, torch_topk,", e2e_contexts="4096", e2e_batches="1", reps=30,
                              out=str(tmp_path))
    meta = {"device": "d", "torch": "t", "triton": "tr", "date": "x"}
    assert bench_e2e.run(args, meta) == 0
    assert seen == [(["reference", "torch_topk"], [4096], [1])]
