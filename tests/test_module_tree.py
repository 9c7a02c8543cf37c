"""Issue 22 item 10: a config.json of a model_type no family reader knows is built on the meta device
by transformers (shardplan/calibrate/module_tree.py) where torch and transformers are installed, and
its tensors feed the ModelSpec; without them it is one line naming the ``hf`` extra. Nothing from
the file becomes code (auto_map ignored, trust_remote_code=False) and nothing is downloaded."""

from __future__ import annotations

import json
import math
import shutil
import socket
import sys
from pathlib import Path

import pytest

from shardplan.calibrate import install_module_tree_reader
from shardplan.inputs.hf_config import spec_from_hf_config, spec_from_hf_config_file
from shardplan.support import extras
from shardplan.support.errors import ShardplanError
from tests.helpers import one_line_error, run_cli

DATA = Path(__file__).parent / "data" / "unknown_model_type"
CONFIG = json.loads((DATA / "config.json").read_text())
EXTRA_LINE = 'pip install "shardplan[hf]"'


def neox_params(c: dict) -> dict[str, int]:
    """GPT-NeoX's count by hand (transformers ``GPTNeoXLayer``: two LayerNorms with bias, a fused
    query_key_value and dense with biases, dense_h_to_4h / dense_4h_to_h with biases; untied
    embed_in and embed_out; a final LayerNorm)."""
    h, i, v, L = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    block = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h)
    root = 2 * v * h + 2 * h
    return {"block": block, "root": root, "total": root + L * block}


@pytest.fixture
def with_reader(monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    monkeypatch.setattr(extras, "_READERS", {})
    install_module_tree_reader()


def test_an_unknown_model_type_is_read_from_its_module_tree(with_reader, tmp_path, monkeypatch):
    folder = tmp_path / "neox"
    shutil.copytree(DATA, folder)
    marker = tmp_path / "ran.marker"
    monkeypatch.setenv("SHARDPLAN_NEVER_RUN_MARKER", str(marker))
    monkeypatch.syspath_prepend(str(folder))  # auto_map's module is importable: it still must not run

    def no_network(*_a, **_k):
        raise AssertionError("network access while building a config")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    spec = spec_from_hf_config_file(folder / "config.json")
    want = neox_params(CONFIG)
    assert spec.family == "module_tree" and spec.block_class == "GPTNeoXLayer"
    assert spec.total_params == want["total"] and spec.root_params == want["root"]
    assert spec.block_params == (want["block"],) * CONFIG["num_hidden_layers"]
    h = CONFIG["hidden_size"]
    assert (3 * h, h) in spec.parameter_shapes()["block0"] and spec.fused_qkv and spec.norm == "layernorm"
    assert spec.largest_module_params == CONFIG["vocab_size"] * h and not spec.tie_word_embeddings
    assert any("module tree" in a and f"{want['total']:,}" in a for a in spec.assumed)
    assert not marker.exists() and "never_run" not in sys.modules


def test_the_cli_answers_for_a_folder_and_says_how_it_read_it(with_reader):
    res = run_cli("fit", "--model", DATA, "--gpus", "1xrtx4090")
    assert res.exit_code == 0, res.output
    assert "read from its module tree" in res.output and "ASSUMPTION: activations" in res.output
    assert f"{neox_params(CONFIG)['total']:,} params" in res.output


def test_a_model_type_transformers_does_not_ship_is_one_line(with_reader, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CONFIG, "model_type": "made_up_lm"}))
    one_line_error(run_cli("fit", "--model", path, "--gpus", "1xrtx4090"), "model_type='made_up_lm'",
                   "trust_remote_code")


def test_known_families_keep_their_hand_written_readers(with_reader):
    spec = spec_from_hf_config({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                                "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100}, name="x")
    assert spec.family == "llama" and spec.module_tree is None


@pytest.mark.parametrize("hidden", ["transformers", "torch"])
def test_without_torch_or_transformers_it_names_the_extra(monkeypatch, hidden):
    monkeypatch.setitem(sys.modules, hidden, None)
    line = one_line_error(run_cli("fit", "--model", DATA, "--gpus", "1xrtx4090"), "model_type='gpt_neox'", EXTRA_LINE)
    assert "llama" in line  # the families it does read


def test_without_the_reader_installed_inputs_alone_names_the_extra(monkeypatch):
    monkeypatch.setattr(extras, "_READERS", {})
    with pytest.raises(ShardplanError, match=r"shardplan\[hf\]"):
        spec_from_hf_config(CONFIG, name="x")


def test_module_tree_counts_equal_transformers_parameters(with_reader):
    """The partition into root and blocks loses and doubles nothing (tied weights once)."""
    torch = pytest.importorskip("torch")
    import transformers

    for tie in (False, True):
        config = {**CONFIG, "tie_word_embeddings": tie}
        spec = spec_from_hf_config(config, name="x")
        built = transformers.AutoConfig.for_model("gpt_neox", **{k: v for k, v in config.items()
                                                                if k not in ("model_type", "auto_map", "_comment")})
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(built)
        assert spec.total_params == sum(p.numel() for p in model.parameters()), tie
        assert spec.tie_word_embeddings == tie
        assert sum(math.prod(s) for u in spec.parameter_shapes().values() for s in u) == spec.total_params


def test_a_config_past_the_parameter_limit_is_refused_before_it_is_built(with_reader, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CONFIG, "hidden_size": 2**20, "num_attention_heads": 8, "num_hidden_layers": 10_000}))
    one_line_error(run_cli("fit", "--model", path, "--gpus", "1xrtx4090"), "hidden_size=1048576", "MAX_PARAMS")
