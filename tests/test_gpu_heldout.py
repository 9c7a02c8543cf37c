"""The held-out third of the GPU runs of the scripts users launch (issue 25;
data/calibration/gpu/userscripts/README.md): every record sits in the file the rule names, nothing
that fits a coefficient reads the held-out file, and the errors docs/accuracy.md reports are the
ones the held-out records give."""

from __future__ import annotations

import builtins
import io
import json
import re
from pathlib import Path

import pytest

from shardplan.calibrate import gpu_split
from shardplan.calibrate.gpu_heldout import compare_file, summary
from shardplan.support.quantiles import quantile

ROOT = Path(__file__).resolve().parents[1]
TRAIN = gpu_split.FOLDER / gpu_split.TRAIN_NAME
HELDOUT = gpu_split.FOLDER / gpu_split.HELDOUT_NAME
# The only code that may name the held-out file: the rule (gpu_split), the script that splits the
# raw runs into the two files, and the report that evaluates on them. None of them fits anything.
MAY_NAME_HELDOUT = {"shardplan/calibrate/gpu_split.py", "benchmarks/gpu_userscripts.py",
                    "benchmarks/gpu_heldout_report.py"}


def test_the_rule_is_a_hash_of_the_configuration():
    cfg = {"b": 1, "a": [1, 2]}
    assert gpu_split.config_digest(cfg) == gpu_split.config_digest({"a": [1, 2], "b": 1})
    held = [gpu_split.is_held_out({"i": i}) for i in range(3000)]
    assert 0.28 < sum(held) / len(held) < 0.39  # about a third, as the rule says


def test_every_record_is_in_the_file_the_rule_names():
    train, held = gpu_split.read(TRAIN), gpu_split.read(HELDOUT)
    assert train and held
    assert not any(gpu_split.is_held_out(r["config"]) for r in train)
    assert all(gpu_split.is_held_out(r["config"]) for r in held)
    keys = [gpu_split.config_digest(r["config"]) for r in train + held]
    assert len(keys) == len(set(keys))  # no configuration in both


def _code_files():
    for top in ("shardplan", "benchmarks", "tools"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix in (".py", ".json", ".sh") and "__pycache__" not in path.parts:
                yield path.relative_to(ROOT).as_posix(), path


def test_no_fit_and_no_fitted_constant_names_the_heldout_file():
    """A file that names the held-out file (or the constant that holds its name) outside the three
    allowed ones fails: fitting code and fitted-constant files (shardplan/data/*.json) included."""
    pattern = re.compile(r"heldout\.jsonl|HELDOUT_NAME")
    offenders = [rel for rel, path in _code_files() if rel not in MAY_NAME_HELDOUT and pattern.search(path.read_text())]
    assert offenders == []


@pytest.mark.parametrize("fitted", [
    lambda: json.loads((ROOT / "shardplan" / "data" / "allocator.json").read_text())["sources"]["fitted_from"],
    lambda: json.loads((gpu_split.FOLDER / "allocator_refit_train.json").read_text())["fitted_from"]])
def test_fitted_constants_say_what_they_were_fitted_from(fitted):
    """Each fitted-constant file names the files its coefficients come from; none is held out, each exists."""
    files = fitted().split()
    assert files and all((ROOT / f).is_file() for f in files)
    assert not any(Path(f).resolve() == HELDOUT.resolve() for f in files)


def test_the_allocator_fit_never_opens_the_heldout_file(monkeypatch):
    """The allocator's fit (fragmentation_loso over every source: the campaign files and the train
    split) run with every read of the held-out file trapped."""
    from shardplan.calibrate import fragmentation_loso

    opened = []
    real_open, real_read = builtins.open, Path.read_text

    def trap(path) -> None:
        if isinstance(path, (str, Path)) and Path(path).resolve() == HELDOUT.resolve():
            opened.append(path)
            raise AssertionError(f"a fit read {path}")

    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: (trap(f), real_open(f, *a, **k))[1])
    monkeypatch.setattr(io, "open", builtins.open)
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: (trap(self), real_read(self, *a, **k))[1])
    fitted = fragmentation_loso.coefficients(fragmentation_loso.sources())
    assert sum(c["runs"] for c in fitted.values()) > 0 and opened == []
    from shardplan.calibrate.fragmentation_loso import refit_fragmentation

    refit = refit_fragmentation(gpu_split.read(TRAIN))  # the train-split refit docs/accuracy.md judges
    assert refit == json.loads((gpu_split.FOLDER / "allocator_refit_train.json").read_text())[
        "fragmentation_per_transient_k"] and opened == []
    with pytest.raises(AssertionError):
        gpu_split.read(HELDOUT)  # the trap works


def test_the_reported_heldout_errors_are_the_records_errors():
    """data/calibration/gpu/userscripts/heldout_errors.json (docs/accuracy.md's table) is what the
    held-out records give today: a model change that moves them must regenerate it."""
    committed = json.loads((gpu_split.FOLDER / "heldout_errors.json").read_text())
    rows = compare_file(HELDOUT)
    got = {(s["group"], s["counter"]): s for s in summary(rows) + summary(rows, by="class")}
    for s in committed["summary"]:
        now = got[(s["group"], s["counter"])]
        assert now["runs"] == s["runs"]
        assert now["median_abs"] == pytest.approx(s["median_abs"], abs=1e-4)
        assert now["p90_abs"] == pytest.approx(s["p90_abs"], abs=1e-4)


def test_every_file_the_report_writes_is_what_the_records_give_today():
    """benchmarks/gpu_heldout_report.py's outputs, the fit-check times included (no other test reads
    those): a change to the time or memory model that moves them must rerun the report. Its time
    columns were found stale once, after time changes that no test caught."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_heldout_report as report
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from shardplan.support.atomic_write import write_generated

    files, _ = report.outputs()
    stale = write_generated(files, check=True)
    assert not stale, f"rerun python benchmarks/gpu_heldout_report.py: {stale} moved"


def test_train_runs_within_the_heldout_p90():
    """The tolerance is a held-out quantile (p90 of |error| of the allocated peak over the held-out
    third), never the observed maximum: at least 80 % of the train runs lie inside it."""
    held = [abs(r["allocated_error"]) for r in compare_file(HELDOUT)]
    tol = quantile(held, 0.9)
    train = [abs(r["allocated_error"]) for r in compare_file(TRAIN)]
    assert sum(e <= tol for e in train) >= 0.8 * len(train)


def test_a_later_session_adds_runs_and_never_erases_a_measurement(tmp_path, monkeypatch):
    """benchmarks/gpu_userscripts.py split: the committed records stay, a new configuration is added
    to the file the rule names, and a timeout of a measured configuration does not replace it; the
    unmeasured list shrinks by what was measured."""
    import shutil
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_userscripts as us
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    for path in (TRAIN, HELDOUT):
        shutil.copy(path, tmp_path / path.name)
    monkeypatch.setattr(gpu_split, "FOLDER", tmp_path)
    grid = us.user_grid(False)
    # every configuration of the grid may be measured already: one record is taken out of the copy,
    # so that its configuration is one a later session has still to measure
    train = gpu_split.read(tmp_path / TRAIN.name)
    gone = next(r for r in train if r["status"] == "ok")
    (tmp_path / TRAIN.name).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in train if r is not gone))
    before = gpu_split.read(tmp_path / TRAIN.name) + gpu_split.read(tmp_path / HELDOUT.name)
    todo = us.unmeasured(grid)
    assert len(todo) == len(grid) - len({gpu_split.config_digest(r["config"]) for r in before if r["status"] == "ok"})
    measured = next(r for r in before if r["status"] == "ok")
    seen = {gpu_split.config_digest(r["config"]) for r in before}
    new = next(i for i in todo if gpu_split.config_digest(grid[i]) not in seen)  # no record at all yet
    assert gpu_split.config_digest(grid[new]) == gpu_split.config_digest(gone["config"])
    raw = tmp_path / "raw.jsonl"
    raw.write_text(json.dumps({"config": grid[new], "status": "ok", "max_allocated_bytes": 1}) + "\n"
                   + json.dumps({"config": measured["config"], "status": "timeout"}) + "\n")
    n_train, n_held = us.split_raw(raw)
    after = gpu_split.read(tmp_path / TRAIN.name) + gpu_split.read(tmp_path / HELDOUT.name)
    assert n_train + n_held == len(after) == len(before) + 1
    assert measured in after
    assert us.unmeasured(grid) == [i for i in todo if i != new]
