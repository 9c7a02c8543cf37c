"""Parameter counts equal Hugging Face models built on the meta device (tests/data/hf_model_counts.csv)."""

import csv
import json
from pathlib import Path

import pytest

from shardplan.hf_config import spec_from_hf_config
from shardplan.models import get_model, model_profiles, resolve_model
from tools.make_model_profiles import MODEL_TYPES, NAMES

DATA = Path(__file__).parent / "data"
ROWS = {row["model"]: row for row in csv.DictReader(open(DATA / "hf_model_counts.csv"))}
CONFIGS = json.loads((DATA / "hf_configs.json").read_text())["models"]


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


@pytest.mark.parametrize("ref_name", sorted(CONFIGS))
def test_hf_config_reader_matches_shipped_profile(ref_name):
    entry = CONFIGS[ref_name]
    config = {"model_type": MODEL_TYPES[entry["config_class"]], **entry["kwargs"]}
    spec = spec_from_hf_config(config, name="x")
    assert spec.total_params == int(ROWS[ref_name]["total_params"])


def test_nineteen_profiles_ship():
    assert len(model_profiles()) >= 19


def test_aliases_are_unique():
    seen = {}
    for spec in model_profiles():
        for name in (spec.name, *spec.aliases):
            key = name.lower().replace("-", "").replace("_", "")
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
