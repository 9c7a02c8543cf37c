"""docs/architecture.md is the map of the package: every module under shardplan/ has its line in
"The tree", and every path the page names exists. When a module is added, moved or removed, the
failure says which lines to add or remove."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "shardplan"
DOC = ROOT / "docs" / "architecture.md"
SUBPACKAGES = tuple(sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()))
# a path the page names: from the repository root, or inside the package without "shardplan/"
PATH = re.compile(r"(?<![\w/.-])((?:shardplan|tools|tests|docs|benchmarks|" + "|".join(SUBPACKAGES)
                  + r")/[\w./-]*[\w/])")


def package_entries() -> list[str]:
    """What the tree must list: every module (a subpackage's ``__init__.py`` is its heading, the
    folder itself), every subpackage, and every entry directly under shardplan/data/."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(ROOT).as_posix()
        out.append(rel.removesuffix("__init__.py") if path.name == "__init__.py" and path.parent != PACKAGE else rel)
    out += [p.relative_to(ROOT).as_posix() + ("/" if p.is_dir() else "") for p in sorted((PACKAGE / "data").iterdir())
            if p.name != "__pycache__"]
    return out


def named_paths(text: str) -> list[tuple[int, str, str]]:
    """(line number, the path as written, the path from the repository root) for every path named."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        for written in PATH.findall(line):
            top = written.split("/", 1)[0]
            out.append((number, written, ("shardplan/" + written) if top in SUBPACKAGES else written))
    return out


def _job(entry: str) -> str:
    """The first line of a module's docstring: a starting point for its line in the tree."""
    path = ROOT / entry / "__init__.py" if entry.endswith("/") else ROOT / entry
    if path.suffix != ".py" or not path.is_file():
        return "<its job>"
    doc = ast.get_docstring(ast.parse(path.read_text())) or "<its job>"
    return doc.splitlines()[0]


def test_every_module_has_its_line_in_the_tree():
    text = DOC.read_text()
    listed = {m.group(1) for m in re.finditer(r"^(?:- )?`(shardplan/[^`]*)`", text, re.MULTILINE)}
    missing = [e for e in package_entries() if e not in listed]
    assert not missing, ("add these lines to docs/architecture.md, 'The tree', under their package "
                         "(one line each: what the module is for):\n"
                         + "\n".join(f"- `{e}` — {_job(e)}" for e in missing))


def test_every_path_the_page_names_exists():
    text = DOC.read_text()
    lines = text.splitlines()
    stale = [(n, written) for n, written, rel in named_paths(text)
             if not ((ROOT / rel).is_dir() if rel.endswith("/") else (ROOT / rel).exists())]
    assert not stale, ("docs/architecture.md names paths that do not exist; remove or correct these lines:\n"
                       + "\n".join(f"{n}: {lines[n - 1].strip()}  (`{w}`)" for n, w in stale))


def test_path_matching():
    found = [(w, rel) for _, w, rel in named_paths("see `inputs/config.py` and tools/x.py, docs/a.md; not a/b.py")]
    assert found == [("inputs/config.py", "shardplan/inputs/config.py"), ("tools/x.py", "tools/x.py"),
                     ("docs/a.md", "docs/a.md")]


def test_readme_links_the_architecture_page():
    assert "docs/architecture.md" in (ROOT / "README.md").read_text()
