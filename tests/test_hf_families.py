"""The newer Hugging Face families: layouts, per-block MoE patterns, and what a config left unsaid.

Counts of the published configs are pinned in test_model_counts.py; here small variants of each
family (GQA, interleaved MoE, forced-dense blocks, no q LoRA, nested text_config) are built with
transformers on the meta device when it is installed, and the reader's bookkeeping is checked.
"""

import json
import math
import sys
from pathlib import Path

import pytest

from shardplan.cli.app import main
from shardplan.inputs.hf_config import spec_from_hf_config
from shardplan.inputs.model import block_linear_bias_params
from shardplan.inputs.models import get_model, resolve_model

TINY = dict(vocab_size=1000, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128)
VARIANTS = {
    "qwen3-tied": {"model_type": "qwen3", **TINY, "head_dim": 32, "tie_word_embeddings": True},
    "qwen3_moe-sparse": {"model_type": "qwen3_moe", **TINY, "num_experts": 8, "num_experts_per_tok": 2,
                         "moe_intermediate_size": 24, "decoder_sparse_step": 2, "mlp_only_layers": [3]},
    "gemma3-nested": {"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", **TINY, "head_dim": 16}},
    "gemma3_text": {"model_type": "gemma3_text", **TINY, "head_dim": 32, "tie_word_embeddings": False},
    "phi3-gqa": {"model_type": "phi3", **TINY, "pad_token_id": 0},
    "llama4-interleaved": {"model_type": "llama4", "text_config": {
        "model_type": "llama4_text", **TINY, "head_dim": 16, "intermediate_size_mlp": 160, "num_local_experts": 4,
        "num_experts_per_tok": 1, "interleave_moe_layer_step": 3}},
    "llama4-moe_layers": {"model_type": "llama4_text", **TINY, "head_dim": 16, "intermediate_size_mlp": 160,
                          "num_local_experts": 4, "moe_layers": [0, 2, 5]},
    "olmo2-gqa": {"model_type": "olmo2", **TINY},
    "granite-bias": {"model_type": "granite", **TINY, "attention_bias": True, "mlp_bias": True},
    "deepseek_v3-no-q-lora": {"model_type": "deepseek_v3", **TINY, "moe_intermediate_size": 24, "n_routed_experts": 8,
                              "num_experts_per_tok": 2, "n_shared_experts": 2, "first_k_dense_replace": 2,
                              "kv_lora_rank": 32, "q_lora_rank": None, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
                              "v_head_dim": 16, "n_group": 1, "topk_group": 1},
    "deepseek_v3-q-lora": {"model_type": "deepseek_v3", **TINY, "moe_intermediate_size": 24, "n_routed_experts": 8,
                           "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
                           "kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
                           "v_head_dim": 16, "n_group": 1, "topk_group": 1},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variants_count_like_transformers_on_meta(variant):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tools.hf_meta_counts import count

    row = count({"config": VARIANTS[variant], "source": "test variant"})
    spec = spec_from_hf_config(VARIANTS[variant], name=variant)
    assert spec.total_params == row["total_params"]
    assert spec.block_params == tuple(int(s) for s in _block_sizes(VARIANTS[variant]))
    assert spec.largest_module_params == row["largest_module_params_direct"]
    assert spec.active_params_per_token == row["active_params_per_token"]
    assert spec.tie_word_embeddings == row["lm_head_tied_to_embedding"]


def _block_sizes(config):
    import torch
    import transformers

    raw = dict(config)
    cfg = transformers.AutoConfig.for_model(raw.pop("model_type"), **raw).get_text_config()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return [sum(p.numel() for p in block.parameters()) for block in model.model.layers]


def test_moe_patterns_follow_transformers_rules():
    # Qwen3-MoE: (i + 1) % decoder_sparse_step == 0 and i not in mlp_only_layers -> blocks 1, 5
    sparse = spec_from_hf_config(VARIANTS["qwen3_moe-sparse"], name="x")
    assert sparse.moe_layer_mask == (False, True, False, False, False, True)
    # Llama 4: moe_layers = range(step - 1, L, step) -> blocks 2, 5; an explicit list wins
    assert spec_from_hf_config(VARIANTS["llama4-interleaved"], name="x").moe_layer_mask == \
        (False, False, True, False, False, True)
    assert spec_from_hf_config(VARIANTS["llama4-moe_layers"], name="x").moe_layer_mask == \
        (True, False, True, False, False, True)
    # Maverick (interleave_moe_layer_step 2): the odd blocks, 24 of 48
    maverick = get_model("llama-4-maverick")
    assert maverick.num_moe_blocks == 24 and maverick.moe_layer_mask[:4] == (False, True, False, True)


def test_fused_projections_are_one_tensor_each():
    phi = get_model("phi-3-mini")  # Phi3Attention.qkv_proj (9216, 3072), Phi3MLP.gate_up_proj (16384, 3072)
    shapes = phi.block_parameter_shapes()
    assert (9216, 3072) in shapes and (16384, 3072) in shapes and (3072, 3072) in shapes
    assert len([t for t in shapes if len(t) == 2]) == 4  # qkv_proj, o_proj, gate_up_proj, down_proj
    assert phi.largest_module_params == 98_500_608  # the embedding (hf_model_counts_new.csv)
    assert get_model("phi-3-medium").largest_module_params == 183_500_800  # gate_up_proj, 2 x 17920 x 5120


def test_qk_norms_are_norms_not_biases():
    qwen3, olmo2 = get_model("qwen3-8b"), get_model("olmo-2-7b")
    assert qwen3.attention_norm_params == 2 * 128  # q_norm, k_norm of head_dim
    assert olmo2.attention_norm_params == 4096 + 4096  # over the whole q and k projections
    for name in ("qwen3-8b", "olmo-2-7b", "gemma-3-27b", "deepseek-v3", "deepseek-v2-lite"):
        assert block_linear_bias_params(get_model(name)) == 0, name
    assert block_linear_bias_params(get_model("qwen2.5-7b")) == 28 * (3584 + 2 * 512)  # q/k/v biases


def test_defaults_the_file_left_out_are_listed():
    pytest.importorskip("transformers")
    spec = spec_from_hf_config({"model_type": "gemma3", "text_config": {
        "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34}}, name="x")
    assumed = " | ".join(spec.assumed)
    assert "text decoder only" in assumed
    assert "defaults (transformers " in assumed and "Gemma3TextConfig)" in assumed
    assert "num_attention_heads=8" in assumed and "vocab_size=262208" in assumed
    full = json.loads((Path(__file__).parent / "data" / "hf_configs_new.json").read_text())["models"]["DeepSeek-V3"]
    assert spec_from_hf_config(full["config"], name="x").assumed == ()


def test_without_transformers_the_defaults_say_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    spec = spec_from_hf_config({"model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912,
                                "num_hidden_layers": 26}, name="x")
    assert any("transformers is not installed" in a and "num_attention_heads=8" in a for a in spec.assumed)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err


def test_cli_reads_a_config_json_and_prints_what_it_assumed(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "qwen3", **TINY, "head_dim": 32}))
    code, out = run(capsys, "fit", "--model", str(path), "--gpus", "1xh100-sxm")
    assert code == 0, out
    assert "ASSUMED" in out and "tie_word_embeddings=False" in out
    path.write_text(json.dumps({"model_type": "encoderonly", "hidden_size": 64}))
    code, out = run(capsys, "fit", "--model", str(path), "--gpus", "1xh100-sxm")
    assert code == 2 and "model_type" in out and "Traceback" not in out


def test_models_list_shows_the_new_profiles(capsys):
    code, out = run(capsys, "models")
    assert code == 0
    for name in ("qwen3-8b", "qwen3-30b-a3b", "gemma-3-27b", "phi-4", "llama-3.2-1b", "mistral-nemo-12b", "deepseek-v3"):
        assert name in out


def test_fit_plan_export_end_to_end_for_a_new_family(capsys, tmp_path):
    code, out = run(capsys, "fit", "qwen3-8b on 1xh100-sxm lora", "--json")
    assert code == 0, out
    plan = tmp_path / "plan.json"
    plan.write_text(out[out.index("{"):out.rindex("}") + 1])
    code, out = run(capsys, "export", str(plan), "--to", "fsdp2")
    assert code == 0 and "Qwen3DecoderLayer" in out, out
    code, out = run(capsys, "plan", "qwen3-30b-a3b", "--gpus", "8xh100-sxm")
    assert code == 0 and "Qwen3-30B-A3B" in out


def test_bare_size_answers_unchanged_by_new_profiles():
    assert resolve_model("8B").spec.name == "llama-3.1-8b"
    assert math.isclose(get_model("qwen3-30b-a3b").active_params_per_token, 3_353_032_704)


MIXTRAL = {"model_type": "mixtral", **TINY, "num_local_experts": 6, "num_experts_per_tok": 2}
DEEPSEEK_V2 = {"model_type": "deepseek_v2", **TINY, "moe_intermediate_size": 20, "n_routed_experts": 6,
               "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 16,
               "q_lora_rank": None, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8}


@pytest.mark.parametrize("variant", ["qwen3-tied", "gemma3-nested", "gemma3_text", "phi3-gqa", "olmo2-gqa", "granite-bias",
                                     "qwen3_moe-sparse", "llama4-interleaved", "llama4-moe_layers",
                                     "deepseek_v3-q-lora", "mixtral", "deepseek_v2"])
@pytest.mark.parametrize("targets", ["all-linear", "attention"])
def test_lora_adapters_equal_peft(variant, targets):
    """PEFT on the transformers model: a fused qkv_proj / gate_up_proj is one adapted Linear; MoE
    blocks adapt the router and (families transformers 5 fused) the expert banks."""
    pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    import torch
    import transformers

    from shardplan.inputs.model import lora_blocks_params

    if targets == "attention" and variant.startswith("deepseek"):
        pytest.skip("MLA has no q/k/v/o modules: 'attention' is an approximation there (lora_params_per_block)")
    source = {**VARIANTS, "mixtral": MIXTRAL, "deepseek_v2": DEEPSEEK_V2}[variant]
    raw = dict(source)
    config = transformers.AutoConfig.for_model(raw.pop("model_type"), **raw).get_text_config()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    modules = "all-linear" if targets == "all-linear" else (
        ["qkv_proj", "o_proj"] if variant.startswith("phi3") else ["q_proj", "k_proj", "v_proj", "o_proj"])
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=modules))
    expected = sum(p.numel() for n, p in wrapped.named_parameters() if "lora_" in n)
    assert lora_blocks_params(spec_from_hf_config(source, name="x"), 4, targets) == expected


# --- activations: what a block saves for backward, measured with saved-tensor hooks -----------------
BLOCK = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=1, num_attention_heads=8,
             num_key_value_heads=2, head_dim=32, max_position_embeddings=256, tie_word_embeddings=False,
             pad_token_id=0, eos_token_id=1, bos_token_id=2)


def _saved_bytes_per_token(model_type, frozen, tokens=128):
    """Distinct storages autograd saves inside block 0 of a bf16 HF model (SDPA), per token:
    parameters, RoPE's cos/sin (shared by all blocks, ``activations.rope_bytes``) and int64/bool
    index tensors (``position_ids_bytes``) left out."""
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(model_type, **BLOCK)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    for p in model.parameters():
        p.requires_grad_(not frozen)
    excluded = {p.untyped_storage().data_ptr() for p in model.parameters()}
    model.model.rotary_emb.register_forward_hook(
        lambda mod, args, out: excluded.update(t.untyped_storage().data_ptr() for t in out))
    inside = [False]
    model.model.layers[0].register_forward_pre_hook(lambda *args: inside.__setitem__(0, True))
    model.model.layers[0].register_forward_hook(lambda *args: inside.__setitem__(0, False))
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if inside[0] and storage.data_ptr() not in excluded and t.dtype not in (torch.int64, torch.bool):
            seen[storage.data_ptr()] = (storage.nbytes(), t.dim())
        return t

    x = torch.randn(1, tokens, BLOCK["hidden_size"], dtype=torch.bfloat16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.model(inputs_embeds=x)
    # Gemma's (1 + weight.float()) keeps an fp32 copy of each norm weight (1-D, per layer, not per token)
    return sum(n for n, dim in seen.values() if dim > 1) / tokens


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "olmo2", "gemma3_text", "phi3", "granite"])
@pytest.mark.parametrize("method", ["full", "lora"])
def test_block_activations_equal_autograd_saves(model_type, method):
    """layer_bytes_per_token per family against what autograd saves (bf16, SDPA, CPU). Expected
    extras over Llama at h=256, q=256, kv=64, heads 8/2: Qwen3 q/k norms +(4+2)·320 + 4·10 = 1960
    (frozen 4·320 + 40 = 1320); OLMo 2 fp32-normalized norms and width-wise q/k norms; Gemma 3 two
    more norms; Phi-3 the o_proj input copy (+2·256)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from shardplan.formulas.activations import layer_bytes_per_token
    from shardplan.formulas.columns import Columns, model_values
    from shardplan.inputs import strategy as st
    from tests.helpers import DEFAULT_KNOBS

    frozen = method == "lora"
    spec = spec_from_hf_config({"model_type": model_type, **BLOCK}, name="x")
    values = {**model_values(spec), **DEFAULT_KNOBS, "method": st.LORA if frozen else st.FULL}
    # adapters off: the frozen base alone (the LoRA path has its own measured terms)
    values.update(lora_adapted_in=0, lora_unique_in=0, lora_adapted_linears=0, lora_rank_out=0)
    predicted = float(layer_bytes_per_token(Columns.build(**values), 2))
    assert predicted == _saved_bytes_per_token(model_type, frozen)
