"""The questions newcomers type (issue 22 items 6-11): filler words, count words, GPUs without a
count, consumer cards, capacities without a card, conflicting words, and the models people
fine-tune today. Each answer is checked against what the words mean, not against a snapshot."""

from __future__ import annotations

import pytest

from shardplan.cli.app import main
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import CAPACITY_DEFAULTS, get_gpu, gpu_without_count, parse_gpus
from shardplan.inputs.models import resolve_model
from shardplan.inputs.query import GRAMMAR, parse_query
from shardplan.planning.fit import fewest_gpus_that_fit, fit
from shardplan.support.errors import ShardplanError


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- the must-show questions answer (exit 0) --------------------------------------------------------
MUST_SHOW = [
    "will llama 3 8b fit on a 4090 with lora",
    "llama-3.2-1b on 1x3060 lora",
    "llama 3 8b on 1x7900xtx qlora",
    "llama-3.1-70b on h100 full",
    "qwen2.5 32b on 2x h100 qlora",
    "gemma 2 27b on 4x L40S",
]


@pytest.mark.parametrize("question", MUST_SHOW)
def test_the_questions_people_type_are_answered(capsys, question):
    code, out, err = run(capsys, "fit", question)
    assert code == 0 and not err, err
    assert any(v in out for v in ("FITS", "DOES NOT FIT", "TIGHT")), out  # a verdict line, not an error


# --- the words ----------------------------------------------------------------------------------------
def test_filler_and_count_words_are_read_as_meant():
    q = parse_query("will llama 3 8b fit on a 4090 with lora?")
    assert (q.model, q.gpus, q.options) == ("llama 3 8b", "1 4090", {"method": "lora"})
    q = parse_query("can i train qwen2.5 7b on two 3090 using qlora")
    assert (q.model, q.gpus, q.options) == ("qwen2.5 7b", "2 3090", {"method": "qlora"})
    assert parse_query("llama 3 8b on 4090 full finetune").options == {"method": "full"}
    assert parse_gpus(q.gpus).world_size == 2


@pytest.mark.parametrize("text, first, second", [
    ("8b on 2x4090 zero3 ddp", "zero3", "ddp"),
    ("8b on 2x4090 lora qlora full", "lora", "qlora"),
    ("8b on 2x4090 seq 4096 seq 8192", "seq 4096", "seq 8192"),
])
def test_words_that_set_one_knob_twice_are_an_error_naming_both(text, first, second):
    with pytest.raises(ShardplanError) as err:
        parse_query(text)
    assert first in str(err.value) and second in str(err.value)


def test_a_repeated_word_with_one_meaning_is_no_conflict():
    assert parse_query("8b on 2x4090 zero3 fsdp lora lora").options == {"strategy": "full_shard", "method": "lora"}


def test_seq_in_k_counts_1024s_and_says_so():
    q = parse_query("8b on 1x4090 seq 32k")
    assert q.options["seq_len"] == 32 * 1024
    assert any("32,768" in n for n in q.notes)
    assert parse_query("8b on 1x4090 seq 32000").options["seq_len"] == 32000


def test_an_unrecognised_query_shows_the_grammar_in_one_short_line(capsys):
    for text in ("hello", "70B on 4x24GB wibble"):
        code, out, err = run(capsys, "fit", text)
        assert code == 2 and GRAMMAR in err and len(err.splitlines()) == 1 and len(err.rstrip("\n")) <= 100, err


# --- the cards -----------------------------------------------------------------------------------------
# (profile, nominal GB, dense FP16/BF16 tensor TFLOP/s with FP32 accumulate, GB/s): the figures the
# profiles cite (NVIDIA Ampere GA102 / Ada whitepapers, RTX A-series datasheets, AMD's RX 7900 XTX page)
CARDS = [
    ("rtx3060", 12, 25.4, 360), ("rtx3080", 10, 59.5, 760), ("rtx3080-12gb", 12, 61.3, 912),
    ("rtx4060ti", 16, 44.1, 288), ("rtx4070", 12, 58.3, 504), ("rtx4070ti", 12, 80.2, 504),
    ("rtx4080", 16, 97.5, 716.8), ("rtx-a4000", 16, 76.7, 448), ("rtx-a5000", 24, 111.1, 768),
    ("rx7900xtx", 24, 122.8, 960),
]


@pytest.mark.parametrize("name, gb, tflops, gbs", CARDS, ids=[c[0] for c in CARDS])
def test_consumer_cards_hold_their_published_figures(name, gb, tflops, gbs):
    gpu = get_gpu(name)
    assert gpu.nominal_memory_gb == gb
    assert gpu.peak_flops["bf16"] == pytest.approx(tflops * 1e12, rel=1e-3)
    assert gpu.memory_bandwidth_bytes_per_s == pytest.approx(gbs * 1e9, rel=1e-3)
    # the driver exposes a little less than the nominal GiB, never more, never under 90 %
    assert 0.9 * gb * 2**30 < gpu.memory_bytes < gb * 2**30
    assert name in CAPACITY_DEFAULTS[gb]


@pytest.mark.parametrize("text, gpu, count", [
    ("1x3060", "rtx3060", 1), ("1x7900xtx", "rx7900xtx", 1), ("1x12GB", "rtx3060", 1), ("2x rtx 4080", "rtx4080", 2),
    ("1xa5000", "rtx-a5000", 1), ("4x4060ti", "rtx4060ti", 4), ("2x8xa100-80gb", "a100-80gb", 16),
])
def test_card_phrases_parse(text, gpu, count):
    cluster = parse_gpus(text)
    assert (cluster.gpu.name, cluster.world_size) == (gpu, count)


def test_a_capacity_no_card_stands_for_is_refused_not_answered_for_another(capsys):
    code, out, err = run(capsys, "fit", "8b on 1x64GB lora")
    assert code == 2 and "no GPU profile stands for" in err and "MI250X" not in err and "Apple" in err
    assert parse_gpus("1xmi250x").gpu.name == "mi250x"  # named, the card still answers


@pytest.mark.parametrize("gpus", ["1xmps", "mps", "2xm2", "1x apple"])
def test_apple_silicon_is_not_supported_in_one_line(capsys, gpus):
    code, out, err = run(capsys, "fit", f"llama-3.2-1b on {gpus} lora")
    assert code == 2 and "not supported" in err and len(err.splitlines()) == 1, err


# --- how many GPUs ---------------------------------------------------------------------------------------
def test_a_gpu_without_a_count_gets_the_fewest_that_fit(capsys):
    code, out, err = run(capsys, "fit", "llama-3.1-70b on h100 full", "--strategy", "full_shard")
    assert code == 0, err
    spec, node = resolve_model("llama-3.1-70b").spec, parse_gpus("8xh100")
    config = TrainingConfig(method="full", strategy="full_shard")
    fewest = fewest_gpus_that_fit(spec, node, config)
    assert fewest is not None and f"full_shard {fewest}" in out and f"shown on {fewest}" in out
    shown = parse_gpus(f"{fewest}xh100")
    assert fit(spec, shown, config, ["full_shard"])[0].fits
    # one node fewer (or half the GPUs within a node) does not fit: it is the fewest the ladder has
    fewer = fewest - 8 if fewest > 8 else fewest // 2
    assert not fit(spec, parse_gpus(f"{fewer}xh100"), config, ["full_shard"])[0].fits


def test_one_card_that_fits_is_answered_on_one(capsys):
    code, out, err = run(capsys, "fit", "llama-3.2-1b on 4090 lora")
    assert code == 0 and "single 1" in out and "on 1xrtx4090" in out, out
    assert gpu_without_count("rtx 4090").name == "rtx4090" and gpu_without_count("8xh100") is None


def test_plan_without_a_count_says_how_to_ask(capsys):
    code, out, err = run(capsys, "plan", "llama-3.1-8b on h100")
    assert code == 2 and "no GPU count" in err and "8xh100" in err


# --- the models ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("typed, display", [
    ("qwen2.5 0.5b", "Qwen2.5-0.5B"), ("qwen2.5 1.5b", "Qwen2.5-1.5B"), ("qwen2.5 3b", "Qwen2.5-3B"),
    ("qwen2.5 14b", "Qwen2.5-14B"), ("qwen2.5 32b", "Qwen2.5-32B"), ("Qwen/Qwen2.5-72B-Instruct", "Qwen2.5-72B"),
    ("qwen3 235b a22b", "Qwen3-235B-A22B"), ("qwen3-30b-a3b", "Qwen3-30B-A3B"),
    ("gemma 2 2b", "Gemma-2-2B"), ("gemma 2 27b", "Gemma-2-27B"), ("google/gemma-2-27b-it", "Gemma-2-27B"),
    ("gemma-3-27b", "Gemma-3-27B"), ("mixtral-8x22b", "Mixtral-8x22B-v0.1"), ("mistral-7b-v0.3", "Mistral-7B-v0.3"),
    ("olmo-2-1b", "OLMo-2-1B"), ("olmo-2-13b", "OLMo-2-13B"), ("olmo-2-32b", "OLMo-2-32B"),
    ("HuggingFaceTB/SmolLM2-1.7B-Instruct", "SmolLM2-1.7B"), ("smollm-135m", "SmolLM2-135M"),
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "Qwen2.5-32B"), ("deepseek-r1-distill-llama-8b", "Llama-3.1-8B"),
    ("phi-4", "Phi-4"),
])
def test_models_people_fine_tune_today_resolve(typed, display):
    assert resolve_model(typed).spec.display_name == display


# --- plan answers the method asked ---------------------------------------------------------------------
def test_plan_ranks_full_fine_tuning_when_no_method_is_named(capsys):
    code, out, err = run(capsys, "plan", "llama-3.1-70b on 4x8xh100-sxm seq 4096", "--global-batch-tokens", "4M",
                         "--json")
    assert code == 0, err
    import json
    result = json.loads(out)
    assert result["method"] == "full" and result["plans"], "full fine-tuning fits 32 H100s at seq 4096"
    assert {p["method"] for p in result["plans"]} == {"full"}
    # LoRA and QLoRA were searched too, and are shown apart (one best plan each), never ranked above
    assert {p["method"] for p in result["other_methods"]} == {"lora", "qlora"}
    assert result["method_fitting"] <= result["fitting"]
    code, text, _ = run(capsys, "plan", "llama-3.1-70b on 4x8xh100-sxm seq 4096", "--global-batch-tokens", "4M")
    import re
    ranked = text.split("If you would accept")[0]
    methods = re.findall(r"^\d+=?\s+(full|lora|qlora)\s", ranked, re.MULTILINE)  # the ranked method column
    assert methods and set(methods) == {"full"} and "If you would accept LoRA/QLoRA" in text


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_lora_mfu_counts_the_arithmetic_lora_does(method):
    # frozen base: forward 2N + input gradients 2N, no weight gradients; adapters 6·N_lora (flops_per_token)
    from helpers import DEFAULT_KNOBS

    from shardplan.formulas.columns import Columns, model_values
    from shardplan.formulas.throughput import attention_forward_flops_per_token, flops_per_token, model_flops_per_token
    from shardplan.inputs import strategy as st

    spec = resolve_model("llama-3.1-8b").spec
    full = Columns.build(**model_values(spec), **DEFAULT_KNOBS)
    peft = Columns.build(**model_values(spec), **{**DEFAULT_KNOBS, "method": st.METHODS.index(method)})
    n, attention = spec.matmul_params_per_token, float(attention_forward_flops_per_token(peft))
    assert float(model_flops_per_token(peft)) == pytest.approx(4 * n + 6 * float(peft.lora_params) + 3 * attention)
    assert float(model_flops_per_token(full)) == pytest.approx(6 * n + 3 * attention)
    # MFU's numerator is what the step computes without recompute (HFU's, AC none): never above it
    f = flops_per_token(peft)
    assert float(model_flops_per_token(peft)) == pytest.approx(float(sum(f[k] for k in ("fwd_matmul", "bwd_matmul",
                                                                                          "fwd_attention"))
                                                                     + 3 * attention - float(f["fwd_attention"])))


# --- repeated options, readable answers --------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["fit", "8b on 1x4090", "--seq-len", "4096", "--seq-len", "8192"],
    ["plan", "8b on 8xh100", "--method", "lora", "--method=full"],
    ["fit", "8b on 1x4090", "--checkpoint-wrapper", "--no-checkpoint-wrapper"],
])
def test_an_option_given_twice_is_an_error_not_last_one_wins(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and "given twice" in err and len(err.splitlines()) == 1, err


def _lines(text: str) -> list[str]:
    return text.rstrip("\n").splitlines()


@pytest.mark.parametrize("question", ["llama-3.1-70b on 4x24GB", "gemma 2 27b on 4x L40S", "405b on 8xh100",
                                      "llama-3.1-8b on 2x4090"])
def test_a_no_fit_answer_is_short_and_detail_has_the_rest(capsys, monkeypatch, question):
    monkeypatch.setenv("COLUMNS", "100")
    code, out, err = run(capsys, "fit", question)
    assert code == 0 and "DOES NOT FIT" in out and "--detail" in out
    assert len(_lines(out)) <= 45 and max(map(len, _lines(out))) <= 100
    code, detail, err = run(capsys, "fit", question, "--detail")
    assert code == 0 and len(_lines(detail)) > len(_lines(out)) and "peak reserved" in detail


def test_fit_help_is_grouped_and_short(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    code, out, err = run(capsys, "fit", "--help")
    assert code == 0 and len(_lines(out)) <= 80
    for panel in ("What to ask", "Training", "Stack", "Cluster and time", "Output"):
        assert f"─ {panel} " in out, panel


def test_hardware_show_is_a_table_and_json_on_request(capsys):
    import json
    code, out, err = run(capsys, "hardware", "show", "t4")
    assert code == 0 and _lines(out)[0].split() == ["field", "value", "source"]
    assert "fp16 65.0" in out and "TFLOP/s" in out  # T4 has no bf16: its fp16 rate is shown
    code, out, err = run(capsys, "hardware", "show", "t4", "--json")
    assert code == 0 and json.loads(out)["peak_flops"]["fp16"] == 65e12
    code, out, err = run(capsys, "hardware")
    rows = {line.split()[0]: line for line in _lines(out) if line.startswith(("t4 ", "v100-16gb "))}
    assert "65 (fp16)" in rows["t4"] and "125 (fp16)" in rows["v100-16gb"]
