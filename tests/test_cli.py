"""The CLI as a user meets it: answers, JSON shape, and one-line errors with exit code 2."""

import json
import subprocess
import sys

import pytest

from shardplan.cli.app import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_70b_on_4x24gb_full_does_not_fit_qlora_does(capsys):
    code, out, err = run(capsys, "fit", "70B on 4x24GB", "--wide", "--detail")  # every row and term
    assert code == 0
    assert "Llama-3.1-70B" in out and "nearest built-in reference" in out
    assert "DOES NOT FIT" in out and "FITS  " not in out
    qlora = [line for line in out.splitlines() if "QLoRA" in line]
    # QLoRA + AC under FSDP (the hf stack: checkpoint_wrapper, use_cache off as Trainer/TRL set it)
    # peaks at 21.9 GiB, under the 23.6 GiB; with the error band (docs/accuracy.md) not a "✓".
    assert qlora and qlora[0].lstrip()[0] in "≈✓"
    for term in ("params", "grads", "optimizer_states", "model states"):
        assert term in out


def test_fit_json_single_strategy(capsys):
    code, out, _ = run(capsys, "fit", "70B on 4x24GB", "--strategy", "full_shard", "--json")
    assert code == 0
    r = json.loads(out)
    assert r["fits"] is False
    assert r["model"]["params"] == 70_553_706_496
    assert r["strategy"] == "full_shard"
    assert r["gpu"]["memory_bytes"] > 20 * 2**30
    assert sum(r["per_gpu"]["breakdown"].values()) == r["per_gpu"]["peak_allocated_bytes"]
    assert all(isinstance(v, int) for v in r["per_gpu"]["breakdown"].values())
    assert r["per_gpu"]["peak_reserved_bytes"] >= r["per_gpu"]["peak_allocated_bytes"]
    # ~16 bytes/param of model state over 4 GPUs = ~282 GB (ZeRO paper, SC'20, §3.1: 16Ψ for mixed-precision Adam).
    assert r["per_gpu"]["model_state_bytes"] / 1e9 == pytest.approx(282.2, abs=1)
    assert isinstance(r["per_node"]["host_bytes"], int)
    assert any(a["verdict"] in ("fits", "tight") and a["config"]["method"] == "qlora" for a in r["alternatives"])
    assert all(a["fits"] == (a["verdict"] == "fits") for a in r["alternatives"])


def test_fit_json_all_strategies_is_a_list(capsys):
    code, out, _ = run(capsys, "fit", "llama-3.1-8b on 8xh100-sxm seq 8192 batch 2", "--json")
    rows = json.loads(out)
    assert code == 0 and isinstance(rows, list)
    assert {r["strategy"] for r in rows} == {"ddp", "no_shard", "shard_grad_op", "full_shard", "hybrid_shard",
                                             "hybrid_shard_zero2"}
    assert all(r["config"]["seq_len"] == 8192 and r["config"]["micro_batch"] == 2 for r in rows)


def test_qlora_with_fsdp_and_checkpointing_fits_70b_on_4x24gb(capsys):
    code, out, _ = run(capsys, "fit", "70B on 4x24GB qlora ac full full_shard", "--json")
    r = json.loads(out)
    assert code == 0 and r["verdict"] in ("fits", "tight") and r["fits"] == (r["verdict"] == "fits")
    assert r["config"]["checkpoint_wrapper"] is True and r["config"]["use_cache"] is False
    # left on, transformers' KV cache under the wrapper keeps 80 blocks' K/V and norm chains: the device
    # total is over the card (its allocated peak is not, so the allocator's retry leaves it tight, not
    # does_not_fit: verdict.retry_floor_bytes), and the answer says use_cache=False is the cure
    _, out, _ = run(capsys, "fit", "70B on 4x24GB qlora ac full full_shard", "--json", "--use-cache")
    cached = json.loads(out)
    assert cached["verdict"] != "fits" and any("use_cache" in n for n in cached["notes"])
    assert cached["per_gpu"]["device_total_bytes"] > cached["gpu"]["memory_bytes"]
    assert cached["per_gpu"]["device_total_bytes"] - r["per_gpu"]["device_total_bytes"] > 2 * 2**30
    assert any(a["config"].get("use_cache") is False and a["verdict"] != "does_not_fit" for a in cached["alternatives"])
    assert r["per_gpu"]["device_total_bytes"] < r["gpu"]["memory_bytes"]
    assert r["margin_bytes"] == r["gpu"]["memory_bytes"] - r["per_gpu"]["device_total_bytes"] - r["band_bytes"]


def test_8b_qlora_on_one_24gb_card_fits_and_says_its_defaults(capsys):
    code, out, _ = run(capsys, "fit", "8b on 1x24GB qlora", "--json")
    r = json.loads(out)
    r = r[0] if isinstance(r, list) else r  # one GPU: the one strategy, single
    assert code == 0 and r["verdict"] == "fits"
    assert (r["config"]["precision"], r["config"]["ac"]) == ("bf16-mixed", "full")
    assert any("QLoRA defaults assumed" in n and "bf16" in n for n in r["notes"])
    _, out, _ = run(capsys, "fit", "8b on 1x24GB qlora", "--precision", "bf16-mixed", "--ac", "full", "--json")
    stated = json.loads(out)
    assert not any("QLoRA defaults assumed" in n for n in (stated[0] if isinstance(stated, list) else stated)["notes"])  # stated: nothing assumed


def test_options_equal_free_text(capsys):
    _, a, _ = run(capsys, "fit", "llama-2-7b on 2x8xa100-80gb seq 4096", "--strategy", "hybrid_shard", "--json")
    _, b, _ = run(capsys, "fit", "--model", "meta-llama/Llama-2-7b-hf", "--gpus", "2x8xa100-80gb", "--seq-len", "4096",
                  "--strategy", "hybrid_shard", "--json")
    assert json.loads(a)["per_gpu"] == json.loads(b)["per_gpu"]


BAD = [
    (["fit", "banana on 4x24GB"], "banana"),
    (["fit", "70B on 0x24GB"], "0x24GB"),
    (["fit", "70B on 4xNOSUCHGPU"], "NOSUCHGPU"),
    (["fit", "70B on 4x23GB"], "23"),
    (["fit", "70B"], "70B"),
    (["fit", "70B on 4x24GB wibble"], "wibble"),
    (["fit", "--model", "/nonexistent/config.json", "--gpus", "8xh100-sxm"], "/nonexistent/config.json"),
    (["fit", "70B on 4x24GB", "--seq-len", "-5"], "-5"),
    (["fit", "70B on 4x24GB", "--micro-batch", "0"], "micro_batch"),
    (["fit", "70B on 4x24GB", "--strategy", "zero9"], "zero9"),
    (["fit", "70B on 4x24GB", "--strategy", "zero2"], "zero2"),
    (["fit", "-5B on 4x24GB"], "-5"),
    (["fit", "--", "-5B on 4x24GB"], "-5B"),
    (["fit", "--nope"], "--nope"),
    (["models", "show", "nope"], "nope"),
    (["hardware", "show", "nope"], "nope"),
]


@pytest.mark.parametrize("argv,named", BAD)
def test_bad_input_is_one_line_exit_2(capsys, argv, named):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert "Traceback" not in err + out
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and named in lines[0]


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_bad_config_files(tmp_path, capsys):
    cases = {
        "notjson.json": ("{not json", "not valid JSON"),
        "heads.json": (json.dumps({"model_type": "llama", "hidden_size": 100, "num_attention_heads": 3,
                                   "intermediate_size": 64, "num_hidden_layers": 2, "vocab_size": 10}), "num_heads=3"),
        "unknown.json": (json.dumps({"model_type": "t5", "d_model": 512}), "t5"),
        "negative.json": (json.dumps({"model_type": "llama", "hidden_size": -4096, "num_attention_heads": 32,
                                      "intermediate_size": 64, "num_hidden_layers": 2, "vocab_size": 10}), "-4096"),
        "missing.json": (json.dumps({"model_type": "llama", "hidden_size": 4096}), "num_hidden_layers"),
        "list.json": ("[1, 2]", "JSON object"),
    }
    for name, (text, named) in cases.items():
        code, out, err = run(capsys, "fit", "--model", _write(tmp_path, name, text), "--gpus", "8xh100-sxm")
        assert code == 2, name
        assert named in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (name, err)


def test_hf_config_json_is_accepted(tmp_path, capsys):
    config = {"model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8}
    code, out, _ = run(capsys, "fit", "--model", _write(tmp_path, "config.json", json.dumps(config)),
                       "--gpus", "8xh100-sxm", "--strategy", "full_shard", "--json")
    assert code == 0 and json.loads(out)["model"]["params"] == 7_241_732_096


def test_models_hardware_profiles_commands(tmp_path, capsys):
    code, out, _ = run(capsys, "models")
    assert code == 0 and "llama-3.1-405b" in out and "gpt3-175b" in out
    code, out, _ = run(capsys, "hardware")
    assert code == 0 and "h100-sxm" in out and "nvlink4" in out
    code, out, _ = run(capsys, "hardware", "show", "h100-sxm")
    assert code == 0 and out.splitlines()[0].startswith("field") and "source" in out and "TFLOP/s" in out  # a table
    code, out, _ = run(capsys, "hardware", "show", "h100-sxm", "--json")
    assert code == 0 and "sources" in json.loads(out)
    from shardplan.inputs.profiles import DATA_DIR
    code, out, _ = run(capsys, "profiles", "validate", str(DATA_DIR))
    assert code == 0 and out.count(": ok") >= 19 + 12 + 15
    bad = _write(tmp_path, "gpu.json", json.dumps({"name": "x", "vendor": "nvidia"}))
    code, _, err = run(capsys, "profiles", "validate", bad)
    assert code == 2 and "gpu.json" in err


def test_console_script_has_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "shardplan", "fit", "70B on 4xNOSUCHGPU"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "NOSUCHGPU" in proc.stderr


def test_fit_with_global_batch_reports_time(capsys):
    code, out, _ = run(capsys, "fit", "llama-3.1-8b on 8xh100-sxm seq 8192 ac selective full_shard",
                       "--global-batch-tokens", "1M", "--json")
    r = json.loads(out)
    assert code == 0
    # 1M tokens / (8 GPUs × 8192) = 15.3 -> 15 sequences per GPU, as grad accumulation of micro-batch 1.
    assert r["config"]["grad_accum"] == 15
    t = r["time"]
    assert 0 < t["mfu"] <= 1
    assert t["step_time_s"] >= t["compute_s"]
    assert t["tokens_per_s"] == pytest.approx(8 * t["tokens_per_s_per_gpu"])
    assert t["tokens_per_s_per_gpu"] == pytest.approx(15 * 8192 / t["step_time_s"])


def test_fit_global_batch_that_micro_batch_does_not_divide(capsys):
    code, _, err = run(capsys, "fit", "llama-3.1-8b on 8xh100-sxm seq 8192 batch 4", "--global-batch-tokens", "1M")
    assert code == 2 and "micro_batch=4" in err
