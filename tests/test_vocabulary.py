"""One vocabulary (shardplan/inputs/vocabulary.py): every query word equals its --option twin, the help
lists exactly the accepted words, 'bf16' follows the stack, GPU phrases with spaces, and plan
speaks the same query and exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer.main

from shardplan.cli.app import app, main
from shardplan.export import read_back
from shardplan.inputs import vocabulary as vocab
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.query import parse_query
from shardplan.support.errors import ShardplanError

BASE = "8b on 8xh100-sxm"
ROOT = Path(__file__).resolve().parents[1]


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _option_args(values: dict) -> list[str]:
    """The --option twin of a query phrase's knob values."""
    args = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False:
            args.append("--no-" + name.replace("_", "-"))
        else:
            args += [flag, str(value)]
    return args


def _answer(capsys, *argv) -> tuple[int, object]:
    """(exit code, the --json config) or (exit code, the one error line)."""
    code, out, err = run(capsys, "fit", *argv, "--json")
    if code:
        return code, err.strip()
    return code, json.loads(out)["config"]


PHRASES = vocab.query_words()


@pytest.mark.parametrize("phrase,values", PHRASES, ids=[p for p, _ in PHRASES])
def test_every_query_word_equals_its_option(capsys, phrase, values):
    """For every knob and every accepted value/alias: the query word and the option give the same
    TrainingConfig (or the same one-line error, e.g. zero1 with the fsdp2 engine)."""
    # one strategy keeps each call a one-configuration fit; strategy words bring their own
    fixed = [] if "strategy" in values else ["--strategy", "full_shard"]
    by_query = _answer(capsys, f"{BASE} {phrase}", *fixed)
    by_option = _answer(capsys, BASE, *_option_args(values), *fixed)
    assert by_query == by_option
    if by_query[0] == 0:  # the word took effect: each knob holds the canonical name of its word
        config = by_query[1]
        for name, value in values.items():
            if name in vocab.KNOBS and vocab.knob(name).aliases and name != "offload":
                expected = vocab.canonical(name, value, stack=config["stack"], engine=config["engine"])
                assert config[name] == expected, (name, value)


def test_the_table_covers_every_knob_value_and_alias():
    phrases = {p for p, _ in PHRASES}
    for k in vocab.KNOBS.values():
        for word in k.words():
            assert f"{k.keys[0]} {word}" in phrases, (k.field, word)
    assert len(PHRASES) > 200  # 13 knobs x their words x their keys, flags, numbers


def _fit_help() -> dict[str, str]:
    command = typer.main.get_command(app).commands["fit"]
    return {p.name: p.help for p in command.params if getattr(p, "help", None)}


@pytest.mark.parametrize("field", list(vocab.KNOBS))
def test_help_lists_every_accepted_word_and_each_is_accepted(field):
    text = _fit_help()[field]
    k = vocab.knob(field)
    listed_names = text.split(": ", 1)[1].split(" (default")[0].split(";")[0].split(", ")
    aliases = re.search(r"aliases: (.*?)(?:;|$)", text)
    listed_aliases = [a.split(" = ")[0] for a in aliases.group(1).split(", ")] if aliases else []
    assert listed_names == list(k.names)
    assert listed_aliases == [a.word for a in k.aliases]
    for word in listed_names + listed_aliases:  # each listed word builds a configuration
        config = TrainingConfig(**{field: word})
        assert getattr(config, field) in k.names, (field, word)


# --- bf16 means what the stack means -------------------------------------------------------------
@pytest.mark.parametrize("stack,word,expected", [
    ("hf", "bf16", "bf16-mixed"),         # TrainingArguments(bf16=True): mixed precision
    ("hf", "fp16", "fp16-mixed"),
    ("torchtune", "bf16", "bf16-pure"),   # recipe configs dtype: bf16: the weights in bf16
    ("lightning", "bf16", "bf16-mixed"),  # Lightning: "bf16" -> "bf16-mixed"
    ("litgpt", "bf16-true", "bf16-pure"),
    ("torchtitan", "bf16", "bf16-mixed"),
    ("plain", "bf16", "bf16-mixed"),
])
def test_bf16_is_the_stacks_meaning_in_query_option_and_api(capsys, stack, word, expected):
    assert TrainingConfig(precision=word, stack=stack).precision == expected
    code, config = _answer(capsys, f"{BASE} {word} stack {stack}", "--strategy", "full_shard")
    assert code == 0 and config["precision"] == expected
    assert _answer(capsys, BASE, "--precision", word, "--stack", stack, "--strategy", "full_shard") == (code, config)


def test_a_mode_the_stack_refuses_is_a_one_line_error(capsys):
    with pytest.raises(ShardplanError, match="torchtune"):
        TrainingConfig(precision="fp16", stack="torchtune")
    code, out, err = run(capsys, "fit", BASE, "--precision", "fp16", "--stack", "torchtune")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "precision='fp16'" in err


def test_sweep_lists_take_the_vocabulary():
    import shardplan

    df = shardplan.sweep(models="llama-2-7b", strategies=["zero3", "hsdp"], offload="all", precision="bf16",
                         stack=["hf", "torchtitan"], lora_targets=["all", "all-linear"])
    assert set(df["strategy"].astype(str)) == {"full_shard", "hybrid_shard"}
    assert set(df["precision"].astype(str)) == {"bf16-mixed"} and set(df["offload"].astype(str)) == {"optimizer+params"}
    assert len(df) == 2 * 2  # "all" and "all-linear" are one LoRA target
    with pytest.raises(ShardplanError, match="bf16-mixed for hf, bf16-pure for torchtune"):
        shardplan.sweep(models="llama-2-7b", precision="bf16", stack=["hf", "torchtune"])


def test_options_accept_aliases_that_main_refused(capsys):
    code, config = _answer(capsys, BASE, "--offload", "all", "--strategy", "zero3", "--ac", "gc",
                           "--optimizer", "paged_adamw_8bit")
    assert code == 0
    assert (config["offload"], config["strategy"], config["ac"], config["optimizer"], config["paged_optimizer"]) == (
        "optimizer+params", "full_shard", "full", "adamw-8bit", True)


# --- GPU phrases with spaces ---------------------------------------------------------------------
@pytest.mark.parametrize("text,model,gpus,options", [
    ("llama 3 70b on 8 h100", "llama 3 70b", "8 h100", {}),
    ("70B on 4x24 GB", "70B", "4x24 GB", {}),
    ("8b on 1 x a10g", "8b", "1 x a10g", {}),
    ("8b on 1xa10g qlora", "8b", "1xa10g", {"method": "qlora"}),
    ("llama 3 70b on 8 h100 seq 4096 zero3", "llama 3 70b", "8 h100", {"seq_len": 4096, "strategy": "full_shard"}),
    ("70B on 2 x 8 x a100-80gb gc", "70B", "2 x 8 x a100-80gb", {"ac": "full"}),
    ("7b on 2 rtx 4090 lora", "7b", "2 rtx 4090", {"method": "lora"}),
])
def test_query_hands_the_whole_gpu_phrase_over(text, model, gpus, options):
    parsed = parse_query(text)
    assert (parsed.model, parsed.gpus, parsed.options) == (model, gpus, options)


def test_an_unknown_word_after_the_gpus_is_named():
    with pytest.raises(ShardplanError, match="wibble"):
        parse_query("70B on 4x24GB wibble")


# --- plan speaks the query ----------------------------------------------------------------------
def _plan(capsys, *argv) -> dict:
    code, out, err = run(capsys, "plan", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_plan_takes_the_query_and_searches_the_method(capsys):
    # full fine-tuning of 70B cannot fit 4x24 GB (~16 bytes/param of model state, ZeRO paper, SC'20, §3.1);
    # full fine-tuning is the method asked (none named), so nothing is ranked; the other methods are
    # searched and shown apart, where a QLoRA plan fits (issue 22 item 6)
    result = _plan(capsys, "70B on 4x24GB")
    assert result["plans"] == [] and result["method"] == "full" and result["methods"] == ["full", "lora", "qlora"]
    assert result["other_methods"] and {p["method"] for p in result["other_methods"]} <= {"lora", "qlora"}
    assert all(p["config"]["method"] == p["method"] for p in result["other_methods"])
    code, text, _ = run(capsys, "plan", "70B on 4x24GB", "--wide")
    assert code == 0 and "If you would accept" in text and "ranked: full, the method asked" in text
    asked = _plan(capsys, "70B on 4x24GB qlora")
    assert asked["plans"] and {p["method"] for p in asked["plans"]} == {"qlora"} and asked["other_methods"] == []
    fixed = _plan(capsys, "70B on 4x24GB", "--method", "full")
    assert fixed["plans"] == [] and fixed["methods"] == ["full"]


def test_plan_uses_fits_defaults_and_fixes_what_the_query_states(capsys):
    result = _plan(capsys, f"{BASE} zero3 lora")
    assert result["workload"]["seq_len"] == TrainingConfig().seq_len == 1024
    assert {(p["strategy"], p["method"]) for p in result["plans"]} == {("full_shard", "lora")}
    by_option = _plan(capsys, "llama-3.1-8b", "--gpus", "8xh100-sxm", "--strategy", "zero3", "--method", "lora")
    assert [p["config"] for p in by_option["plans"]] == [p["config"] for p in result["plans"]]
    tune = _plan(capsys, f"{BASE} bf16 torchtune lora")
    assert {p["config"]["precision"] for p in tune["plans"]} == {"bf16-pure"}


def test_plan_shows_each_configuration_once(capsys):
    # DeepSpeed runs shard_grad_op as stage 2 (= zero2) and no_shard as stage 0 (= ddp): planned once
    result = _plan(capsys, "llama-3.1-8b", "--gpus", "8xh100-sxm", "--engine", "deepspeed", "--method", "full",
                   "--top", "50")
    seen = {p["strategy"] for p in result["plans"]} | {r["strategy"] for r in result["rejected"]}
    assert "zero2" in seen and "ddp" in seen and not seen & {"shard_grad_op", "no_shard"}
    keys = [(p["strategy"], p["ac"], p["offload"], p["micro_batch"], p["shard_group_size"], p["sync_every_micro_batch"])
            for p in result["plans"]]
    assert len(keys) == len(set(keys))


# --- plan --json exports --------------------------------------------------------------------------
ROUND_TRIP_KEYS = ("strategy", "engine", "precision", "ac", "offload", "micro_batch", "grad_accum", "seq_len",
                   "method", "optimizer", "lora_rank", "shard_group_size", "world_size", "zero_stage")


@pytest.mark.parametrize("query,formats", [
    (f"{BASE} full_shard fsdp2 lora gc", ("fsdp2", "accelerate", "trainer", "torchrun")),
    (f"{BASE} full_shard fsdp1 full", ("fsdp1", "accelerate", "trainer", "torchrun")),
    (f"{BASE} zero3 deepspeed full", ("deepspeed", "accelerate", "trainer", "torchrun")),
])
def test_plan_json_exports_and_reads_back(capsys, tmp_path, query, formats):
    path = tmp_path / "plan.json"
    code, out, err = run(capsys, "plan", query, "--json")
    assert code == 0, err
    path.write_text(out)
    plan = json.loads(out)["plans"][0]
    expected = {**plan["config"], "world_size": 8, "zero_stage": 3}
    for fmt in formats:
        code, text, err = run(capsys, "export", str(path), "--to", fmt)
        assert code == 0, (fmt, err)
        got = read_back(fmt, text)
        compared = [k for k in ROUND_TRIP_KEYS if k in got]
        assert compared, fmt
        for key in compared:
            assert got[key] == expected[key], (fmt, key)
        assert got.get("sharding", plan["strategy"]) == plan["strategy"]


# --- the docs list every word ---------------------------------------------------------------------
def test_docs_vocabulary_is_the_generated_table():
    text = (ROOT / "docs" / "vocabulary.md").read_text()
    block = text.split("<!-- vocabulary:begin -->\n", 1)[1].split("<!-- vocabulary:end -->", 1)[0]
    assert block == vocab.document()
    for k in vocab.KNOBS.values():
        for word in k.words():
            assert f"`{word}`" in block, word


def test_a_stack_word_must_be_a_dependent_word_naming_a_precision(tmp_path):
    from shardplan.inputs.stacks import StackProfile, _check

    base = {"name": "hf", "display_name": "x", "description": "x", "defaults": {}}
    for words, named in (({"precision": {"bf16": {"value": "bf17", "source": "s"}}}, "bf17"),
                         ({"precision": {"fp8": {"value": "bf16-mixed", "source": "s"}}}, "fp8")):
        with pytest.raises(ShardplanError, match=named):
            _check(StackProfile.model_validate({**base, "words": words}), tmp_path / "hf.json")


@pytest.mark.parametrize("query, label, gpu", [
    ("8b on 8 h100", "8xh100-sxm", "h100-sxm"),        # a family name: the SXM variant, noted
    ("70B on 4x24 GB", "4x24GB", "rtx4090"),           # a capacity with a space: the 24 GB stand-in
    ("llama 3.1 8b on 1 x a10g lora", "1xa10g", "a10g"),
    ("meta-llama/Meta-Llama-3.1-8B-Instruct on 8×H100 zero3", "8xh100-sxm", "h100-sxm"),
    ("Llama-3.1-70B-Instruct on 2x8xh100 qlora", "2x8xh100-sxm", "h100-sxm"),
])
def test_the_names_users_type_reach_a_cluster_end_to_end(capsys, query, label, gpu):
    # the query split (this module) + parse_gpus' forms (hardware.py) + model names (model_names.py)
    code, out, err = run(capsys, "fit", query, "--strategy", "full_shard", "--json")
    assert code == 0, err
    answer = json.loads(out)
    assert answer["cluster"]["label"] == label and answer["gpu"]["name"] == gpu


def test_compile_query_words_set_the_knob_and_shorten_the_step(capsys):
    """`compile` is reachable from the query (its --compile switch is left out of --help), and the
    answer it changes is the step time: inductor's fusion leaves fewer element-wise bytes."""
    q = "llama-3.1-8b on 8xh100-sxm seq 8192 full_shard"
    assert parse_query(f"{q} compile").options["compile"] is True
    assert parse_query(f"{q} torch-compile").options["compile"] is True
    assert parse_query(f"{q} no-compile").options["compile"] is False
    assert "compile" not in parse_query(q).options
    steps = {}
    for word in ("no-compile", "compile"):
        code, out, err = run(capsys, "fit", f"{q} {word}", "--strategy", "full_shard",
                             "--global-batch-tokens", "4M", "--json")
        assert code == 0, err
        steps[word] = json.loads(out)["time"]["step_time_s"]
    assert steps["compile"] < steps["no-compile"]
