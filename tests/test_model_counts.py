"""Parameter counts equal Hugging Face models built on the meta device (tests/data/hf_model_counts.csv,
and tests/data/hf_model_counts_new.csv from tools/hf_meta_counts.py for the newer families)."""

import csv
import json
import math
from pathlib import Path

import pytest

from shardplan.inputs.hf_config import spec_from_hf_config
from shardplan.inputs.models import get_model, model_profiles, resolve_model
from tools.make_model_profiles import NAMES, hf_config

DATA = Path(__file__).parent / "data"
ROWS = {row["model"]: row for name in ("hf_model_counts.csv", "hf_model_counts_new.csv", "hf_model_counts_2025.csv")
        for row in csv.DictReader(open(DATA / name))}
CONFIGS = {**json.loads((DATA / "hf_configs.json").read_text())["models"],
           **json.loads((DATA / "hf_configs_new.json").read_text())["models"],
           **json.loads((DATA / "hf_configs_2025.json").read_text())["models"]}


def _int(row, key):
    return int(row[key]) if row[key] else 0


@pytest.mark.parametrize("ref_name", sorted(ROWS))
def test_profile_counts_equal_hf_exactly(ref_name):
    row = ROWS[ref_name]
    spec = get_model(NAMES[ref_name][0])
    assert spec.total_params == _int(row, "total_params")
    assert spec.embedding_params == _int(row, "embedding_params")
    assert spec.lm_head_params == _int(row, "lm_head_params")
    assert spec.tie_word_embeddings == (row["lm_head_tied_to_embedding"] == "True")
    assert spec.position_embedding_params == _int(row, "position_embedding_params")
    assert spec.final_norm_params == _int(row, "other_non_block_params")
    assert spec.num_layers == _int(row, "num_blocks")
    assert spec.block_params[0] == _int(row, "block0_params")
    assert min(spec.block_params) == _int(row, "block_params_min")
    assert spec.largest_block_params == _int(row, "block_params_max")
    assert spec.blocks_params == _int(row, "sum_block_params")
    assert spec.non_embedding_params == _int(row, "non_embedding_params")
    assert spec.largest_module_params == _int(row, "largest_module_params_direct")
    assert spec.active_params_per_token == _int(row, "active_params_per_token")
    if row["moe_num_experts"]:
        assert spec.routed_experts_params == _int(row, "moe_routed_expert_params_total")
        assert spec.num_moe_blocks == _int(row, "moe_layers")
    assert spec.block_class == row["block_class"]


@pytest.mark.parametrize("ref_name", sorted(CONFIGS))
def test_hf_config_reader_matches_shipped_profile(ref_name):
    spec = spec_from_hf_config(hf_config(CONFIGS[ref_name]), name="x")
    assert spec.total_params == int(ROWS[ref_name]["total_params"])
    assert spec.blocks_params == int(ROWS[ref_name]["sum_block_params"])


@pytest.mark.parametrize("ref_name", sorted(CONFIGS))
def test_hf_config_reader_without_transformers_counts_the_same(ref_name, monkeypatch):
    """A plain install (no transformers) falls back to shardplan's copy of the class defaults and
    still counts exactly; the keys it filled are listed as assumed, saying transformers is absent."""
    monkeypatch.setitem(__import__("sys").modules, "transformers", None)
    spec = spec_from_hf_config(hf_config(CONFIGS[ref_name]), name="x")
    assert spec.total_params == int(ROWS[ref_name]["total_params"])
    assert all("text decoder only" in a or "transformers is not installed" in a for a in spec.assumed)


@pytest.mark.parametrize("spec", model_profiles(), ids=lambda s: s.name)
def test_parameter_tensors_add_up_to_the_counts(spec):
    shapes = spec.parameter_shapes()
    assert sum(math.prod(t) for t in shapes["root"]) == spec.root_params
    assert [sum(math.prod(t) for t in shapes[f"block{i}"]) for i in range(spec.num_layers)] == list(spec.block_params)


def test_every_profile_has_a_meta_device_row():
    names = {NAMES[ref][0] for ref in ROWS}
    assert {s.name for s in model_profiles()} <= names


# The models people fine-tune now (issue 11), by the names and HF repo ids users type.
CURRENT = {
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B", "llama-3-70b": "meta-llama/Meta-Llama-3-70B",
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B", "llama-3.2-3b": "meta-llama/Llama-3.2-3B",
    "llama-3.3-70b": "meta-llama/Llama-3.3-70B-Instruct", "qwen3-0.6b": "Qwen/Qwen3-0.6B",
    "qwen3-1.7b": "Qwen/Qwen3-1.7B", "qwen3-4b": "Qwen/Qwen3-4B", "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-14b": "Qwen/Qwen3-14B", "qwen3-32b": "Qwen/Qwen3-32B", "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "gemma-3-1b": "google/gemma-3-1b-pt", "gemma-3-4b": "google/gemma-3-4b-pt", "gemma-3-12b": "google/gemma-3-12b-pt",
    "gemma-3-27b": "google/gemma-3-27b-pt", "phi-3-mini": "microsoft/Phi-3-mini-4k-instruct",
    "phi-3-medium": "microsoft/Phi-3-medium-4k-instruct", "phi-4": "microsoft/phi-4",
    "mistral-nemo-12b": "mistralai/Mistral-Nemo-Base-2407", "mistral-small-24b": "mistralai/Mistral-Small-24B-Base-2501",
}


def test_profiles_ship():
    assert len(model_profiles()) == 19 + 26 + 16  # hf_configs.json, hf_configs_new.json, hf_configs_2025.json


@pytest.mark.parametrize("name", sorted(CURRENT))
def test_current_models_resolve_by_name_and_repo_id(name):
    assert get_model(name).name == name
    assert get_model(CURRENT[name]).name == name


def test_llama_3_keeps_its_8k_context():
    assert get_model("llama-3-8b").max_position_embeddings == 8192
    assert get_model("llama-3-70b").max_position_embeddings == 8192


def test_aliases_are_unique():
    seen = {}
    from shardplan.support.names import normalize

    for spec in model_profiles():
        for name in (spec.name, *spec.aliases):
            key = normalize(name)
            assert seen.get(key, spec.name) == spec.name, f"{name} used by {seen[key]} and {spec.name}"
            seen[key] = spec.name


@pytest.mark.parametrize("text,expected", [("70B", "llama-3.1-70b"), ("405b", "llama-3.1-405b"),
                                           ("1.3B", "opt-1.3b"), ("175B", "gpt3-175b"), ("13b", "llama-2-13b")])
def test_bare_size_resolves_to_nearest_reference(text, expected):
    resolved = resolve_model(text)
    assert resolved.spec.name == expected
    assert "nearest" in resolved.how


def test_flops_per_token_follows_palm():
    # PaLM App. B: 6N + 12·L·H·Q·T; Llama-2-7B at T=4096: N_matmul = blocks + final norm + lm_head.
    spec = get_model("llama-2-7b")
    n = 6_476_267_520 + 131_072_000  # sum of block params (hf_model_counts.csv) + lm_head
    expected = 6 * n + 12 * 32 * 32 * 128 * 4096
    assert spec.train_flops_per_token(4096) == expected


def test_moe_flops_use_active_params():
    mixtral = get_model("mixtral-8x7b")
    dense_equiv = mixtral.active_params_per_token - mixtral.root_params + mixtral.lm_head_params
    assert mixtral.matmul_params_per_token == dense_equiv
    assert mixtral.matmul_params_per_token < mixtral.total_params / 3
