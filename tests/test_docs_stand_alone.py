"""A clone holds everything its docs point at (issue #24 item 9): no citation of a file
outside the repository, every ``contract §N`` names a section of docs/contract.md, and
every path the user docs name exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = ROOT / "docs" / "contract.md"
USER_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SOURCES = USER_DOCS + sorted(p for d in ("dsa_ops", "passes", "tests") for p in (ROOT / d).rglob("*.py"))


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def test_nothing_cites_files_outside_the_repository():
    outside = re.compile(r"shared/docs/|/work/")
    hits = [f"{_rel(p)}:{i}" for p in SOURCES if p != Path(__file__).resolve() for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if outside.search(line)]
    assert hits == []


def _contract_sections() -> tuple[set[str], set[int]]:
    """Section numbers of docs/contract.md ("1", "1.1", "2.3a", ...) and the items of §8's list."""
    text = CONTRACT.read_text(encoding="utf-8")
    sections = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?[a-z]?)\.? ", text, flags=re.M))
    known = text.split("\n## 8.", 1)
    items = {int(n) for n in re.findall(r"^(\d+)\. ", known[1], flags=re.M)} if len(known) == 2 else set()
    return sections, items


def _citations() -> list[tuple[str, str]]:
    """(where, citation) for each § cited as the contract's: the text after "contract" up to
    the next ')' or ';' (so "contract §2.3; schemas: notes §5" gives §2.3 only)."""
    out = []
    for p in SOURCES:
        if p == CONTRACT:
            continue
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            for m in re.finditer(r"contract((?:[^);§]|§)*)", line, flags=re.I):
                for ref in re.findall(r"§\s*(\d+(?:\.\d+)?[a-z]?(?: items? \d+(?:-\d+)?)?)", m.group(1)):
                    out.append((f"{_rel(p)}:{i}", ref))
    return out


def test_contract_citations_name_real_sections():
    sections, items = _contract_sections()
    assert {"1.1", "1.2", "2.1", "2.2", "2.3", "2.3a", "3.2", "5", "8"} <= sections, sorted(sections)
    assert items == set(range(1, len(items) + 1)) and len(items) >= 10
    cites = _citations()
    assert len(cites) >= 20  # the code cites the contract throughout
    bad = []
    for where, ref in cites:
        sec, _, rest = ref.partition(" ")
        if sec not in sections:
            bad.append(f"{where}: §{ref}")
        for lo, hi in re.findall(r"(\d+)(?:-(\d+))?", rest):
            if any(n not in items for n in range(int(lo), int(hi or lo) + 1)):
                bad.append(f"{where}: §{ref}")
    assert bad == []


@pytest.mark.parametrize("page", USER_DOCS, ids=_rel)
def test_paths_named_in_the_user_docs_exist(page):
    """Repository paths in backticks (`docs/...`, `dsa_ops/...`, `tests/...`, `.ci/...`)."""
    text = page.read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:docs|dsa_ops|passes|tests|\.ci)/[\w./-]+)`", text))
    missing = sorted(n for n in named if not (ROOT / n).exists() and not (page.parent / n).exists())
    assert missing == []


ISSUE_REF = re.compile(r"\bissues?[- ]?#?\d+|\bthe issue'?s?\b", re.I)


def test_user_docs_name_no_issue_numbers():
    """The tracker is not in the clone: the docs say what a target or a change is instead of
    citing an issue by number ("issue 23's targets", "the issue's harness")."""
    hits = [f"{_rel(p)}:{i}: {line.strip()[:80]}" for p in USER_DOCS
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if ISSUE_REF.search(line)]
    assert hits == []


def test_the_policy_json_example_loads_and_names_no_faulting_backend():
    """docs/policy.md's JSON example is a policy dsa_ops.policy.from_dict accepts, and it routes to
    no backend with a known fault (no policy can pick one: Backend.faults)."""
    import json

    import dsa_ops
    from dsa_ops import policy as P

    text = (ROOT / "docs" / "policy.md").read_text(encoding="utf-8").split("## JSON format", 1)[1]
    pol = P.from_dict(json.loads(text.split("```json", 1)[1].split("```", 1)[0]))
    assert not [n for n in pol.backends_named() if dsa_ops.backends.get(n).faults]
