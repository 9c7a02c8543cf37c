"""Issue 22 items 3-5: a calibration overlay of another GPU is refused (or forced with a warning
line) and no answer shows MFU above 100 %; a user profile that shadows a built-in one says so;
duplicate JSON keys are an error; the process-level exits (/dev/full, closed descriptors, latin-1,
a broken pipe, a 2**70-byte GPU) are one-line errors or clean; API values that pass no validation
(``model_copy(update=...)``) raise ShardplanError. benchmarks/hostile_cases.py counts the same
classes."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from shardplan.support.errors import ShardplanError
from tests.helpers import one_line_error, run_cli

REPO = Path(__file__).resolve().parents[1]
FIT = "llama-3.1-8b on 8xh100-sxm"
H100_NAME = "NVIDIA H100 80GB HBM3"  # torch.cuda.get_device_name() on an H100 SXM; an alias of h100-sxm


def overlay(folder: Path, device: str = H100_NAME, f_max: float = 7.9e14, **extra) -> Path:
    data = {"schema": "shardplan.calibration/1", "created": "2026-01-01T00:00:00+00:00",
            "source": {"device": "cuda", "gpu": device}, "links": [], "bandwidth": [], "allocator": None,
            "accuracy": None, "compute": [{"dtype": "bfloat16", "device": device, "f_max_flops_per_s": f_max,
                                           "m_half": 500.0, "p": 1.0, "max_rel_err": 0.05, "n_points": 8}], **extra}
    path = folder / "h100_overlay.json"
    path.write_text(json.dumps(data))
    return path


# --- item 3: foreign calibrations ---------------------------------------------------------------------
@pytest.mark.parametrize("command", ["fit", "plan"])
def test_an_overlay_of_another_gpu_is_refused_naming_both(tmp_path, command):
    cal = overlay(tmp_path)
    line = one_line_error(run_cli(command, "llama-3.1-8b on 8xrtx4090", "--global-batch-tokens", "1M",
                                  "--calibration", cal), "calibration", "h100-sxm", "rtx4090", "--force")
    assert "measured on" in line


def test_forced_it_is_applied_with_one_warning_line_and_a_note(tmp_path):
    cal = overlay(tmp_path)
    res = run_cli("fit", "llama-3.2-1b on 1xrtx4090", "--global-batch-tokens", "1M", "--calibration", cal, "--json",
                  "--force")
    assert res.exit_code == 0, res.output
    warnings = [ln for ln in res.stderr.splitlines() if ln.startswith("shardplan: warning:")]
    assert len(warnings) == 1 and "h100-sxm" in warnings[0] and "rtx4090" in warnings[0]
    rows = json.loads(res.stdout)
    assert all(any("applied anyway" in n for n in r["notes"]) for r in rows)
    assert max(r["time"]["mfu"] for r in rows) <= 1.0


def test_its_own_gpu_and_a_stated_link(tmp_path):
    cal = overlay(tmp_path)
    assert run_cli("fit", FIT, "--global-batch-tokens", "1M", "--calibration", cal).exit_code == 0
    link_cal = overlay(tmp_path, measured_on={"gpu": "h100-sxm", "link": "pcie5"}, links=[
        {"tier": "intra_node", "op": "all_gather", "world_size": 8, "r2_log": 0.99, "max_rel_err": 0.1, "n_points": 10,
         "segments": [{"min_bytes": 0, "max_bytes": 2**30, "alpha_s": 1e-5, "bandwidth_bytes_per_s": 5e10}]}])
    one_line_error(run_cli("fit", FIT, "--calibration", link_cal), "pcie5", "nvlink4")
    assert run_cli("fit", FIT, "--calibration", link_cal, "--intra-link", "pcie5").exit_code == 0


def test_written_overlays_carry_the_machine_and_refuse_to_mix(tmp_path):
    from shardplan.calibrate.overlay import write_calibration

    fit = {"dtype": "bfloat16", "device": H100_NAME, "f_max_flops_per_s": 7e14, "m_half": 500.0, "p": 1.0,
           "max_rel_err": 0.05, "n_points": 8}
    cal = write_calibration(tmp_path / "c.json", compute=[fit], source={"gpu": H100_NAME, "torch": "2.5.1",
                                                                        "cuda": "12.4"})
    assert cal.measured_on.gpu == "h100-sxm" and cal.measured_on.torch == "2.5.1"
    with pytest.raises(ShardplanError, match="h100-sxm"):
        write_calibration(tmp_path / "c.json", compute=[{**fit, "device": "NVIDIA A100-SXM4-80GB"}],
                          source={"gpu": "NVIDIA A100-SXM4-80GB"})


@pytest.mark.parametrize("method", ["full", "lora"])
def test_no_answer_shows_mfu_above_one_over_a_sweep(tmp_path, method):
    """Every GPU profile x three models x {1, 8} GPUs x two sequence lengths x two precisions, with
    an overlay claiming 2.5 PFLOP/s (faster than any GPU's bf16 nameplate) and without one."""
    from shardplan.calibrate.overlay import load_calibration
    from shardplan.inputs.config import TrainingConfig
    from shardplan.inputs.hardware import gpu_profiles, parse_gpus
    from shardplan.inputs.models import resolve_model
    from shardplan.planning.fit import step_timings

    fast = load_calibration(overlay(tmp_path, f_max=2.5e15))
    configs = [TrainingConfig(seq_len=s, micro_batch=4, grad_accum=8, method=method, precision=p)
               for s in (512, 4096) for p in ("bf16-mixed", "fp16-mixed")]
    worst, count = 0.0, 0
    for gpu in gpu_profiles():
        for model in ("gpt2", "llama-3.2-1b", "llama-3.1-8b"):
            for n in (1, 8):
                for cal in (None, fast):
                    times = step_timings(resolve_model(model).spec, parse_gpus(f"{n}x{gpu.name}"), configs, cal)
                    worst = max([worst, *(t["mfu"] for t in times)])
                    count += len(times)
    assert count >= 500 and 0 < worst <= 1.0, (count, worst)


# --- item 4: shadowing profiles and duplicate keys -----------------------------------------------------
def _user_gpu(tmp_path, monkeypatch, **changes) -> Path:
    data = json.loads((REPO / "shardplan/data/hardware_profiles/gpus/a100-80gb.json").read_text())
    folder = tmp_path / "profiles" / "hardware_profiles" / "gpus"
    folder.mkdir(parents=True)
    (folder / "mine.json").write_text(json.dumps({**data, **changes}))
    monkeypatch.setenv("SHARDPLAN_PROFILE_PATH", str(tmp_path / "profiles"))
    return folder / "mine.json"


@pytest.mark.parametrize("changes", [{"name": "tiny-card", "aliases": ["a100-80gb"], "generic_aliases": []},
                                     {"name": "a100-80gb"}])
def test_a_user_profile_that_shadows_a_built_in_is_announced(tmp_path, monkeypatch, changes):
    path = _user_gpu(tmp_path, monkeypatch, memory_bytes=2**30, nominal_memory_gb=1, **changes)
    for argv in (["fit", "llama-3.1-8b on 8xa100-80gb"], ["fit", "llama-3.1-8b on 8xa100-80gb", "--json"]):
        from shardplan.inputs import profiles
        profiles._announced.clear()  # once per process: each CLI run is its own process
        res = run_cli(*argv)
        notes = [ln for ln in res.stderr.splitlines() if "shadows the built-in a100-80gb" in ln]
        assert res.exit_code == 0 and len(notes) == 1 and str(path) in notes[0], res.stderr
    profiles._announced.clear()
    res = run_cli("fit", FIT)
    assert "shadows" not in res.stderr  # an answer that does not use it says nothing


@pytest.mark.parametrize("where", ["validate", "calibration", "hf-config", "profile-path"])
def test_duplicate_json_keys_are_an_error(tmp_path, monkeypatch, where):
    gpu = (REPO / "shardplan/data/hardware_profiles/gpus/a100-80gb.json").read_text().rstrip()
    dup = gpu[:-1] + ', "memory_bytes": 1073741824}'
    if where == "validate":
        p = tmp_path / "gpu.json"
        p.write_text(dup)
        one_line_error(run_cli("profiles", "validate", p), "duplicate key 'memory_bytes'")
    elif where == "calibration":
        cal = overlay(tmp_path)
        cal.write_text(cal.read_text()[:-1] + ', "schema": "shardplan.calibration/1"}')
        one_line_error(run_cli("fit", FIT, "--calibration", cal), "calibration", "duplicate key 'schema'")
    elif where == "hf-config":
        p = tmp_path / "config.json"
        p.write_text('{"model_type": "llama", "num_hidden_layers": 32, "num_hidden_layers": 2}')
        one_line_error(run_cli("fit", "--model", p, "--gpus", "8xh100-sxm"), "duplicate key 'num_hidden_layers'")
    else:
        _user_gpu(tmp_path, monkeypatch)
        (tmp_path / "profiles/hardware_profiles/gpus/mine.json").write_text(dup.replace('"a100-80gb"', '"dup-card"', 1))
        res = run_cli("fit", "llama-3.1-8b on 8xdup-card")
        assert res.exit_code == 2 and "duplicate key 'memory_bytes'" in res.stderr



def _skipped(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("shardplan: warning: SHARDPLAN_PROFILE_PATH: skipped")]


@pytest.mark.parametrize("change, field", [({"memory_bytes": 2**70}, "memory_bytes"), ({"memroy_gb": 80}, "memroy_gb"),
                                           ({"memory_bytes": "lots"}, "memory_bytes")])
def test_an_invalid_user_profile_is_announced_once_naming_file_and_field(tmp_path, monkeypatch, change, field):
    path = _user_gpu(tmp_path, monkeypatch, name="bad-card", aliases=[], generic_aliases=[], **change)
    res = run_cli("fit", "llama-3.1-8b on 8xbad-card")
    lines = _skipped(res.stderr)
    assert res.exit_code == 2 and len(lines) == 1, res.stderr
    assert str(path) in lines[0] and f"{field}=" in lines[0]
    res = run_cli("fit", FIT)  # the same process: the file was announced already
    assert res.exit_code == 0 and _skipped(res.stderr) == []


def test_a_folder_searched_for_every_kind_announces_only_profiles_of_the_kind(tmp_path, monkeypatch):
    """A flat folder (no kind subfolders) is read as models, GPUs and links: a valid profile of one
    kind is silently not another's; an invalid one is announced by the kind it is meant for."""
    flat = tmp_path / "flat"
    flat.mkdir()
    gpu = json.loads((REPO / "shardplan/data/hardware_profiles/gpus/a100-80gb.json").read_text())
    link = json.loads((REPO / "shardplan/data/hardware_profiles/links/nvlink4.json").read_text())
    model = json.loads((REPO / "shardplan/data/model_profiles/gpt2.json").read_text())
    (flat / "gpu.json").write_text(json.dumps({**gpu, "name": "flat-card", "aliases": [], "generic_aliases": []}))
    (flat / "link.json").write_text(json.dumps({**link, "name": "flat-link", "aliases": []}))
    (flat / "model.json").write_text(json.dumps({**model, "name": "flat-model", "aliases": [], "num_layers": -1}))
    (flat / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))  # not a profile
    monkeypatch.setenv("SHARDPLAN_PROFILE_PATH", str(flat))
    res = run_cli("fit", "gpt2 on 2xflat-card")
    assert res.exit_code == 0, res.output
    lines = _skipped(res.stderr)
    assert len(lines) == 1 and str(flat / "model.json") in lines[0] and "num_layers=-1" in lines[0], res.stderr


# --- item 5: process-level exits -------------------------------------------------------------------------
def shardplan(args: list[str], suffix: str = "", env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m shardplan ARGS SUFFIX`` in bash; after a pipe, stderr ends with shardplan's own status."""
    line = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "shardplan", *args]) + " " + suffix
    if "|" in suffix:
        line += ' ; echo "shardplan-status=${PIPESTATUS[0]}" >&2'
    return subprocess.run(["bash", "-c", line], capture_output=True, text=True, errors="replace", timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_on_stdout_is_one_line():
    res = shardplan(["fit", FIT], "> /dev/full")
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "shardplan: error: output='standard output': cannot write: No space left on device"]


@pytest.mark.parametrize("args,suffix,codes", [
    (["fit", FIT], "<&-", (0,)),
    (["export", "-", "--to", "fsdp2"], "<&-", (2,)),
    (["fit", FIT], ">&-", (0, 2)),
    (["fit", "nonsense-model on 8xh100-sxm"], "2>&-", (2,)),
    (["--help"], "| head -1", (0,)),
    (["fit", "--help"], "| head -1", (0,)),
    (["models"], "| head -1", (0,)),
    (["fit", "70B on 4x24GB"], "| head -1", (0,)),
])
def test_closed_descriptors_and_broken_pipes_end_cleanly(args, suffix, codes):
    res = shardplan(args, suffix)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    if "|" in suffix:
        code, lines = int(lines.pop().split("=")[1]), lines
    else:
        code = res.returncode
    assert code in codes, res.stderr
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr and "Exception ignored" not in res.stderr
    assert len(lines) <= 1, lines


@pytest.mark.parametrize("args", [["fit", FIT], ["fit", "70B on 4x24GB"], ["plan", FIT, "--global-batch-tokens", "1M"]])
def test_an_encoding_that_cannot_show_the_output(args):
    res = shardplan(args, env={"PYTHONIOENCODING": "latin-1"})
    assert res.returncode == 0 and "internal error" not in res.stderr, res.stderr


def test_a_gpu_with_2_to_the_70_bytes(tmp_path, monkeypatch):
    path = _user_gpu(tmp_path, monkeypatch, name="huge-card", aliases=[], generic_aliases=[], memory_bytes=2**70)
    one_line_error(run_cli("profiles", "validate", path), "memory_bytes")
    res = run_cli("fit", "llama-3.1-8b on 8xhuge-card")
    assert res.exit_code == 2 and "internal error" not in res.stderr


# --- item 5: API values no validation saw ---------------------------------------------------------------
def _parts():
    from shardplan.inputs.config import TrainingConfig
    from shardplan.inputs.hardware import parse_gpus
    from shardplan.inputs.models import resolve_model

    return resolve_model("llama-3.1-8b").spec, parse_gpus("8xh100-sxm"), TrainingConfig()


@pytest.mark.parametrize("update", [{"micro_batch": math.nan}, {"seq_len": 0}, {"grad_accum": -1},
                                    {"micro_batch": 1.5}, {"lora_rank": 2**70}])
@pytest.mark.parametrize("call", ["fit", "evaluate", "evaluate_queries", "step_timing"])
def test_an_unvalidated_config_raises(update, call):
    import shardplan
    from shardplan.planning import fit

    spec, cluster, config = _parts()
    bad = config.model_copy(update=update)
    run = {"fit": lambda: fit.fit(spec, cluster, bad, ["full_shard"]), "evaluate": lambda: fit.evaluate(spec, cluster, bad),
           "evaluate_queries": lambda: shardplan.evaluate_queries([(spec, cluster, bad)]),
           "step_timing": lambda: fit.step_timing(spec, cluster, bad)}[call]
    with pytest.raises(ShardplanError, match=next(iter(update))):
        run()


@pytest.mark.parametrize("update", [{"num_layers": 0}, {"hidden_size": -4}])
def test_an_unvalidated_model_raises(update):
    import shardplan
    from shardplan.planning import fit

    spec, cluster, config = _parts()
    bad = spec.model_copy(update=update)
    with pytest.raises(ShardplanError, match=next(iter(update))):
        fit.fit(bad, cluster, config, ["full_shard"])
    with pytest.raises(ShardplanError, match=next(iter(update))):
        shardplan.evaluate_queries([(bad, cluster, config)])


@pytest.mark.parametrize("knob,value", [("dropout", "no"), ("dropout", 1), ("sync_every_micro_batch", "yes"),
                                        ("optimizer_in_backward", "false")])
def test_sweep_flags_are_true_or_false(knob, value):
    import shardplan

    with pytest.raises(ShardplanError, match=knob):
        shardplan.sweep(models="gpt2", gpus="h100-sxm", gpu_counts=[8], strategies="full_shard", progress=False,
                        **{knob: value})
    assert len(shardplan.sweep(models="gpt2", gpus="h100-sxm", gpu_counts=[8], strategies="full_shard", progress=False,
                               **{knob: [True, False]})) == 2
