"""Predicted vs measured on the held-out third of the GPU runs of the scripts users launch (issue 25).

    python benchmarks/gpu_heldout_report.py          # rewrites the files below and docs/accuracy.md's section

Writes, in data/calibration/gpu/userscripts/:
  heldout_errors.json  the summary per counter and per class (tests/test_gpu_heldout.py checks it)
  heldout_errors.csv   one row per held-out run: configuration, measured / predicted bytes, error per
                       counter, for the band classes (memtruth's out-of-source band derivation)
  train_errors.csv     the same for the train split (what any fit may look at)
and the table between the ``gpu-heldout`` markers of docs/accuracy.md. Evaluates only: fits nothing.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shardplan.calibrate import gpu_split  # noqa: E402
from shardplan.calibrate.gpu_heldout import COUNTERS, compare_file, summary  # noqa: E402
from shardplan.support.atomic_write import write_text_atomic  # noqa: E402

DOC = ROOT / "docs" / "accuracy.md"
BEGIN, END = "<!-- gpu-heldout:begin -->", "<!-- gpu-heldout:end -->"
COMMAND = "python benchmarks/gpu_heldout_report.py"
OVERLAY = gpu_split.FOLDER / "calibrate" / "calibration.json"


def fit_cli(rec: dict, calibration: bool) -> dict:
    """``shardplan fit`` (the CLI, as a user runs it) for one run's configuration, with or without the
    overlay ``calibrate compute`` wrote on the same GPU."""
    from shardplan.calibrate.gpu_heldout import user_training_config

    cfg, tc = rec["config"], user_training_config(rec["config"])
    w = cfg["world_size"]
    args = [sys.executable, "-m", "shardplan", "fit", "--model", cfg["model"].lower(), "--gpus", f"{w}xh100",
            "--strategy", tc.strategy, "--engine", tc.engine, "--ac", tc.ac, "--method", tc.method,
            "--micro-batch", str(tc.micro_batch), "--seq-len", str(tc.seq_len), "--stack", tc.stack,
            "--precision", tc.precision, "--global-batch-tokens", str(w * tc.micro_batch * tc.seq_len), "--json",
            "--checkpoint-wrapper" if tc.checkpoint_wrapper else "--no-checkpoint-wrapper"]
    args += ["--reduce-dtype", tc.reduce_dtype] if tc.reduce_dtype else []
    args += ["--calibration", str(OVERLAY)] if calibration else []
    out = subprocess.run(args, capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}).stdout
    return json.loads(out)


def fit_checks(held_records: list[dict]) -> list[dict]:
    """``fit`` with and without the overlay against each held-out run: the allocated peak and the
    step's compute + optimizer time (the fake process group sends nothing, so no comm time) beside
    the measured median step time after the first step."""
    rows = []
    for rec in held_records:
        if rec.get("status") != "ok":
            continue
        step = statistics.median(rec["step_times_s"][1:])
        row = {"model": rec["config"]["model"], "fsdp": rec["config"].get("fsdp"), "ac": rec["config"]["ac"],
               "use_cache": rec["config"]["use_cache"],
               "measured_allocated_bytes": rec["max_allocated_bytes"], "measured_step_s": step}
        for tag, cal in (("builtin", False), ("overlay", True)):
            d = fit_cli(rec, cal)
            row[f"{tag}_allocated_error"] = d["per_gpu"]["peak_allocated_bytes"] / rec["max_allocated_bytes"] - 1
            row[f"{tag}_compute_s"] = d["time"]["compute_s"] + d["time"]["optimizer_s"]
            row[f"{tag}_time_error"] = row[f"{tag}_compute_s"] / step - 1
        rows.append(row)
    return rows


def fit_table(rows: list[dict]) -> list[str]:
    lines = ["| run | measured step | fit (built-in H100) | fit --calibration (this GPU's overlay) | allocated error (both) |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['model']} fsdp{r['fsdp']} ac={r['ac']} use_cache={r['use_cache']} | {r['measured_step_s']:.3f} s | "
                     f"{r['builtin_compute_s']:.3f} s ({pct(r['builtin_time_error'])}) | "
                     f"{r['overlay_compute_s']:.3f} s ({pct(r['overlay_time_error'])}) | "
                     f"{pct(r['builtin_allocated_error'])} / {pct(r['overlay_allocated_error'])} |")
    return lines


def rows_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return out.getvalue()


def pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


def table(stats: list[dict], first: str) -> list[str]:
    lines = [f"| {first} | counter | runs | signed median | median \\|error\\| | p90 \\|error\\| | worst |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for s in stats:
        lines.append(f"| {s['group']} | {s['counter']} | {s['runs']} | {pct(s['signed_median'])} | "
                     f"{abs(s['median_abs']) * 100:.1f} % | {s['p90_abs'] * 100:.1f} % | {pct(s['worst'])} |")
    return lines


def section(held: list[dict], train: list[dict], fits: list[dict]) -> str:
    overall, by_class = summary(held), summary(held, by="class")
    tr = summary(train)
    return "\n".join([
        BEGIN, "", f"Regenerate: `{COMMAND}` (reads only data/calibration/gpu/userscripts/; fits nothing).", "",
        f"Held-out third: {len(held)} runs (train split: {len(train)}). error = (predicted − measured) / measured.",
        "", "**Held out, all runs, per counter**", "", *table(overall, "split"), "",
        "**Held out, per class (stack × method × engine)**", "", *table(by_class, "class"), "",
        "**Train split, per counter (for comparison; not out of sample)**", "", *table(tr, "split"), "",
        "**`shardplan fit --calibration` on the overlay `calibrate compute` wrote on the same H100, against "
        "the held-out runs** (time: compute + optimizer, since the fake process group sends nothing; the "
        "measured step is the median after the first, Trainer's host work included)", "", *fit_table(fits), "",
        END])


def main() -> int:
    held = compare_file(gpu_split.FOLDER / gpu_split.HELDOUT_NAME)
    fits = fit_checks(gpu_split.read(gpu_split.FOLDER / gpu_split.HELDOUT_NAME))
    train = compare_file(gpu_split.FOLDER / gpu_split.TRAIN_NAME)
    stats = summary(held) + summary(held, by="class")
    write_text_atomic(gpu_split.FOLDER / "heldout_errors.json",
                      json.dumps({"command": COMMAND, "counters": list(COUNTERS), "summary": stats}, indent=1) + "\n")
    write_text_atomic(gpu_split.FOLDER / "heldout_errors.csv", rows_csv(held))
    write_text_atomic(gpu_split.FOLDER / "train_errors.csv", rows_csv(train))
    doc = DOC.read_text()
    write_text_atomic(gpu_split.FOLDER / "heldout_fit_check.csv", rows_csv(fits))
    new = section(held, train, fits)
    if BEGIN in doc:
        doc = doc[:doc.index(BEGIN)] + new + doc[doc.index(END) + len(END):]
    else:
        doc = doc.rstrip("\n") + "\n\n## GPU runs of the scripts users launch: held-out third (issue 25)\n\n" + new + "\n"
    write_text_atomic(DOC, doc)
    print("\n".join(table(stats, "group")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
