"""DeepSpeed ZeRO++ (data/engine_profiles/deepspeed_zeropp.json): declared, not coded.

Expected values: ZeRO++ (Wang et al. 2023, arXiv 2306.10209) §3: stage-3 model states; qwZ sends
int8 weights with one fp32 scale per group (DeepSpeed CUDAQuantizer, 8000-element groups):
(1 + 4/8000) / 2 of the bf16 all-gather; qgZ sends int4 gradients with one fp32 scale per
4096-element group, (0.5 + 4/4096) / 2 of the bf16 reduction, only when the group spans nodes.
"""

import json

import numpy as np
import pytest

from shardplan.export import export, plan_spec, read_back
from shardplan.formulas.comm import comm_volume
from shardplan.formulas.memory import estimate_memory
from shardplan.formulas.model_states import model_states
from shardplan.inputs import strategy as st
from shardplan.inputs.engine_lookup import get_engine
from shardplan.inputs.vocabulary import canonical
from tests.helpers import columns

ZEROPP = st.ENGINES.index("deepspeed_zeropp")
QWZ_RATIO = (1 + 4 / 8000) / 2
QGZ_RATIO = (0.5 + 4 / 4096) / 2


def _pair(**knobs):
    """(deepspeed, deepspeed_zeropp) columns of the same configuration."""
    return columns("llama-2-7b", engine=st.DEEPSPEED, **knobs), columns("llama-2-7b", engine=ZEROPP, **knobs)


def test_the_words_name_the_engine():
    for word in ("zero++", "zeropp", "ZeRO++", "deepspeed_zeropp"):
        assert canonical("engine", word) == "deepspeed_zeropp"


@pytest.mark.parametrize("strategy", [st.FULL_SHARD, st.HYBRID_SHARD])
def test_model_states_are_stage_3s(strategy):
    ds, zpp = _pair(strategy=strategy, world_size=16, gpus_per_node=8, shard_group_size=8)
    a, b = model_states(ds), model_states(zpp)
    for key in a:
        assert int(a[key]) == int(b[key]), key
    assert int(estimate_memory(ds)["peak_allocated_bytes"]) == int(estimate_memory(zpp)["peak_allocated_bytes"])


def test_only_stage_3_strategies_are_valid():
    valid = [s for s in range(len(st.STRATEGIES)) if st.is_valid(s, ZEROPP)]
    assert valid == [st.FULL_SHARD, st.HYBRID_SHARD]


def test_qwz_halves_the_weight_all_gathers():
    ds, zpp = _pair(strategy=st.FULL_SHARD, world_size=8, gpus_per_node=8)
    a, b = comm_volume(ds), comm_volume(zpp)
    for name in ("ag_fwd", "ag_bwd"):
        assert int(b[f"{name}_message_bytes"]) == pytest.approx(int(a[f"{name}_message_bytes"]) * QWZ_RATIO, rel=1e-9)
        assert int(b[f"{name}_calls"]) == int(a[f"{name}_calls"])


def test_qgz_quarters_the_gradient_reduction_across_nodes_only():
    one_node = _pair(strategy=st.FULL_SHARD, world_size=8, gpus_per_node=8)
    two_nodes = _pair(strategy=st.FULL_SHARD, world_size=16, gpus_per_node=8)
    a, b = (comm_volume(c) for c in one_node)
    assert int(b["rs_grad_message_bytes"]) == int(a["rs_grad_message_bytes"])  # one node: plain reduce-scatter
    a, b = (comm_volume(c) for c in two_nodes)
    assert int(b["rs_grad_message_bytes"]) == pytest.approx(int(a["rs_grad_message_bytes"]) * QGZ_RATIO, rel=1e-9)


def test_hpz_keeps_a_secondary_16bit_partition_in_the_node():
    _, zpp = _pair(strategy=st.HYBRID_SHARD, world_size=16, gpus_per_node=8, shard_group_size=8)
    _, flat = _pair(strategy=st.FULL_SHARD, world_size=16, gpus_per_node=8, shard_group_size=8)
    extra = int(model_states(zpp)["params"]) - int(model_states(flat)["params"])
    assert extra == 2 * int(zpp.total_params) // 8  # 16-bit params / the 8-GPU group


def _plan(strategy, nodes):
    return {"model": "llama-3.1-8b", "cluster": {"nodes": nodes, "gpus_per_node": 8}, "gpu": "h100-sxm",
            "config": {"strategy": strategy, "engine": "deepspeed_zeropp", "precision": "bf16-mixed",
                       "micro_batch": 2, "grad_accum": 4, "shard_group_size": 8}}


def test_export_switches_on_qwz_qgz_and_hpz():
    z = json.loads(export(plan_spec(_plan("hybrid_shard", 2)), "deepspeed"))["zero_optimization"]
    assert z["stage"] == 3 and z["zero_quantized_weights"] is True and z["zero_quantized_gradients"] is True
    assert z["zero_hpz_partition_size"] == 8
    flat = json.loads(export(plan_spec(_plan("full_shard", 2)), "deepspeed"))["zero_optimization"]
    assert "zero_hpz_partition_size" not in flat and flat["zero_quantized_weights"] is True
    plain = json.loads(export(plan_spec({**_plan("full_shard", 2), "config": {**_plan("full_shard", 2)["config"],
                                                                               "engine": "deepspeed"}}), "deepspeed"))
    assert "zero_quantized_weights" not in plain["zero_optimization"]


@pytest.mark.parametrize("strategy", ["full_shard", "hybrid_shard"])
def test_round_trip_names_the_engine_again(strategy):
    spec = plan_spec(_plan(strategy, 2))
    got = read_back("deepspeed", export(spec, "deepspeed"))
    assert got["engine"] == "deepspeed_zeropp" and got["strategy"] == strategy
    assert got["world_size"] == 16 and got["micro_batch"] == 2 and got["grad_accum"] == 4
    plain = read_back("deepspeed", json.dumps({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1,
                                               "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 3}}))
    assert plain["engine"] == "deepspeed"


def test_declaration_cites_its_sources():
    e = get_engine("zero++")
    assert "2306.10209" in e.description
    assert e.collectives.weight_gather_quantization.bits == 8 and e.collectives.gradient_quantization.bits == 4
    assert not e.searched_by_planner.value  # lossy collectives: only when asked
    assert np.isclose(e.collectives.gradient_quantization.bytes_per_element(), 0.5 + 4 / 4096)
