"""Output a person reads: text fits the terminal ($COLUMNS, else 100 columns when stdout is not a
terminal), nothing the wide output shows is lost, and --wide prints every line whole."""

import json
import re
from collections import Counter

import pytest

from shardplan.cli.app import main
from shardplan.cli.layout import output_width, table, wrap

COMMANDS = [
    ("fit", "70B on 4x24GB"),                                 # all strategies, alternatives with long limits
    ("fit", "llama-3.1-8b on 8xh100-sxm"),                    # all strategies, some fit
    ("fit", "70B on 4x24GB", "--strategy", "full_shard"),      # one strategy: the 'what it is' column
    ("plan", "llama-3.1-8b", "--gpus", "8xh100-sxm"),          # 18 columns, tight plans
    ("plan", "llama-3.1-8b", "--gpus", "8xh100-sxm", "--seq-len", "8192", "--global-batch-tokens", "1M",
     "--train-tokens", "1T", "--price-per-gpu-hour", "2"),   # + time, GPU-hours, cost
    ("plan", "70B on 4x24GB"),                                 # the query form: method column, rejected methods
    ("models",),
    ("models", "show", "gpt3-175b"),                          # a 230-character source note
    ("hardware",),
]
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def run(capsys, monkeypatch, argv, columns=None):
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", str(columns))
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def widest(text):
    return max(len(line) for line in text.splitlines())


def words(text):
    """Every word a reader sees, without the punctuation wrapping or a legend adds around it."""
    return {w.strip(":;,()") for w in text.split() if w.strip("-")}


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_output_fits_the_width_and_loses_nothing(capsys, monkeypatch, argv):
    wide = run(capsys, monkeypatch, [*argv, "--wide"], columns=60)
    assert run(capsys, monkeypatch, [*argv, "--wide"]) == wide  # --wide ignores COLUMNS
    for columns in (None, 80):
        text = run(capsys, monkeypatch, argv, columns)
        assert widest(text) <= (columns or 100), columns
        # every number and every word of the wide output is still there (a number appears at least as often)
        assert not Counter(NUMBER.findall(wide)) - Counter(NUMBER.findall(text)), columns
        assert words(wide) - words(text) <= {"≈"}, columns  # plan's tight rows become ≈1, ≈2, ... when split


def test_default_width_is_100_and_wide_output_is_wider(capsys, monkeypatch):
    # on main before this change, these lines were up to 247 columns wide (alternatives) and 195 (plan)
    assert widest(run(capsys, monkeypatch, ["fit", "70B on 4x24GB", "--wide"])) > 200
    assert widest(run(capsys, monkeypatch, ["fit", "70B on 4x24GB"])) <= 100


def test_columns_is_followed(capsys, monkeypatch):
    text = run(capsys, monkeypatch, ["fit", "70B on 4x24GB"], columns=120)
    assert 100 < widest(text) <= 120  # the room is used, not only the default 100
    assert widest(run(capsys, monkeypatch, ["plan", "llama-3.1-8b", "--gpus", "8xh100-sxm"], columns=120)) <= 120


def test_alternatives_keep_every_limit_and_full_change(capsys, monkeypatch):
    results = json.loads(run(capsys, monkeypatch, ["fit", "70B on 4x24GB", "--json"]))
    best = min(results, key=lambda r: r["per_gpu"]["device_total_bytes"])
    assert best["alternatives"]
    # every change is listed in the full answer (--detail); the short one shows the closest few
    wide_lines = run(capsys, monkeypatch, ["fit", "70B on 4x24GB", "--wide", "--detail"]).splitlines()
    narrow = " ".join(run(capsys, monkeypatch, ["fit", "70B on 4x24GB", "--detail"]).split())  # wrapping undone
    for n, alt in enumerate(best["alternatives"], 1):
        limit = alt["limit"] or ("" if alt["fits"] else "within the band")
        # --wide: one row holds the change and its limit, as before this change
        assert any(alt["change"] in line and line.rstrip().endswith(limit) for line in wide_lines), alt["change"]
        # narrow: the legend gives the change in full, then its limit
        assert f"{n}. {alt['change']}" + (f": {limit}" if limit else "") in narrow


def test_plan_wide_header_is_one_line(capsys, monkeypatch):
    text = run(capsys, monkeypatch, ["plan", "llama-3.1-8b", "--gpus", "8xh100-sxm", "--wide"])
    header = re.compile(r"^#\s+method\s+strategy\s+engine\s+AC\s+offload\s+mb\s+accum\s+group\s+sync\s+reduce\s+"
                        r"tok/s/GPU \(band\)\s+tok/s\s+MFU\s+step s\s+exposed ms\s+peak GiB\s+± band GiB\s+margin GiB$")
    # the ranked table, the other methods' table and the tight one, each when there is one
    tables = 1 + ("If you would accept" in text) + ("Tight (" in text)
    assert sum(bool(header.match(line)) for line in text.splitlines()) == tables
    narrow = run(capsys, monkeypatch, ["plan", "llama-3.1-8b", "--gpus", "8xh100-sxm"])
    # split into column groups, each repeats '#' so its rows can be matched
    assert sum(line.startswith("#    ") or line.startswith("#  ") for line in narrow.splitlines()) >= 2 * tables


def test_output_width_reads_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "132")
    assert output_width() == 132
    monkeypatch.setenv("COLUMNS", "20")
    assert output_width() == 60  # narrower than 60 columns a table of GiB figures cannot be read
    for unset in ("", "abc", "0"):
        monkeypatch.setenv("COLUMNS", unset)
        assert output_width() == 100  # pytest captures stdout: not a terminal
    monkeypatch.delenv("COLUMNS")
    assert output_width() == 100


def test_table_wraps_a_text_column_then_splits():
    rows = [["a", "1.00", "word " * 30], ["b", "2.00", "short"]]
    text = table(rows, ["key", "value", "note"], 60, wrap_columns=(2,))
    assert widest(text) <= 60 and "\n\n" not in text  # wrapped inside the cell, one table
    assert " ".join(text.split()).count("word") == 30
    many = [["row"] + [f"{i}.{j}" * 3 for j in range(12)] for i in range(3)]
    split = table(many, ["key"] + [f"column{j}" for j in range(12)], 60)
    groups = split.split("\n\n")
    assert len(groups) > 1 and all(g.startswith("key") for g in groups) and widest(split) <= 60
    assert table(many, ["key"] + [f"column{j}" for j in range(12)], None).count("\n") == 4  # None: as it is


def test_wrap_keeps_words_whole():
    line = "x " * 10 + "--no-checkpoint-wrapper meta-llama/Meta-Llama-3.1-8B " + "y " * 40
    out = wrap("    " + line, 40)
    assert all(len(l) <= 40 for l in out) and out[0].startswith("    x") and out[1].startswith("      ")
    assert "--no-checkpoint-wrapper" in line and any("--no-checkpoint-wrapper" in l for l in out)
    assert wrap(line, None) == [line]
