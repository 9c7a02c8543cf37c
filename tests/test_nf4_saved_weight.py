"""A compiled torchtune QLoRA block keeps its 4-bit weights dequantized to bf16 for its backward
(``activations.nf4_compiled_saved_weight_bytes``, ``nf4_compiled_held_in_backward_bytes``; placed in
``qlora_dequant`` by ``memory.estimate_memory``): torchao's ``LinearNF4`` dequantizes in its forward
and again in its backward; compiled, AOTAutograd's partitioner saves the forward's copy instead.

The term is checked while the parameter count (three models), the checkpointing and compile vary,
and against the committed CPU measurement (``calibrate/nf4_saved_weight.py``: three weight shapes,
two token counts, torchao 0.1 and 0.6.1), which shows the saved bytes follow the weight count, not
the tokens; where torchao is installed, one case is measured again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardplan.formulas import activations as act
from shardplan.formulas.memory import estimate_memory
from shardplan.inputs import strategy as st
from tests.helpers import columns, run_cli

RECORD = Path(__file__).resolve().parents[1] / "data/calibration/nf4_saved_weight_cpu.jsonl"
MODELS = ["llama-3.2-1b", "llama-2-7b", "llama-3.1-70b"]


def _tao(model, **knobs):
    return columns(model, method=st.QLORA, nf4_torchao=True, strategy=st.SINGLE, world_size=1, **knobs)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("ac", [st.AC_NONE, st.AC_FULL])
@pytest.mark.parametrize("compiled", [False, True])
def test_per_block_bytes_follow_the_quantized_params(model, ac, compiled):
    c = _tao(model, ac=ac, compile=compiled)
    L, q = int(c.num_layers), int(c.quantizable_params)
    block = int(act.nf4_compiled_saved_weight_bytes(c))
    assert block == (-(-2 * q // L) if compiled else 0)
    held = int(act.nf4_compiled_held_in_backward_bytes(c))
    assert held == (block - 2 * int(c.hidden_size) * int(c.mlp_width) if compiled else 0)
    # bitsandbytes' Params4bit (a custom kernel, dequantized inside its own autograd function) and LoRA keep none
    bnb = columns(model, method=st.QLORA, ac=ac, compile=compiled)
    lora = columns(model, method=st.LORA, nf4_torchao=True, ac=ac, compile=compiled)
    assert int(act.nf4_compiled_saved_weight_bytes(bnb)) == int(act.nf4_compiled_saved_weight_bytes(lora)) == 0


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("seq_len", [512, 4096])
def test_without_checkpointing_every_block_keeps_its_weights_whatever_the_tokens(model, seq_len):
    eager, compiled = (estimate_memory(_tao(model, ac=st.AC_NONE, compile=on, seq_len=seq_len)) for on in (False, True))
    c = _tao(model, ac=st.AC_NONE, compile=True, seq_len=seq_len)
    whole = int(c.num_layers) * int(act.nf4_compiled_saved_weight_bytes(c))
    assert whole == pytest.approx(2 * int(c.quantizable_params), abs=int(c.num_layers))
    # the forward's loss moment holds all of them: the same bytes at 512 and 4096 tokens
    assert int(compiled["forward_peak_bytes"] - eager["forward_peak_bytes"]) == whole
    assert int(compiled["qlora_dequant"]) == whole


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("seq_len", [512, 4096])
def test_with_checkpointing_one_block_at_a_time(model, seq_len):
    eager, compiled = (estimate_memory(_tao(model, ac=st.AC_FULL, compile=on, seq_len=seq_len)) for on in (False, True))
    held = int(act.nf4_compiled_held_in_backward_bytes(_tao(model, ac=st.AC_FULL, compile=True)))
    assert int(compiled["forward_peak_bytes"]) == int(eager["forward_peak_bytes"])
    assert 0 <= int(compiled["backward_peak_bytes"] - eager["backward_peak_bytes"]) <= held
    # at a block moment the block's own weights (but the down projection's), never more
    assert int(compiled["qlora_dequant"]) in (0, held)


def test_the_fit_answer_turns_on_it():
    def margin(*args):
        out = run_cli("fit", *args, "--json")
        assert out.exit_code == 0, out.output
        data = json.loads(out.stdout)
        return (data[0] if isinstance(data, list) else data)["margin_bytes"]

    query = "8b on 1xrtx4090 qlora torchtune"
    eager, compiled = margin(query, "--ac", "none"), margin(query + " compile", "--ac", "none")
    c = _tao("llama-3.1-8b", ac=st.AC_NONE, compile=True)
    assert eager - compiled >= 2 * int(c.quantizable_params)  # the band grows with the peak too
    assert eager > 0 > compiled
    assert margin(query + " compile", "--ac", "full") > 0


def _records(case=None):
    """The saved-bytes rows (those with tokens), or the rows of one ``case``."""
    rows = [json.loads(line) for line in RECORD.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["case"] == case] if case else [r for r in rows if "tokens" in r]


def test_the_compiled_backward_frees_a_weight_after_its_last_use():
    # the second Linear's weight (its input gradient is computed first) is gone, the first's not yet
    rows = _records("released_after_last_use")
    assert {r["torchao"] for r in rows} == {"0.1", "0.6.1"}
    assert all(r["w1_alive"] is True and r["w2_alive"] is False for r in rows)


def test_the_measurement_saves_a_weight_per_weight_only_when_compiled_without_an_inner_checkpoint():
    rows = _records()
    assert {r["torchao"] for r in rows} == {"0.1", "0.6.1"}
    a = int(act.compute_dtype_bytes(st.BF16_PURE))
    for r in rows:
        keeps = r["case"] in ("compiled", "checkpoint_outside_compiled")
        assert r["other_bytes_per_weight"] == (a if keeps else 0.0), r
        # the rest is the layer input (lora_a's) and lora_a's output (lora_b's), a per token
        rank = 8 if r["case"] != "compiled_checkpoint_inside" else 0
        assert r["token_scaled_bytes"] == a * r["tokens"] * (r["in_features"] + rank), r


def test_the_saved_weight_bytes_do_not_follow_the_tokens():
    by_key = {}
    for r in _records():
        by_key.setdefault((r["torchao"], r["case"], r["out_features"], r["in_features"]), []).append(r)
    shapes = {k[2:] for k in by_key}
    assert len(shapes) == 3
    for runs in by_key.values():
        weight = {r["saved_bytes"] - r["token_scaled_bytes"] for r in runs}
        assert len(weight) == 1 and len({r["tokens"] for r in runs}) == 2


@pytest.mark.parametrize("case, per_weight", [("compiled", 2.0), ("compiled_checkpoint_inside", 0.0)])
def test_measure_again(case, per_weight):
    pytest.importorskip("torchao")
    from shardplan.calibrate.nf4_saved_weight import released_after_last_use, saved_bytes

    assert saved_bytes(256, 512, 32, case)["other_bytes_per_weight"] == per_weight
    if case == "compiled":
        assert released_after_last_use() == dict(case="released_after_last_use", w1_alive=True, w2_alive=False)
