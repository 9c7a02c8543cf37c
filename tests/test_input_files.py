"""Issue 12, files that are not what they claim: every file shardplan reads goes through one bounded
reader (shardplan/support/input_files.py) and each file's pydantic model. Each case here ended in a
traceback, a hang or a wrong answer before; now it is one stderr line naming the field and the
file, and exit code 2 (tests/test_exit_codes.py's contract)."""

from __future__ import annotations

import io
import json
import os
import sys
import time

import pytest

from tests.helpers import one_line_error, run_cli

LLAMA = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
         "intermediate_size": 11008, "vocab_size": 32000}
FIT = ("--gpus", "8xh100-sxm", "--strategy", "full_shard")


def write(path, content):
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


# --- the bounded reader, through `fit --model FILE` ------------------------------------------------
BAD_FILES = [
    ("binary.json", bytes(range(256)) * 4, "not UTF-8 text (byte 0x80 at offset 128)"),
    ("latin1.json", '{"name": "café"}'.encode("latin-1"), "not UTF-8 text (byte 0xe9"),
    ("deep_list.json", "[" * 100_000 + "]" * 100_000, "nested deeper than 64 levels"),
    ("deep_object.json", '{"a":' * 50_000 + "1" + "}" * 50_000, "nested deeper than 64 levels"),
    ("nan.json", '{"model_type": "llama", "hidden_size": NaN}', "NaN is not a JSON number"),
    ("infinity.json", '{"model_type": "llama", "hidden_size": -Infinity}', "-Infinity is not a JSON number"),
    ("overflow.json", '{"model_type": "llama", "hidden_size": 1e999}', "overflows a 64-bit float"),
    ("digits.json", '{"model_type": "llama", "hidden_size": ' + "9" * 5000 + "}", "an integer of 5,000 digits"),
    ("truncated.json", '{"model_type": "llama", "hidden_size": 40', "not valid JSON (column 42"),
    ("list.json", "[1, 2, 3]", "expected a JSON object at the top level, not a list"),
]


@pytest.mark.parametrize("name, content, reason", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_a_file_that_is_not_json_is_one_line(tmp_path, name, content, reason):
    # before: UnicodeDecodeError / RecursionError / ValueError (4300 digits) tracebacks, NaN and inf read
    path = write(tmp_path / name, content)
    one_line_error(run_cli("fit", "--model", path, *FIT), f"model='{path}'", reason)


@pytest.mark.parametrize("command", [("profiles", "validate"), ("export",)])
def test_other_commands_read_through_the_same_reader(tmp_path, command):
    path = write(tmp_path / "binary.json", bytes(range(256)))
    extra = ("--to", "fsdp2") if command == ("export",) else ()
    one_line_error(run_cli(*command, path, *extra), str(path), "not UTF-8 text")


def test_calibration_overlay_with_nan_is_refused(tmp_path):
    # before: json.loads read NaN; a NaN bandwidth then reached the formulas
    path = write(tmp_path / "cal.json", '{"schema": "shardplan.calibration/1", "created": "x", "links": [{"tier": '
                 '"intra_node", "op": "all_gather", "world_size": 2, "segments": [{"min_bytes": 0, "max_bytes": 1, '
                 '"alpha_s": 1e-5, "bandwidth_bytes_per_s": NaN}], "r2_log": 1, "max_rel_err": 0, "n_points": 3}]}')
    one_line_error(run_cli("fit", "--model", "llama-3.1-8b", *FIT, "--calibration", path), "calibration", "NaN is not a JSON number")


def test_a_folder_where_a_file_goes(tmp_path):
    folder = tmp_path / "plans.json"
    folder.mkdir()
    one_line_error(run_cli("export", folder, "--to", "fsdp2"), "plan=", "is a folder; give a file")
    one_line_error(run_cli("fit", "--model", "llama-3.1-8b", *FIT, "--calibration", folder), "calibration=", "is a folder")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("argv", [("fit", "--model", "{fifo}", *FIT), ("profiles", "validate", "{fifo}"),
                                  ("export", "{fifo}", "--to", "fsdp2"),
                                  ("fit", "--model", "llama-3.1-8b", *FIT, "--calibration", "{fifo}")])
def test_a_fifo_is_refused_without_opening_it(tmp_path, argv):
    # before: `--model FIFO` blocked forever in open() waiting for a writer
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    start = time.monotonic()
    res = run_cli(*[str(fifo) if a == "{fifo}" else a for a in argv])
    assert time.monotonic() - start < 60
    one_line_error(res, str(fifo), "not a regular file (a FIFO, socket or device)")


@pytest.mark.parametrize("argv", [("fit", "--model", "{long}", *FIT), ("fit", "{long} on 8xh100-sxm"),
                                  ("fit", "--model", "/tmp/{long}.json", *FIT),
                                  ("profiles", "validate", "/tmp/{long}.json"),
                                  ("export", "/tmp/{long}.json", "--to", "fsdp2"),
                                  ("fit", "--model", "llama-3.1-8b", *FIT, "--calibration", "/tmp/{long}.json"),
                                  ("calibrate", "compare", "/tmp/{long}.jsonl")])
def test_names_over_255_bytes(argv):
    # before: OSError: [Errno 36] File name too long, from Path.is_dir() / read_text()
    long = "a" * 300
    res = run_cli(*[a.replace("{long}", long) for a in argv])
    line = one_line_error(res)
    assert "longer than 255 bytes" in line or "unknown model" in line, line
    assert len(line) < 600  # the 300-character value is shortened


def test_missing_files_name_the_field(tmp_path):
    missing = tmp_path / "nope.json"
    one_line_error(run_cli("fit", "--model", missing, *FIT), "model=", "no such file")
    one_line_error(run_cli("export", missing, "--to", "fsdp2"), "plan=", "no such file")
    one_line_error(run_cli("fit", "--model", "llama-3.1-8b", *FIT, "--calibration", missing), "calibration=", "no such file")
    one_line_error(run_cli("calibrate", "collectives", "--samples", missing, "--out", tmp_path / "o.json"),
                   "samples=", "no such file")


def test_oversized_file_is_refused_before_reading(tmp_path):
    from shardplan.support.limits import MAX_PROFILE_FILE_BYTES

    path = tmp_path / "big.json"
    with open(path, "wb") as f:  # sparse: no disk used
        f.truncate(MAX_PROFILE_FILE_BYTES + 1)
    one_line_error(run_cli("fit", "--model", path, *FIT), "model=", "larger than the 16 MiB")


def test_export_from_stdin_reads_bytes_bounded_and_utf8(tmp_path, monkeypatch):
    # before: sys.stdin.read() raised UnicodeDecodeError on binary input
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xff\xfe\x00binary")))
    one_line_error(run_cli("export", "-", "--to", "fsdp2"), "plan='-'", "not UTF-8 text")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'[{"model": 1}, NaN]')))
    one_line_error(run_cli("export", "-", "--to", "fsdp2"), "plan='-'", "NaN is not a JSON number")


# --- SHARDPLAN_PROFILE_PATH --------------------------------------------------------------------------
def test_a_broken_user_profile_is_one_warning_not_a_crash(tmp_path, monkeypatch):
    # before: a binary *.json on SHARDPLAN_PROFILE_PATH broke every `fit` with UnicodeDecodeError
    folder = tmp_path / "profiles"
    (folder / "model_profiles").mkdir(parents=True)
    broken = write(folder / "model_profiles" / "broken.json", bytes(range(256)))
    write(folder / "model_profiles" / "gpu-not-model.json", {"name": "x", "vendor": "nvidia"})  # another kind
    monkeypatch.setenv("SHARDPLAN_PROFILE_PATH", str(folder))
    res = run_cli("fit", "--model", "llama-3.1-8b", *FIT)
    assert res.exit_code == 0, res.output
    warnings = [l for l in res.stderr.splitlines() if l.startswith("shardplan: warning:")]
    assert len(warnings) == 1 and str(broken) in warnings[0] and "not UTF-8 text" in warnings[0], res.stderr
    assert "gpu-not-model" not in res.stderr  # valid JSON of another kind: skipped silently
    assert "Traceback" not in res.output


def test_a_valid_user_profile_beside_a_broken_one_is_found(tmp_path, monkeypatch):
    from shardplan.inputs.models import get_model

    folder = tmp_path / "p"
    folder.mkdir()
    own = {**json.loads(get_model("llama-3.1-8b").model_dump_json()), "name": "my-own-8b", "aliases": []}
    write(folder / "mine.json", own)
    write(folder / "torn.json", '{"name": "x"')
    os.mkfifo(folder / "pipe.json")
    monkeypatch.setenv("SHARDPLAN_PROFILE_PATH", str(folder))
    res = run_cli("fit", "--model", "my-own-8b", *FIT)
    assert res.exit_code == 0, res.output
    assert sum(l.startswith("shardplan: warning:") for l in res.stderr.splitlines()) == 2, res.stderr


# --- Hugging Face config.json values ---------------------------------------------------------------
HF_BAD = [
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings='false'", "must be a JSON boolean"),
    ({"attention_bias": "no"}, "attention_bias='no'", "must be a JSON boolean"),
    ({"num_hidden_layers": 10**12}, "num_hidden_layers=1000000000000", "[1, 10,000]"),
    ({"num_hidden_layers": "32"}, "num_hidden_layers='32'", "whole number"),
    ({"num_hidden_layers": 32.5}, "num_hidden_layers=32.5", "whole number"),
    ({"hidden_size": -1}, "hidden_size=-1", "[1, 1,048,576]"),
    ({"vocab_size": True}, "vocab_size=True", "whole number"),
    ({"hidden_act": ["silu"]}, "hidden_act=['silu']", "unsupported activation"),
    ({"model_type": ["llama"]}, "model_type=['llama']", "must be a string"),
    ({"model_type": "qwen3_moe", "mlp_only_layers": [[1]]}, "mlp_only_layers=[[1]]", "block indices in [0, 31]"),
    ({"model_type": "llama4_text", "moe_layers": "abc"}, "moe_layers='abc'", "block indices"),
    ({"model_type": "llama4_text", "moe_layers": [99]}, "moe_layers=[99]", "block indices in [0, 31]"),
]


@pytest.mark.parametrize("change, named, reason", HF_BAD, ids=[h[1] for h in HF_BAD])
def test_hf_config_values_are_checked_by_name(tmp_path, change, named, reason):
    # before: "false" read as true (tied embeddings: a different parameter count), 10**12 layers hung
    # in a per-layer list, lists where strings go raised TypeError: unhashable type
    path = write(tmp_path / "config.json", {**LLAMA, **change})
    start = time.monotonic()
    one_line_error(run_cli("fit", "--model", path, *FIT), named, reason)
    assert time.monotonic() - start < 60


def test_hf_booleans_are_read_strictly_and_correctly(tmp_path):
    from shardplan.inputs.hf_config import spec_from_hf_config_file

    tied = spec_from_hf_config_file(write(tmp_path / "a.json", {**LLAMA, "tie_word_embeddings": True}))
    untied = spec_from_hf_config_file(write(tmp_path / "b.json", {**LLAMA, "tie_word_embeddings": False}))
    # tying drops the lm_head: vocab x hidden = 32000 x 4096 parameters exactly
    assert untied.total_params - tied.total_params == 32000 * 4096


@pytest.mark.parametrize("text_config", [None, "x", [1]])
def test_multimodal_config_without_a_text_config_object(tmp_path, text_config):
    config = {"model_type": "gemma3"} if text_config is None else {"model_type": "gemma3", "text_config": text_config}
    path = write(tmp_path / "config.json", config)
    one_line_error(run_cli("fit", "--model", path, *FIT), "text_config", "must be a JSON object")


def test_name_or_path_of_the_wrong_type_falls_back_to_the_folder(tmp_path):
    from shardplan.inputs.hf_config import spec_from_hf_config_file

    folder = tmp_path / "my-model"
    folder.mkdir()
    spec = spec_from_hf_config_file(write(folder / "config.json", {**LLAMA, "_name_or_path": ["x"]}))
    assert spec.name == "my-model"


def test_model_profile_json_is_bounded_too(tmp_path):
    from shardplan.inputs.models import get_model

    data = json.loads(get_model("llama-3.1-8b").model_dump_json())
    path = write(tmp_path / "mine.json", {**data, "num_layers": 10**9})
    one_line_error(run_cli("fit", "--model", path, *FIT), "num_layers=1000000000", "less than or equal to 10000")


# --- calibration inputs ----------------------------------------------------------------------------
NCCL = os.path.join(os.path.dirname(__file__), "data", "nccl_tests_sample_all_gather_perf.txt")


def _rows(text):
    return [l for l in text.splitlines() if l.split() and l.split()[0].isdigit() and not l.lstrip().startswith("#")]


def test_truncated_nccl_tests_file(tmp_path):
    text = open(NCCL).read()
    cut = text[: text.index(_rows(text)[0])]  # the header only: the run died before its first row
    path = write(tmp_path / "all_gather_perf.txt", cut)
    one_line_error(run_cli("calibrate", "collectives", "--nccl-tests", path, "--out", tmp_path / "o.json",
                           "--tier", "intra_node"), "nccl_tests", "no result rows found")
    assert not (tmp_path / "o.json").exists()


def test_flat_timings_are_refused_not_written_as_1e30_bytes_per_s(tmp_path):
    # before: a range where the time does not grow with size was fitted with B = 1e30 B/s and, as the
    # last segment, became the bandwidth every large message in every plan used
    text = open(NCCL).read()
    flat = text
    for row in _rows(text):
        tok = row.split()
        tok[5] = tok[9] = "11.00"  # out-of-place and in-place time (us), the same for every size
        flat = flat.replace(row, "  ".join(tok))
    path = write(tmp_path / "all_gather_perf.txt", flat)
    out = tmp_path / "o.json"
    one_line_error(run_cli("calibrate", "collectives", "--nccl-tests", path, "--out", out, "--tier", "intra_node"),
                   "fit[all_gather, n=8, intra_node]", "the time does not grow with the message size")
    assert not out.exists()


def test_a_latency_bound_small_size_regime_is_kept_as_t_equals_alpha(tmp_path):
    from shardplan.calibrate.collectives import Sample, fit_link
    from shardplan.calibrate.overlay import load_calibration, write_calibration

    # 1 KiB .. 512 KiB: a flat 50 us (latency-bound); 1 MiB .. 64 MiB: 20 us + S·f / 100 GB/s
    f = 0.5  # all_gather on 2 ranks: (n-1)/n
    sizes = [2**k for k in range(10, 27)]
    times = [50e-6 if s < 2**20 else 20e-6 + s * f / 100e9 for s in sizes]
    fit = fit_link([Sample("all_gather", 2, s, t) for s, t in zip(sizes, times)])
    flat, line = fit.segments
    # exact data, exact fit (rel 1e-9): before, the flat regime was B = 1e30 B/s
    assert flat.bandwidth_bytes_per_s is None and flat.alpha_s == pytest.approx(50e-6, rel=1e-9)
    assert line.bandwidth_bytes_per_s == pytest.approx(100e9, rel=1e-9) and line.alpha_s == pytest.approx(20e-6, rel=1e-9)
    write_calibration(tmp_path / "cal.json", links=[fit])
    assert load_calibration(tmp_path / "cal.json").links[0].segments[0].bandwidth_bytes_per_s is None
    res = run_cli("fit", "--model", "llama-3.1-8b", "--gpus", "2xh100-sxm", "--strategy", "full_shard",
                  "--calibration", tmp_path / "cal.json")
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output


def test_overlay_with_an_absurd_bandwidth_is_refused_on_load(tmp_path):
    cal = {"schema": "shardplan.calibration/1", "created": "x", "links": [
        {"tier": "intra_node", "op": "all_gather", "world_size": 2, "r2_log": 1.0, "max_rel_err": 0.0, "n_points": 3,
         "segments": [{"min_bytes": 0, "max_bytes": 1, "alpha_s": 1e-5, "bandwidth_bytes_per_s": 1e30}]}]}
    path = write(tmp_path / "cal.json", cal)
    one_line_error(run_cli("fit", "--model", "llama-3.1-8b", *FIT, "--calibration", path),
                   "bandwidth_bytes_per_s=1e+30", "less than or equal to 100000000000000")


@pytest.mark.parametrize("content, reason", [
    ('[{"op": "all_gather", "world_size": 2, "size_bytes": 1024, "time_s": NaN}]', "NaN is not a JSON number"),
    ('[{"op": "all_gather", "world_size": 2, "size_bytes": 1024, "time_s": 1e400}]', "overflows a 64-bit float"),
    ('[{"op": "all_gather", "world_size": 2, "size_bytes": 1024, "time_s": -1}]', "time_s=-1"),
    ('[{"op": "all_gather", "world_size": "2", "size_bytes": 1024, "time_s": 1}]', "world_size='2'"),
    ('[[1]]', "valid dictionary"),
    ('{"op": "all_gather"}', "expected a non-empty JSON list"),
    ('[]', "expected a non-empty JSON list"),
])
def test_samples_files_are_validated(tmp_path, content, reason):
    # before: Sample(**x) raised TypeError on a list, accepted NaN and negative times
    path = write(tmp_path / "samples.json", content)
    one_line_error(run_cli("calibrate", "collectives", "--samples", path, "--out", tmp_path / "o.json"), reason)


@pytest.mark.parametrize("line, named", [
    ('[1, 2]', "not a JSON record (expected an object per line)"),
    ('{"key": "a", "status": "ok"}', "config=None: Field required"),
    ('{"key": "a", "status": "ok", "config": [1]}', "valid dictionary or instance of RunConfig"),
    ('{"key": "a", "status": "ok", "config": {}, "measured": {"params_sharded_bytes": "NaN"}}', "measured.params_sharded_bytes"),
    ('{"key": "a", "status": "ok", "config": {"world_size": 0}, "measured": {}}', "config.world_size=0"),
])
def test_calibrate_compare_on_malformed_records(tmp_path, line, named):
    # before: KeyError 'config' / TypeError / AttributeError tracebacks
    path = write(tmp_path / "runs.jsonl", line + "\n")
    one_line_error(run_cli("calibrate", "compare", path), "runs.jsonl", named)


@pytest.mark.parametrize("option", ["--min-r2-log", "--max-rel-err"])
def test_a_nan_quality_threshold_is_refused(tmp_path, option):
    # before: NaN compares false with everything, so `r2 < nan` never refused a fit
    res = run_cli("calibrate", "collectives", "--nccl-tests", NCCL, "--out", tmp_path / "o.json",
                  "--tier", "intra_node", option, "nan")
    one_line_error(res, option.lstrip("-").replace("-", "_") + "=nan", "finite number")


def test_nan_threshold_through_the_api():
    from shardplan.calibrate.collectives import Sample, fit_link
    from shardplan.support.errors import ShardplanError

    samples = [Sample("all_gather", 2, 2**k, 1e-5 + 2**k / 1e9) for k in range(10, 20)]
    with pytest.raises(ShardplanError, match="min_r2_log"):
        fit_link(samples, min_r2_log=float("nan"))


# --- plan files (export) ---------------------------------------------------------------------------
@pytest.mark.parametrize("plan, named", [
    ({"config": [1]}, "plan.config='{...}': must be a JSON object"),
    ({"cluster": "x"}, "plan.cluster='x': must be a JSON object"),
    ({"model": [1]}, "plan.model='{...}': must be a string or a JSON object"),
    ({"model": {"name": ["x"]}}, "model.name=['x']: must be a string"),
    ({"model": "llama-3.1-8b", "cluster": {"nodes": "abc"}}, "cluster.nodes='abc'"),
    ({"model": "llama-3.1-8b", "cluster": {"nodes": 1e300}}, "cluster.nodes=1e+300: out of range [1, 1,000,000]"),
    ({"model": "llama-3.1-8b", "per_gpu": {"breakdown": {"a": "x"}}}, "breakdown.a='x'"),
    ({"model": "llama-3.1-8b", "peak_allocated_bytes": "1e5"}, "peak_allocated_bytes='1e5'"),
    ({"model": "llama-3.1-8b", "fits": "no"}, "plan.fits='no': must be true or false"),
])
def test_plan_records_of_the_wrong_shape(tmp_path, plan, named):
    # before: TypeError / ValueError tracebacks from dict() and int(); 1e300 nodes and "fits": "no" exported
    path = write(tmp_path / "plan.json", plan)
    one_line_error(run_cli("export", path, "--to", "fsdp2"), named)


def test_one_size_repeated_is_not_a_fit(tmp_path):
    # before: three samples of one size "fitted" a curve (and a link slope) through a single point
    from shardplan.calibrate.compute import MatmulSample, fit_efficiency
    from shardplan.support.errors import ShardplanError

    with pytest.raises(ShardplanError, match="3 distinct matmul sizes"):
        fit_efficiency([MatmulSample("float32", 64, 1e-4 * (1 + k / 10)) for k in range(3)])
    samples = [{"op": "all_gather", "world_size": 2, "size_bytes": 4096, "time_s": 1e-5 + k * 1e-7} for k in range(5)]
    path = write(tmp_path / "samples.json", samples)
    one_line_error(run_cli("calibrate", "collectives", "--samples", path, "--out", tmp_path / "o.json"),
                   "3 distinct positive (size, time) points")
