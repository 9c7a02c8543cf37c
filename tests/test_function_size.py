"""No function outside the tests is longer than MAX_FUNCTION_LINES, counted from its ``def`` line to
its last line (signature and docstring included): a function that long does several things, and
each of them deserves a name.

Functions other people are splitting right now are allowed by name in ``BEING_SPLIT``, each with
who splits it. The list cannot rot: an entry whose function no longer exists, or is now short
enough, fails the test too (remove it)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("shardplan", "tools", "benchmarks")
MAX_FUNCTION_LINES = 60

# "file:qualified name" -> who is splitting it (issue 13, item 4); emptied once their work is merged.
BEING_SPLIT: dict[str, str] = {}


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function and method, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, prefix + node.name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, prefix + node.name + ".")
        else:
            yield from _functions(node, prefix)


def function_lengths() -> dict[str, tuple[int, int]]:
    """"file:qualified name" -> (line of its ``def``, length in lines) for every checked function."""
    out = {}
    for top in CHECKED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for name, node in _functions(ast.parse(path.read_text(), filename=rel)):
                out[f"{rel}:{name}"] = (node.lineno, node.end_lineno - node.lineno + 1)
    return out


def test_no_function_is_longer_than_the_limit():
    lengths = function_lengths()
    long = [f"{key.split(':')[0]}:{line} {key.split(':')[1]} is {n} lines"
            for key, (line, n) in sorted(lengths.items()) if n > MAX_FUNCTION_LINES and key not in BEING_SPLIT]
    assert not long, (f"functions over {MAX_FUNCTION_LINES} lines (def to last line); split them by meaning:\n  "
                      + "\n  ".join(long))


def test_the_allowlist_names_only_long_functions_that_exist():
    lengths = function_lengths()
    stale = [f"{key} ({owner}): " + ("no such function" if key not in lengths else f"now {lengths[key][1]} lines")
             for key, owner in sorted(BEING_SPLIT.items())
             if key not in lengths or lengths[key][1] <= MAX_FUNCTION_LINES]
    assert not stale, "remove these entries from BEING_SPLIT in tests/test_function_size.py:\n  " + "\n  ".join(stale)


def test_the_count_is_def_line_to_last_line(tmp_path):
    source = 'def f(a,\n      b):\n    """doc\n    string"""\n    return a\n\n\nclass C:\n    def g(self):\n        pass\n'
    found = {name: node.end_lineno - node.lineno + 1 for name, node in _functions(ast.parse(source))}
    assert found == {"f": 5, "C.g": 2}
