"""Every ```python block of README.md and docs/*.md runs as written (issue #24 item 1).

A block runs alone, in a fresh namespace, in a scratch directory. An HTML comment on the
line right before its opening fence changes that (the comment does not show on the page):

* ``<!-- snippet: continues -->``: runs in the namespace of the page's previous block;
* ``<!-- snippet: needs cuda -->`` / ``needs vllm`` / ``needs aiter``: runs only where that
  is present (a CUDA device; ``vllm`` / ``aiter`` importable), and skips with that reason
  elsewhere;
* ``<!-- snippet: skip REASON -->``: never runs (a fragment of someone else's code, say);
  the test reports the skip with REASON.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests import gpu

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"^<!--\s*snippet:\s*(continues|needs\s+(\w+)|skip\s+(.+?))\s*-->$")
NEEDS = {
    "cuda": (lambda: not gpu.device_reason(), "needs a CUDA device (tests/gpu.py)"),
    "vllm": (lambda: importlib.util.find_spec("vllm") is not None, "needs vLLM"),
    "aiter": (lambda: importlib.util.find_spec("aiter") is not None, "needs AITER"),
}


@dataclass
class Snippet:
    page: Path
    line: int  # of the opening fence, 1-based
    code: str
    continues: bool = False
    needs: str | None = None
    skip: str | None = None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def snippets(page: Path) -> list[Snippet]:
    """The page's ```python blocks, in order, with the mark of the line before each."""
    lines = page.read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() != "```python":
            if lines[i].strip().startswith("```"):  # another language's block: skip past it
                j = i + 1
                while j < len(lines) and lines[j].strip() != "```":
                    j += 1
                i = j
            i += 1
            continue
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        if j == len(lines):
            raise AssertionError(f"{page}:{i + 1}: ```python block never closed")
        snip = Snippet(page, i + 1, "\n".join(lines[i + 1:j]) + "\n")
        m = MARK.match(lines[i - 1].strip()) if i > 0 else None
        if m and m.group(1) == "continues":
            snip.continues = True
        elif m and m.group(2):
            if m.group(2) not in NEEDS:
                raise AssertionError(f"{snip.id}: unknown 'needs {m.group(2)}'; known: {sorted(NEEDS)}")
            snip.needs = m.group(2)
        elif m:
            snip.skip = m.group(3)
        out.append(snip)
        i = j + 1
    return out


ALL = [s for page in PAGES for s in snippets(page)]


def test_the_readme_has_cpu_snippets():
    """The README's snippets are the first thing a user runs: they carry no mark."""
    readme = [s for s in ALL if s.page.name == "README.md"]
    assert len(readme) >= 2
    assert all(s.needs is None and s.skip is None for s in readme), [s.id for s in readme]


def test_marks_are_parsed(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# t\n\n```python\na = 1\n```\n<!-- snippet: continues -->\n```python\nb = a\n```\n"
                    "```bash\n```python\n```\n<!-- snippet: needs cuda -->\n```python\nc = 1\n```\n"
                    "<!-- snippet: skip a model's forward, illustrative -->\n```python\nd(\n```\n")
    got = snippets(page)
    assert [(s.line, s.continues, s.needs, s.skip) for s in got] == [
        (3, False, None, None), (7, True, None, None), (14, False, "cuda", None),
        (18, False, None, "a model's forward, illustrative")]


_namespaces: dict[Path, dict] = {}


@pytest.mark.parametrize("snip", ALL, ids=[s.id for s in ALL])
def test_snippet_runs(snip, tmp_path, monkeypatch):
    prev = _namespaces.pop(snip.page, None)  # a block that does not run breaks the chain
    if snip.skip:
        pytest.skip(f"{snip.id}: {snip.skip}")
    if snip.needs:
        present, why = NEEDS[snip.needs]
        if not present():
            pytest.skip(f"{snip.id}: {why}")
    monkeypatch.chdir(tmp_path)
    if snip.continues:
        ns = prev
        if ns is None:
            pytest.skip(f"{snip.id}: continues a block that did not run")
    else:
        torch._dynamo.reset()
        ns = {"__name__": "__snippet__"}
    exec(compile(snip.code, snip.id, "exec"), ns)  # noqa: S102 - the docs' own code
    _namespaces[snip.page] = ns


PRINTS_REWRITES = re.compile(r"^print\((\w+)\.rewrites\)", re.M)
REWRITE_PRINTERS = [s for s in ALL if PRINTS_REWRITES.search(s.code) and not (s.skip or s.needs)]


def _chain(snip: Snippet) -> list[Snippet]:
    """The blocks that run for ``snip``: back to its page's last block that does not continue."""
    page = [s for s in ALL if s.page == snip.page]
    i = j = page.index(snip)
    while page[j].continues:
        j -= 1
    return page[j:i + 1]


def test_the_rewrite_printers_are_found():
    assert {s.page.name for s in REWRITE_PRINTERS} >= {"README.md", "policy.md"}


@pytest.mark.parametrize("snip", REWRITE_PRINTERS, ids=[s.id for s in REWRITE_PRINTERS])
def test_snippet_prints_rewrites_every_time(snip, tmp_path, monkeypatch, capsys):
    """A snippet that prints a pass's rewrites prints some on every run: run twice in one
    process (the second as a re-run of the program: dynamo reset, Inductor's FX graph cache
    kept), a cache hit would skip the pass and print ``[]``."""
    monkeypatch.chdir(tmp_path)
    name = PRINTS_REWRITES.search(snip.code).group(1)
    for run in (1, 2):
        torch._dynamo.reset()
        ns = {"__name__": "__snippet__"}
        for s in _chain(snip):
            exec(compile(s.code, s.id, "exec"), ns)  # noqa: S102 - the docs' own code
        out = capsys.readouterr().out
        assert ns[name].rewrites and "Rewrite(" in out, f"run {run} of {snip.id} printed {out!r}"


def test_ci_runs_the_readme_commands():
    """The README says CI runs exactly its set-up commands: each command of its first
    ```bash block after the install (``dsa-ops demo``, the pytest line) is a line of .ci/run."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    start = lines.index("```bash")
    block = lines[start + 1:lines.index("```", start + 1)]
    commands = [c.strip() for line in block for c in line.split("&&")]
    wanted = [c for c in commands if c.startswith(("dsa-ops", "python -m pytest"))]
    assert "dsa-ops demo" in wanted and any(c.startswith("python -m pytest") for c in wanted), commands
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert [c for c in wanted if c not in ci] == []


def test_vllm_doc_says_how_ci_runs_the_vllm_tests():
    """docs/vllm.md's commands for the vLLM tests are .ci/vllm-tests's: the `test` extra
    (the `vllm` extra brings no pytest) and pytest on tests/vllm with DSA_OPS_REQUIRE_VLLM=1."""
    doc = (ROOT / "docs" / "vllm.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "vllm-tests").read_text(encoding="utf-8")
    assert 'pip install -e ".[vllm,test]"' in doc and 'pip install -q -e ".[test]"' in ci
    run = "DSA_OPS_REQUIRE_VLLM=1 python -m pytest tests/vllm -q -rs"
    assert run in doc and run in ci
