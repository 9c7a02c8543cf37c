"""Predicted vs measured on the held-out third of the GPU runs of the scripts users launch (issue 25).

    python benchmarks/gpu_heldout_report.py          # rewrites the files below and docs/accuracy.md's section
    python benchmarks/gpu_heldout_report.py --check  # exit 1 when any of them is stale (tests/test_gpu_heldout.py)

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
from shardplan.support.atomic_write import write_generated  # noqa: E402

DOC = ROOT / "docs" / "accuracy.md"
BEGIN, END = "<!-- gpu-heldout:begin -->", "<!-- gpu-heldout:end -->"
COMMAND = "python benchmarks/gpu_heldout_report.py"
OVERLAY = gpu_split.FOLDER / "calibrate" / "calibration.json"


RUN_COLUMNS = ("row_id", "row_type", "source", "source_locator", "source_commit_or_url", "model", "params_b", "n_layers",
               "hidden", "n_heads", "n_kv_heads", "ffn", "vocab", "arch_source", "framework", "strategy", "dp_shard",
               "dp_replicate", "tp", "pp", "cp", "offload", "precision", "act_ckpt", "compile", "optimizer", "gpu",
               "n_gpus", "n_nodes", "gpus_per_node", "interconnect", "seq_len", "micro_batch", "grad_accum",
               "global_batch", "global_batch_tokens", "measured_mem_gib", "mem_counter",
               "measured_tokens_per_s_per_gpu", "throughput_basis", "confidence", "notes")
COUNTER_TEXT = (("max_allocated_bytes", "max_memory_allocated (torch.cuda, max over the steps after the first)"),
                ("max_reserved_bytes", "max_memory_reserved (torch.cuda, max over the steps after the first)"),
                ("device", "nvidia-smi / NVML used after the steps - NVML used before the process"))


def published_dims(name: str) -> dict:
    """The architecture columns of the published-runs format, from the model's profile."""
    from shardplan.calibrate.gpu_compare import campaign_spec

    m = campaign_spec(name)
    return {"params_b": round(m.total_params / 1e9, 3), "n_layers": m.num_layers, "hidden": m.hidden_size,
            "n_heads": m.num_heads, "n_kv_heads": m.num_kv_heads, "ffn": m.intermediate_size, "vocab": m.vocab_size}


def run_rows(records: list[dict], prefix: str, split_name: str) -> list[dict]:
    """The runs as rows of the published-runs format (tests/data/published_runs/README.md), one per
    counter, so that ``shardplan accuracy`` and the band derivation read them as one more source
    (``prefix``: GPUH = the held-out third, GPUT = the train split)."""
    rows = []
    for rec in (r for r in records if r.get("status") == "ok"):
        cfg, env = rec["config"], rec["env"]
        w, mb, s = cfg["world_size"], cfg["micro_batch"], cfg["seq_len"]
        engine = "FSDP2 fully_shard" if cfg.get("fsdp") == 2 or cfg["script"] == "titan" else "FSDP1"
        ac = {"fsdp": "full (accelerate fsdp_config activation_checkpointing)", "hf": "full (HF gradient_checkpointing)",
              "full": "full (checkpoint_wrapper)", "kbit": "full (prepare_model_for_kbit_training)"}.get(cfg["ac"], "none")
        step = statistics.median(rec["step_times_s"][1:])
        for key, counter in COUNTER_TEXT:
            value = rec["nvml_used_after_steps"] - rec["nvml_before"] if key == "device" else rec[key]
            rows.append({
                "row_id": f"{prefix}{len(rows) + 1:03d}", "row_type": "measured_run",
                "source": f"shardplan issue 25: H100 runs of the scripts users launch ({split_name})",
                "source_locator": f"data/calibration/gpu/userscripts/ config sha256 {gpu_split.config_digest(cfg)[:12]}",
                "source_commit_or_url": f"torch {env['torch']}, transformers {env['transformers']}, accelerate {env['accelerate']}",
                "model": cfg["model"], **published_dims(cfg["model"]), "arch_source": "HF hub config.json (random init)",
                "framework": f"HF Trainer + accelerate {engine} (transformers {env['transformers']})",
                "strategy": f"FULL_SHARD ({engine})", "dp_shard": w, "dp_replicate": 1, "tp": 1, "pp": 1, "cp": 1,
                "offload": "none", "precision": "bf16 mixed (fp32 params; accelerate param/reduce bf16)", "act_ckpt": ac,
                "compile": "no", "optimizer": f"AdamW ({rec.get('optim', '').split('.')[-1].lower()})",
                "gpu": "H100 SXM 80GB", "n_gpus": w, "n_nodes": max(w // 8, 1), "gpus_per_node": min(w, 8),
                "interconnect": "fake process group: no NCCL communicator, no collectives", "seq_len": s,
                "micro_batch": mb, "grad_accum": 1, "global_batch": w * mb, "global_batch_tokens": w * mb * s,
                "measured_mem_gib": round(value / 2 ** 30, 4), "mem_counter": counter,
                "measured_tokens_per_s_per_gpu": round(mb * s / step, 1),
                "throughput_basis": "rank 0 of a fake process group (no collectives): mb*seq / median step after the first",
                "confidence": "high", "notes": "one GPU as rank 0 of W: no NCCL buffers, no other ranks, no comm time"})
    return rows


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
    # the overlay was measured on the same H100 whose profile the query names (device "cuda"): --force
    args += ["--calibration", str(OVERLAY), "--force"] if calibration else []
    out = subprocess.run(args, capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}).stdout
    return json.loads(out)


def fit_checks(held_records: list[dict]) -> list[dict]:
    """``fit`` with and without the overlay against each held-out run: the allocated peak and the
    step's compute + optimizer time + the eager host's wait beyond them (``host_wait_s``; the fake
    process group sends nothing, so no comm time) beside
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
            row[f"{tag}_compute_s"] = d["time"]["compute_s"] + d["time"]["optimizer_s"] + d["time"]["host_wait_s"]
            row[f"{tag}_time_error"] = row[f"{tag}_compute_s"] / step - 1
        rows.append(row)
    return rows


def refit_rows(held_records: list[dict], train_records: list[dict]) -> tuple[dict, list[dict]]:
    """Reserved on the held-out third, before (allocator.json: k from the earlier campaign) and after
    the allocator's k is refit on the train split alone."""
    from shardplan.calibrate.fragmentation_loso import refit_fragmentation, reserved_with
    from shardplan.calibrate.gpu_heldout import compare

    k = refit_fragmentation(train_records)
    rows = []
    for rec in held_records:
        row = compare(rec)
        if row is None:
            continue
        after = reserved_with(rec, k)
        rows.append({"run": f"{row['model']} {row['class']} ac={row['ac']} use_cache={row['use_cache']}",
                     "measured": row["measured_reserved_bytes"], "before_error": row["reserved_error"],
                     "after_error": None if after is None else after / row["measured_reserved_bytes"] - 1})
    return k, rows


def refit_table(k: dict, rows: list[dict]) -> list[str]:
    ks = ", ".join(f"{name} {v:.2f}" for name, v in sorted(k.items()))
    lines = [f"k refit on the train split (least squares per allocator group, as allocator.json's): {ks}.", "",
             "| held-out run | measured reserved | before (allocator.json) | after (k from the train split) |",
             "| --- | ---: | ---: | ---: |"]
    for r in rows:
        after = "no train run of its class" if r["after_error"] is None else pct(r["after_error"])
        lines.append(f"| {r['run']} | {r['measured'] / 2 ** 30:.2f} GiB | {pct(r['before_error'])} | {after} |")
    return lines


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


def section(held: list[dict], train: list[dict], fits: list[dict], refit: tuple[dict, list[dict]]) -> str:
    overall, by_class = summary(held), summary(held, by="class")
    tr = summary(train)
    return "\n".join([
        BEGIN, "", f"Regenerate: `{COMMAND}` (reads only data/calibration/gpu/userscripts/; fits nothing).", "",
        f"Held-out third: {len(held)} runs (train split: {len(train)}). error = (predicted − measured) / measured.",
        "", "**Held out, all runs, per counter**", "", *table(overall, "split"), "",
        "**Held out, per class (stack × method × engine)**", "", *table(by_class, "class"), "",
        "**Train split, per counter (for comparison; not out of sample)**", "", *table(tr, "split"), "",
        "**Reserved: the allocator's k refit on the train split, judged on the held-out third**", "",
        *refit_table(*refit), "",
        "**`shardplan fit --calibration` on the overlay `calibrate compute` wrote on the same H100, against "
        "the held-out runs** (time: compute + optimizer + the eager host's wait (``host_wait_s``, "
        "formulas/eager_host.py), since the fake process group sends nothing; the measured step is the median "
        "after the first)", "", *fit_table(fits), "",
        END])


def outputs() -> tuple[dict, list[dict]]:
    """Every file this report writes, as {path: text}, and the held-out summary it prints."""
    held = compare_file(gpu_split.FOLDER / gpu_split.HELDOUT_NAME)
    fits = fit_checks(gpu_split.read(gpu_split.FOLDER / gpu_split.HELDOUT_NAME))
    train = compare_file(gpu_split.FOLDER / gpu_split.TRAIN_NAME)
    stats = summary(held) + summary(held, by="class")
    files = {gpu_split.FOLDER / "heldout_errors.json":
             json.dumps({"command": COMMAND, "counters": list(COUNTERS), "summary": stats}, indent=1) + "\n",
             gpu_split.FOLDER / "heldout_errors.csv": rows_csv(held),
             gpu_split.FOLDER / "train_errors.csv": rows_csv(train),
             gpu_split.FOLDER / "heldout_fit_check.csv": rows_csv(fits)}
    for prefix, name, split_name in (("GPUH", gpu_split.HELDOUT_NAME, "held-out third"),
                                     ("GPUT", gpu_split.TRAIN_NAME, "train split")):
        rows = run_rows(gpu_split.read(gpu_split.FOLDER / name), prefix, split_name)
        files[gpu_split.FOLDER / f"runs_{name.split('.')[0]}.csv"] = rows_csv(rows)
    refit = refit_rows(gpu_split.read(gpu_split.FOLDER / gpu_split.HELDOUT_NAME),
                       gpu_split.read(gpu_split.FOLDER / gpu_split.TRAIN_NAME))
    files[gpu_split.FOLDER / "allocator_refit_train.json"] = json.dumps(
        {"fragmentation_per_transient_k": refit[0], "fitted_from": f"data/calibration/gpu/userscripts/{gpu_split.TRAIN_NAME}",
         "how": "shardplan.calibrate.fragmentation_loso.refit_fragmentation: k per allocator group fitted as allocator.json's "
                "(shardplan.calibrate.fragmentation_loso.fit: least squares of the relative reserved error, slack = reserved - "
                "allocated - side-stream pools regressed on the largest transient) over the train split only; judged on the "
                "held-out third in docs/accuracy.md"},
        indent=1) + "\n"
    doc, new = DOC.read_text(), section(held, train, fits, refit)
    if BEGIN in doc:
        doc = doc[:doc.index(BEGIN)] + new + doc[doc.index(END) + len(END):]
    else:
        doc = doc.rstrip("\n") + "\n\n## GPU runs of the scripts users launch: held-out third (issue 25)\n\n" + new + "\n"
    files[DOC] = doc
    return files, stats


def main(argv: list[str]) -> int:
    """Write the report; with ``--check`` only say whether the committed files are current (exit 1
    when a model change moved a number and the report was not rerun)."""
    files, stats = outputs()
    stale = write_generated(files, check="--check" in argv)
    if "--check" in argv:
        print("stale: " + ", ".join(stale) if stale else "current")
        return 1 if stale else 0
    print("\n".join(table(stats, "group")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
