"""Fitting text output to the reader's terminal: the width, wrapped prose, and tables that wrap a
text column or split into column groups rather than run off the screen.

``width=None`` everywhere means ``--wide``: every line as it is, unwrapped. With a width, what
already fits is printed exactly as ``--wide`` prints it; only what is too wide changes, and never
by dropping a value: a text column wraps, a table with too many columns is printed as several
tables that each repeat the key column(s)."""

from __future__ import annotations

import os
import sys
import textwrap

from tabulate import tabulate

DEFAULT_WIDTH = 100  # when stdout is not a terminal and COLUMNS is not set (pipes, files, CI logs)
MIN_WIDTH = 60       # narrower than this a table of GiB figures cannot be read anyway
MIN_WRAPPED_COLUMN = 12
CONTINUATION_INDENT = "  "  # a wrapped prose line's continuation, relative to the line's own indent


class Table(str):
    """A rendered table (or text already laid out): :func:`join` prints it as it is."""


def output_width() -> int:
    """The columns to fit: ``$COLUMNS`` when set to a positive integer, else the terminal's width
    when stdout is a terminal, else 100. Never below 60. (Like ``shutil.get_terminal_size``, but
    asks the stdout shardplan writes to, not the interpreter's original one.)"""
    text = os.environ.get("COLUMNS", "")
    if text.strip().isdigit() and int(text) > 0:
        return max(MIN_WIDTH, int(text))
    try:
        if sys.stdout.isatty():
            return max(MIN_WIDTH, os.get_terminal_size(sys.stdout.fileno()).columns)
    except (AttributeError, OSError, ValueError):  # no fileno (captured), closed, or not a terminal after all
        pass
    return DEFAULT_WIDTH


def text_width(text: str) -> int:
    """The widest line of ``text`` in characters."""
    return max((len(line) for line in text.splitlines()), default=0)


def wrap(line: str, width: int | None, hang: int | None = None) -> list[str]:
    """One prose line as lines of at most ``width`` characters; continuations indented ``hang``
    spaces (default: two more than the line). Words are never broken (a flag like
    ``--no-checkpoint-wrapper`` or a name like ``llama-3.1-8b`` stays whole, so a single word
    longer than the width stays too)."""
    if width is None or len(line) <= width:
        return [line]
    indent = line[:len(line) - len(line.lstrip(" "))]
    continuation = " " * hang if hang is not None else indent + CONTINUATION_INDENT
    return textwrap.wrap(line.lstrip(" "), width=width, initial_indent=indent, subsequent_indent=continuation,
                         break_long_words=False, break_on_hyphens=False) or [line]


def join(lines: list[str], width: int | None) -> str:
    """Lines of a report as text: prose wrapped to ``width``, :class:`Table` blocks as they are."""
    out: list[str] = []
    for line in lines:
        out += [line] if isinstance(line, Table) else wrap(line, width)
    return "\n".join(out)


def _render(rows: list[list], headers: list[str], numparse: bool = False) -> str:
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=not numparse)


def _fold(cell, limit: int | None):
    """A text cell on lines of at most ``limit`` characters, words kept whole (tabulate's own
    ``maxcolwidths`` would cut 'meta-llama/Meta-Llama-3.1-8B' in two)."""
    if limit is None or len(str(cell)) <= limit:
        return cell
    return "\n".join(textwrap.wrap(str(cell), limit, break_long_words=False, break_on_hyphens=False))


def _wrapped(rows, headers, width: int, wrap_columns: tuple[int, ...], numparse: bool = False) -> str | None:
    """The table with its ``wrap_columns`` narrowed so that it fits ``width``; None when even
    ``MIN_WRAPPED_COLUMN`` characters each do not fit."""
    if not wrap_columns or not rows:
        return None
    kept = [i for i in range(len(headers)) if i not in wrap_columns]
    fixed = text_width(_render([[r[i] for i in kept] for r in rows], [headers[i] for i in kept], numparse=numparse)
                       ) if kept else -2
    room = width - fixed - 2 * len(wrap_columns)  # two spaces between columns
    natural = [max(text_width(str(headers[i])), *(text_width(str(r[i])) for r in rows)) for i in wrap_columns]
    if room < MIN_WRAPPED_COLUMN * len(wrap_columns):
        return None
    # water-filling: narrow columns keep their natural width, the rest share what is left equally
    limits: dict[int, int] = {}
    left = room
    by_width = sorted(zip(wrap_columns, natural), key=lambda cw: cw[1])
    for n, (i, w) in enumerate(by_width):
        limits[i] = min(w, left // (len(by_width) - n))
        left -= limits[i]
    while True:  # a header is padded by two: narrow the widest column by what is still over
        text = _render([[_fold(c, limits.get(i)) for i, c in enumerate(r)] for r in rows],
                       [_fold(h, limits.get(i)) for i, h in enumerate(headers)], numparse=numparse)
        over = text_width(text) - width
        widest = max(limits, key=limits.get)
        if over <= 0 or limits[widest] - over < MIN_WRAPPED_COLUMN:
            return text if over <= 0 else None
        limits[widest] -= over


def fits(rows: list[list], headers: list[str], width: int | None, numparse: bool = False) -> bool:
    """Whether the table, as it is, fits ``width`` (always, with no width)."""
    return width is None or text_width(_render(rows, headers, numparse=numparse)) <= width


def _compact(rows: list[list], headers: list[str]) -> list[str]:
    """Headers wider than every value of their column, wrapped onto (at most) two lines."""
    out = []
    for i, header in enumerate(headers):
        header = str(header)
        widest = max((len(str(r[i])) for r in rows), default=0)
        w = max(widest, *(len(word) for word in header.split() or [""]))
        while len(header) > widest and len(textwrap.wrap(header, w, break_long_words=False)) > 2:
            w += 1
        out.append("\n".join(textwrap.wrap(header, w, break_long_words=False)) if len(header) > widest else header)
    return out


def table(rows: list[list], headers: list[str], width: int | None, wrap_columns: tuple[int, ...] = (),
          key_columns: int = 1, numparse: bool = False) -> Table:
    """A ``tabulate`` 'simple' table that fits ``width`` columns.

    In order: as it is (when it fits, or ``width`` is None); with headers wider than their values
    on two lines; also with the text columns ``wrap_columns`` wrapped inside their cells; else as
    several tables one under another, each repeating the first ``key_columns`` columns (the row's
    name) and taking as many of the other columns as fit (a group that is still too wide wraps its
    text columns, if it has any).
    ``numparse``: right-align numbers (tabulate's default); off, every cell is text as given."""
    text = _render(rows, headers, numparse=numparse)
    if width is None or text_width(text) <= width:
        return Table(text)
    headers = _compact(rows, headers)
    text = _render(rows, headers, numparse=numparse)
    if text_width(text) <= width:
        return Table(text)
    wrapped = _wrapped(rows, headers, width, wrap_columns, numparse)
    if wrapped is not None:
        return Table(wrapped)
    keys = list(range(key_columns))
    groups: list[list[int]] = []
    rendered: dict[tuple[int, ...], str] = {}  # columns -> their table: a group's last trial is its table
    for i in range(key_columns, len(headers)):
        trial = keys + (groups[-1] if groups else []) + [i]
        trial_text = _render([[r[j] for j in trial] for r in rows], [headers[j] for j in trial], numparse=numparse)
        rendered[tuple(trial)] = trial_text
        if groups and text_width(trial_text) <= width:
            groups[-1].append(i)
        else:
            groups.append([i])
    parts = []
    for group in groups:
        cols = keys + group
        sub_rows = [[r[j] for j in cols] for r in rows]
        sub_headers = [headers[j] for j in cols]
        sub_wrap = tuple(cols.index(j) for j in wrap_columns if j in cols)
        sub = rendered.get(tuple(cols)) or _render(sub_rows, sub_headers, numparse=numparse)
        if text_width(sub) > width:
            sub = _wrapped(sub_rows, sub_headers, width, sub_wrap, numparse) or sub
        parts.append(sub)
    return Table("\n\n".join(parts))
