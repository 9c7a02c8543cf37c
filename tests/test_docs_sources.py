"""What the code and the docs cite is something a user can open: a paper, a repository path, or a
page under docs/. The project's internal design notes are not shipped, so nothing may cite them;
and the strategy-to-framework table in docs/vocabulary.md, which the code cites instead, is the one
each engine's declaration holds (``inputs.engine_lookup.framework_name``)."""

from __future__ import annotations

import re
from pathlib import Path

from shardplan.inputs import strategy as st
from shardplan.inputs.engine_lookup import framework_name

ROOT = Path(__file__).resolve().parent.parent
SEARCHED = ("shardplan", "docs", "tools", "benchmarks", "tests", "notebooks", "data", "hardware_profiles", "model_profiles",
            ".ci", "README.md", "pyproject.toml")
TEXT_SUFFIXES = {".py", ".md", ".json", ".toml", ".txt", ".ipynb", ".yaml", ".yml", ".cfg", ".csv", ".rst"}
# the internal notes' file name, or their "§" section references without it
INTERNAL_NOTES = re.compile(r"DESIGN(\.md|\s*§)")


def _text_files():
    for top in SEARCHED:
        path = ROOT / top
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for f in files:
            if f.suffix in TEXT_SUFFIXES and "__pycache__" not in f.parts:
                yield f


def test_nothing_cites_the_internal_design_notes():
    hits = []
    for f in _text_files():
        for number, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            if INTERNAL_NOTES.search(line):
                hits.append(f"{f.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not hits, ("cite the primary source (paper + section, repo + path) or a docs/ page instead:\n  "
                      + "\n  ".join(hits))


def test_the_pattern_finds_both_spellings():
    notes = "DESIGN"
    assert INTERNAL_NOTES.search(f"see {notes}.md §2") and INTERNAL_NOTES.search(f"{notes} §4 (α-β)")
    assert not INTERNAL_NOTES.search("docs/architecture.md, principle 2")


def framework_table() -> str:
    """The table docs/vocabulary.md must hold between its ``frameworks`` markers."""
    rows = ["| strategy | " + " | ".join(f"`{e}`" for e in st.ENGINES) + " |", "|" + " --- |" * (len(st.ENGINES) + 1)]
    for s in st.STRATEGIES:
        names = [framework_name(s, e) for e in st.ENGINES]
        rows.append(f"| `{s}` | " + " | ".join(f"`{n}`" if n else "—" for n in names) + " |")
    return "\n".join(rows) + "\n"


def test_docs_framework_table_is_the_engine_declarations():
    text = (ROOT / "docs" / "vocabulary.md").read_text()
    block = text.split("<!-- frameworks:begin -->\n", 1)[1].split("<!-- frameworks:end -->", 1)[0]
    expected = framework_table()
    assert block == expected, ("docs/vocabulary.md 'Strategies in each framework': put this table between "
                               "the frameworks markers (from each engine's declaration, inputs.engine_lookup.framework_name):\n" + expected)
