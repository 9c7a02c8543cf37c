"""``formulas/columns.py``: the numbers the formulas read from a model, checked against the
model's published config.json by hand (not against the package's own counts)."""

from __future__ import annotations

import shardplan
from shardplan.formulas.columns import model_values


def test_mixtral_mlp_width_is_the_routed_experts():
    """Mixtral-8x7B (mistralai/Mixtral-8x7B-v0.1 config.json: num_experts_per_tok 2,
    intermediate_size 14,336, no shared expert): each token runs 2 experts' MLPs, so the MLP
    activations per token are 2 × 14,336 wide; the dense Llama-3.1-8B's are its 14,336."""
    assert model_values(shardplan.resolve_model("mixtral-8x7b").spec)["mlp_width"] == 2 * 14_336
    assert model_values(shardplan.resolve_model("llama-3.1-8b").spec)["mlp_width"] == 14_336


def test_llama_8b_counts_from_its_config():
    """Llama-3.1-8B (vocab 128,256, hidden 4,096, 32 layers, 32 query heads and 8 KV heads of 128)."""
    v = model_values(shardplan.resolve_model("llama-3.1-8b").spec)
    assert (v["hidden_size"], v["vocab_size"], v["num_layers"], v["q_width"], v["kv_width"]) == (4096, 128_256, 32, 4096, 1024)
    assert v["root_params"] == 2 * 128_256 * 4096 + 4096
