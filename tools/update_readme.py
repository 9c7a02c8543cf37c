"""The README tells the truth by construction: its example outputs are real outputs.

An HTML comment (invisible on GitHub) before a fenced block says what the block is:

    <!-- readme-test: shardplan fit "70B on 4x24GB" -->    the block is that command's stdout
    <!-- readme-test: each line -->                          every `shardplan ...` line of the block exits 0

and every ```python block is a program that runs on its own. In an output block a line that is
exactly ``...`` stands for any number of omitted lines; every other line must equal the real
output's line (trailing spaces aside), widths included: commands run with ``COLUMNS=100`` in an
empty folder, with this checkout's shardplan.

``tests/test_readme.py`` checks all of it. ``python tools/update_readme.py`` reruns the output
blocks' commands and writes their real lines into README.md (keeping each block's ``...``: the
lines before the first ``...`` are the output's first lines; a part between two ``...`` runs from a
line like its first to the next line like its last, and the part after the last ``...`` from a line
like its first to the end, "like" meaning equal but for digits);
``--check`` only reports which blocks differ (exit 1).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MARKER = re.compile(r"^<!--\s*readme-test:\s*(?P<what>.*?)\s*-->\s*$")
FENCE = re.compile(r"^```(?P<info>\S*)\s*$")
ELIDED = "..."
COLUMNS = 100  # README examples are shown as a 100-column terminal prints them
EACH_LINE = "each line"


@dataclass(frozen=True)
class Block:
    info: str           # the fence's language: python, bash, text, ...
    marker: str | None  # what the readme-test comment says, if one precedes the block
    first: int          # index of the first line inside the fence (0-based, in README's lines)
    lines: tuple[str, ...]

    @property
    def line_number(self) -> int:  # 1-based, of the opening fence
        return self.first


def blocks(text: str) -> list[Block]:
    """Every fenced block, with the readme-test marker that precedes it (blank lines between allowed)."""
    lines = text.splitlines()
    out, i, marker = [], 0, None
    while i < len(lines):
        m, fence = MARKER.match(lines[i]), FENCE.match(lines[i])
        if m:
            marker = m["what"]
        elif fence:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
            if end is None:
                raise ValueError(f"README.md:{i + 1}: a ``` block that is never closed")
            out.append(Block(fence["info"], marker, i + 1, tuple(lines[i + 1:end])))
            marker, i = None, end
        elif lines[i].strip():
            marker = None  # a marker applies to the block right after it only
        i += 1
    return out


def command_argv(command: str) -> list[str]:
    """``shardplan ARGS`` as this interpreter running this checkout's shardplan."""
    words = shlex.split(command, comments=True)
    if not words or words[0] != "shardplan":
        raise ValueError(f"a readme-test command starts with 'shardplan': {command!r}")
    return [sys.executable, "-m", "shardplan", *words[1:]]


def environment() -> dict[str, str]:
    env = {**os.environ, "COLUMNS": str(COLUMNS), "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONSTARTUP", None)
    return env


def run_command(command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command_argv(command), cwd=cwd, env=environment(), capture_output=True, text=True,
                          timeout=300)


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=environment(), capture_output=True, text=True,
                          timeout=300)


def _segments(expected: list[str]) -> list[list[str]]:
    segments: list[list[str]] = [[]]
    for line in expected:
        if line.strip() == ELIDED:
            segments.append([])
        else:
            segments[-1].append(line.rstrip())
    return segments


def mismatch(expected: list[str], actual: list[str]) -> str | None:
    """None when ``actual`` (the output's lines) shows every line of ``expected`` where it says, or
    the first difference in words."""
    actual = [line.rstrip() for line in actual]
    segments = _segments(expected)
    if len(segments) == 1:
        if segments[0] == actual:
            return None
        n = next((k for k, (e, a) in enumerate(zip(segments[0], actual)) if e != a), min(len(segments[0]), len(actual)))
        return _difference(n, segments[0], actual)
    head, *middle, tail = segments
    if actual[:len(head)] != head:
        n = next(k for k, (e, a) in enumerate(zip(head + [None], actual + [None])) if e != a)
        return _difference(n, head, actual)
    cursor = len(head)
    for part in middle:
        found = next((k for k in range(cursor, len(actual) - len(part) + 1) if actual[k:k + len(part)] == part), None)
        if part and found is None:
            return f"these lines are not in the output (in this order): {part[0]!r} ..."
        cursor = found + len(part) if part else cursor
    if tail and (len(actual) - len(tail) < cursor or actual[len(actual) - len(tail):] != tail):
        return f"the output does not end with the block's last {len(tail)} line(s), from {tail[0]!r}"
    return None


def _difference(n: int, expected: list[str], actual: list[str]) -> str:
    want = expected[n] if n < len(expected) else "(end of block)"
    got = actual[n] if n < len(actual) else "(end of output)"
    return f"line {n + 1}: the README shows {want!r}, the output is {got!r}"


def _shape(line: str) -> str:
    return re.sub(r"\d[\d,.]*", "0", line.rstrip())


def regenerate(expected: list[str], actual: list[str]) -> list[str]:
    """The block's lines rewritten from ``actual``, keeping where it elides (see the module doc)."""
    actual = [line.rstrip() for line in actual]
    segments = _segments(expected)
    if len(segments) == 1:
        return actual
    head, *middle, tail = segments
    out = actual[:len(head)]
    cursor = len(head)
    for part in middle:
        out.append(ELIDED)
        if part:
            start = _find(actual, part[0], cursor)
            end = _find(actual, part[-1], start + len(part) - 1, required=False)
            end = end if end is not None else start + len(part) - 1
            out += actual[start:end + 1]
            cursor = end + 1
    out.append(ELIDED)
    return out + (actual[_find(actual, tail[0], cursor):] if tail else [])


def _find(actual: list[str], line: str, start: int, required: bool = True) -> int | None:
    """Where a line like ``line`` (digits aside) is in ``actual``, from ``start`` on."""
    found = next((k for k in range(max(start, 0), len(actual)) if _shape(actual[k]) == _shape(line)), None)
    if found is None and required:
        raise ValueError(f"cannot find a line like {line!r} in the new output: edit README.md by hand")
    return found


def output_blocks(text: str) -> list[Block]:
    return [b for b in blocks(text) if b.marker and b.marker != EACH_LINE]


def update(text: str, cwd: Path) -> tuple[str, list[str]]:
    """README text with every output block rewritten from its command; and what changed."""
    lines = text.splitlines()
    changed = []
    for block in reversed(output_blocks(text)):  # from the end, so earlier line numbers stay valid
        proc = run_command(block.marker, cwd)
        new = regenerate(list(block.lines), proc.stdout.splitlines())
        if new != list(block.lines):
            changed.append(f"README.md:{block.line_number}: {block.marker}")
            lines[block.first:block.first + len(block.lines)] = new
    return "\n".join(lines) + "\n", changed[::-1]


def write_keeping_mode(path: Path, text: str) -> None:
    """Atomically (temp file + rename), with the file's permissions as they were."""
    mode = path.stat().st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    check = "--check" in argv
    text = README.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            new, changed = update(text, Path(tmp))
        except ValueError as err:
            print(f"update_readme: {err}", file=sys.stderr)
            return 2
    for what in changed:
        print(("differs: " if check else "updated: ") + what)
    if not check and changed:
        write_keeping_mode(README, new)
    return 1 if check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
