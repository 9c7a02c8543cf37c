"""Each shared quantity has one home, and every caller agrees with it (issue 13, item 1)."""

from dataclasses import fields
from pathlib import Path

import pytest
from helpers import DEFAULT_KNOBS, columns

from shardplan.formulas import columns as columns_module
from shardplan.formulas import model_states as ms
from shardplan.formulas.columns import Columns, model_values
from shardplan.formulas.comm import ring_factor
from shardplan.formulas.load import model_load_bytes
from shardplan.formulas.throughput import attention_forward_flops_per_token, flops_per_token, model_flops_per_token
from shardplan.inputs import strategy as st
from shardplan.inputs.model import block_linear_params
from shardplan.inputs.models import get_model, model_profiles
from shardplan.support.errors import ShardplanError
from shardplan.support.names import choose, lookup

DATA = Path(__file__).parent / "data"


# --- names -------------------------------------------------------------------------------------
@pytest.mark.parametrize("typed,expected", [("FSDP2", "fsdp2"), ("Deep-Speed", "deepspeed"), (" trainer ", "trainer")])
def test_export_formats_follow_the_one_name_rule(typed, expected):
    from shardplan.export import export_option, format_name

    assert format_name(typed) == expected
    assert export_option(typed) == (expected, None)


def test_unknown_export_format_is_one_error_naming_the_field():
    from shardplan.export import export_option, format_name

    with pytest.raises(ShardplanError, match="^to=.fsdp3.: unknown format"):
        format_name("fsdp3")
    with pytest.raises(ShardplanError, match="^export=.fsdp3=out.py.: unknown format"):
        export_option("fsdp3=out.py")


def test_lookup_is_choose_without_the_error():
    names = ("all_gather", "reduce_scatter", "all_reduce")
    assert lookup("All-Gather", names) == choose("All-Gather", names, "op") == "all_gather"
    assert lookup("allreduce", names) == "all_reduce"
    assert lookup("broadcast", names) is None


def test_nccl_tests_op_names_follow_the_one_name_rule():
    from shardplan.calibrate.collectives import parse_nccl_tests

    text = (DATA / "nccl_tests_sample_all_gather_perf.txt").read_text()
    samples = parse_nccl_tests(text)
    assert [s.op for s in parse_nccl_tests(text, op="All-Gather")] == [s.op for s in samples] == ["all_gather"] * len(samples)


def test_model_name_variant_words_follow_the_one_name_rule():
    from shardplan.inputs.model_names import base_name

    # "INSTRUCT" and "Meta" dropped whatever their case, as names.normalize compares them
    assert base_name("meta-llama/META-Llama-3.1-8B-INSTRUCT") == "Llama-3.1-8B"


# --- ring factor ---------------------------------------------------------------------------------
def test_calibration_bus_bandwidth_uses_the_formulas_ring_factor():
    from shardplan.calibrate.collectives import Sample

    # nccl-tests doc/PERFORMANCE.md: busbw = algbw·(n−1)/n for all-gather, ·2(n−1)/n for all-reduce
    ag = Sample("all_gather", 8, 2**30, 0.01)
    ar = Sample("all_reduce", 8, 2**30, 0.01)
    assert ag.busbw_bytes_per_s == pytest.approx(2**30 / 0.01 * 7 / 8, rel=1e-12)
    assert ar.busbw_bytes_per_s == pytest.approx(2**30 / 0.01 * 14 / 8, rel=1e-12)
    assert float(ring_factor("reduce_scatter", 8)) == 7 / 8


# --- trainable parameters --------------------------------------------------------------------------
def test_trainable_params_full_and_lora():
    spec = get_model("llama-2-7b")
    full = columns("llama-2-7b")
    lora = columns("llama-2-7b", method=st.LORA, lora_params=model_values(spec, 8, "qv")["lora_params"])
    assert int(ms.trainable_params(full)) == spec.total_params
    # PEFT: Llama-2-7B r=8 on q_proj, v_proj = 4,194,304 trainable parameters
    assert int(ms.trainable_params(lora)) == 4_194_304
    assert float(ms.trainable_fraction(full)) == 1.0
    assert float(ms.trainable_fraction(lora)) == pytest.approx(4_194_304 / spec.total_params, rel=1e-15)


def test_fit_reports_the_same_trainable_params():
    from shardplan.inputs.config import TrainingConfig
    from shardplan.inputs.hardware import parse_gpus
    from shardplan.planning.fit import evaluate

    r = evaluate(get_model("llama-2-7b"), parse_gpus("1x80GB"), TrainingConfig(method="lora", lora_rank=8, lora_targets="qv",
                                                                             strategy="single"))
    assert r.model["trainable_params"] == 4_194_304


# --- 4-bit base ----------------------------------------------------------------------------------
def test_nf4_mean_bytes_per_param_is_the_packed_part_plus_the_quant_state():
    # a 2**24-element tensor: packed 0.5 B/weight + quant_state (uint8 absmax per 64, fp32 nested per
    # 256 blocks, 1,092 B per tensor) averages to Dettmers et al. 2023 §3's 0.5 + 1/64 + 4/(64·256)
    e = 2**24
    per_weight = (ms.NF4_PACKED_BYTES_PER_PARAM * e + int(ms.nf4_quant_state_bytes(e, 1)) - ms.NF4_PER_TENSOR_BYTES) / e
    assert per_weight == ms.NF4_BYTES_PER_PARAM == 0.5 + 1 / 64 + 4 / (64 * 256)


def test_quantized_base_bytes_is_what_model_states_and_loading_count():
    spec = get_model("llama-2-7b")
    c = columns("llama-2-7b", method=st.QLORA, lora_params=model_values(spec)["lora_params"])
    q = block_linear_params(spec)
    assert int(ms.quantized_base_bytes(c)) == -(-q // 2)  # NF4 packs two weights per byte
    assert int(model_load_bytes(c)) == -(-q // 2) + 2 * (spec.total_params - q)
    assert int(ms.quantized_base_bytes(columns("llama-2-7b"))) == 0


# --- FSDP1 padding ---------------------------------------------------------------------------------
def test_fsdp1_padding_per_unit():
    c = columns("llama-2-7b", engine=st.FSDP1)
    spec = get_model("llama-2-7b")
    n = 6  # 202,383,360 block parameters = 6·33,730,560 exactly; the root's 262,148,096 leave 4
    assert int(ms.fsdp1_shard_elements(c, n, "root")) == -(-spec.root_params // n) == 43_691_350
    assert int(ms.fsdp1_unit_elements(c, n, "root")) == 6 * 43_691_350
    assert int(ms.fsdp1_unit_elements(c, n, "block")) == spec.largest_block_params
    assert int(ms.fsdp1_shard_elements(c, n)) == 43_691_350 + 32 * spec.largest_block_params // n
    assert int(ms.fsdp1_shard_elements(c, n, "blocks")) == 32 * spec.largest_block_params // n


def test_pad_groups_defined_once():
    assert columns_module.PAD_GROUPS is ms.PAD_GROUPS
    assert sum(f.name.startswith("pad_dim0_") for f in fields(Columns)) == ms.PAD_GROUPS


# --- FLOPs per token -----------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", model_profiles(), ids=lambda s: s.name)
def test_sweep_flops_use_the_model_specs_matmul_params(spec):
    # one definition: the forward matmul FLOPs of a sweep are 2·ModelSpec.matmul_params_per_token
    # exactly (throughput rebuilt N from widths before, 18.8 % high for DeepSeek-V3's MLA)
    c = Columns.build(**model_values(spec), **DEFAULT_KNOBS)
    assert int(c.matmul_params) == spec.matmul_params_per_token
    assert float(flops_per_token(c)["fwd_matmul"]) == 2.0 * spec.matmul_params_per_token
    full = float(attention_forward_flops_per_token(c, causal=False))
    assert full == spec.attention_flops_per_token(int(c.seq_len))
    assert float(attention_forward_flops_per_token(c)) == full / 2
    assert float(model_flops_per_token(c)) == 6 * spec.matmul_params_per_token + 3 * full / 2


def test_deepseek_v2_lite_matmul_params_by_hand():
    # DeepSeek-V2-Lite config.json: h 2048, 27 layers (first dense, I = 10944), 16 heads, no q_lora,
    # kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128; 64 routed experts (6 active) + 2 shared of 1408; V 102400
    h, L, heads = 2048, 27, 16
    attn = h * heads * 192 + h * (512 + 64) + 512 * heads * (128 + 128) + heads * 128 * h
    norms = 2 * h + 512
    dense = attn + 3 * h * 10944 + norms
    moe = attn + 3 * h * 1408 * (6 + 2) + 64 * h + norms
    assert get_model("deepseek-v2-lite").matmul_params_per_token == dense + (L - 1) * moe + 102400 * h


# --- the frozen base's float dtype -------------------------------------------------------------------
@pytest.mark.parametrize("precision,a", [(st.FP32, 4), (st.BF16_MIXED, 2)])
def test_frozen_base_is_gathered_in_the_dtype_it_is_stored_in(precision, a):
    # model_states stores a LoRA base sharded in the compute dtype (fp32 under fp32 precision);
    # FSDP gathers a parameter in its own dtype when no mixed-precision policy casts it, so the
    # unsharded root and block are a bytes per element too (they were 2 under fp32 before)
    from shardplan.formulas.buffers import fsdp_units

    spec = get_model("llama-2-7b")
    c = columns("llama-2-7b", method=st.LORA, precision=precision, lora_params=model_values(spec)["lora_params"])
    u = fsdp_units(c, 8)
    assert int(u["root_unsharded"]) == a * int(ms.padded_unit_elements(c, 8, "root"))
    assert int(u["block_unsharded"]) == a * int(ms.padded_unit_elements(c, 8, "block"))
    assert int(ms.model_states(c)["params"]) == pytest.approx(
        (a * spec.total_params + 4 * model_values(spec)["lora_params"]) / 8, rel=1e-6)


def test_qlora_block_norms_take_the_stated_dtype():
    spec = get_model("qwen2.5-7b")  # q/k/v biases: bitsandbytes keeps them 16-bit either way
    c = columns("qwen2.5-7b", method=st.QLORA)
    blocks = spec.total_params - spec.root_params
    norms = spec.num_layers * spec.block_norm_params
    diff = float(ms.qlora_block_bytes_per_param(c, 4) - ms.qlora_block_bytes_per_param(c, 2))
    assert diff == pytest.approx(2 * norms / blocks, rel=1e-12)
