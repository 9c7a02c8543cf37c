"""Engine declarations (shardplan/inputs/engines.py, data/engine_profiles/*.json) and the
quantities that now live once, engine-side."""

import json
import math

import numpy as np
import pytest
from pydantic import BaseModel

from shardplan.formulas.comm import comm_volume
from shardplan.formulas.model_states import optimizer_step_bytes_per_element
from shardplan.formulas.throughput import compute_rates, cpu_optimizer_step_s, optimizer_step_s
from shardplan.inputs import engines
from shardplan.inputs import strategy as st
from shardplan.inputs.hardware import parse_gpus
from shardplan.support.errors import ShardplanError
from tests.helpers import columns


def _sources(model: BaseModel, where: str = ""):
    """Every ``source`` string of a declaration, with where it sits."""
    for name, value in model:
        if name == "source":
            yield where, value
        elif isinstance(value, BaseModel):
            yield from _sources(value, f"{where}.{name}")
        elif isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, BaseModel):
                    yield from _sources(v, f"{where}.{name}.{k}")


def test_codes_keep_their_values():
    assert st.ENGINES[:3] == ("fsdp2", "fsdp1", "deepspeed")
    assert (st.FSDP2, st.FSDP1, st.DEEPSPEED) == (0, 1, 2)
    assert [p.code for p in engines.engine_profiles()] == list(range(len(st.ENGINES)))


@pytest.mark.parametrize("profile", engines.engine_profiles(), ids=lambda p: p.name)
def test_every_declared_value_has_a_source(profile):
    found = dict(_sources(profile))
    for key in ("layout", "bytes_per_element.params", "default_reduce_dtype", "collectives.gradient_bucket"):
        assert found.get(f".{key}"), key
    for name in profile.strategies:
        assert found.get(f".strategies.{name}"), name
    assert all(len(text) > 10 for text in found.values())


def test_validity_is_the_declared_strategies():
    for e, profile in enumerate(engines.engine_profiles()):
        for s, name in enumerate(st.STRATEGIES):
            assert bool(st.is_valid(s, e)) == (name in profile.strategies), (profile.name, name)


def test_a_declaration_with_an_unknown_field_is_one_line(tmp_path):
    data = json.loads((engines.ENGINE_DIR / "fsdp2.json").read_text())
    data["bogus"] = 1
    path = tmp_path / "fsdp2.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ShardplanError, match="bogus"):
        engines._read(path)


def test_deepspeed_call_counts_use_its_own_buckets():
    # DeepSpeed config docs: reduce_bucket_size / allgather_bucket_size default 5e8 elements
    c = columns("llama-2-7b", engine=st.DEEPSPEED, strategy=st.ZERO2, world_size=8, shard_group_size=8)
    v = comm_volume(c)
    grads = int(c.total_params)
    assert int(v["rs_grad_calls"]) == math.ceil(grads * 2 / (5e8 * 2))  # bf16 reduction (its default)
    assert int(v["ag_post_step_calls"]) == math.ceil(grads * 2 / (5e8 * 2))
    # torch DDP: bucket_cap_mb = 25 MiB of the fp32 gradients
    d = columns("llama-2-7b", engine=st.FSDP2, strategy=st.DDP, world_size=8)
    assert int(comm_volume(d)["ar_grad_calls"]) == math.ceil(int(d.total_params) * 4 / (25 * 2**20))


def test_hpz_gathers_backward_inside_the_group():
    c = columns("llama-2-7b", engine=st.DEEPSPEED, strategy=st.HYBRID_SHARD, world_size=16, gpus_per_node=8,
                shard_group_size=8)
    v = comm_volume(c)
    assert int(v["ag_fwd_group"]) == 16 and int(v["ag_bwd_group"]) == 8


@pytest.mark.parametrize("optimizer, precision, expected", [
    (st.ADAMW, st.BF16_MIXED, 28.0),    # fp32: 2·(4 master + 8 states) + 4 grad
    (st.SGD, st.BF16_MIXED, 20.0),      # one momentum buffer
    (st.ADAMW, st.BF16_PURE, 14.0),     # everything in bf16
])
def test_optimizer_step_bytes_are_the_optimizers_own(optimizer, precision, expected):
    assert float(optimizer_step_bytes_per_element(optimizer, precision, 4096)) == pytest.approx(expected, rel=1e-12)


def test_cpu_and_gpu_steps_charge_the_same_bytes():
    """A fused GPU step and the CPU optimizer (a fused host kernel) move the same bytes per param."""
    rates = compute_rates(parse_gpus("8xh100-sxm"))
    for opt in range(len(st.OPTIMIZERS)):
        gpu = columns(optimizer=opt, optimizer_impl=st.OPT_FUSED)
        cpu = columns(optimizer=opt, offload=st.OFFLOAD_ALL)
        per_param = float(optimizer_step_bytes_per_element(opt, st.BF16_MIXED, gpu.hidden_size))
        shard = float(gpu.total_params) / 8
        assert float(optimizer_step_s(gpu, rates)) == pytest.approx(shard * per_param / rates.hbm_bytes_per_s, rel=1e-12)
        assert float(cpu_optimizer_step_s(cpu, rates)) == pytest.approx(
            shard * per_param * 8 / rates.cpu_optimizer_bytes_per_s_per_node, rel=1e-12)


def test_reduce_dtype_is_resolved_in_one_place():
    p = np.array([st.BF16_MIXED, st.BF16_MIXED, st.BF16_PURE, st.FP16_MIXED])
    e = np.array([st.FSDP2, st.DEEPSPEED, st.FSDP1, st.FSDP2])
    assert st.resolve_reduce_dtype(None, p, e).tolist() == [st.REDUCE_FP32, st.REDUCE_PARAM, st.REDUCE_PARAM, st.REDUCE_FP32]
    stated = np.array([-1, st.REDUCE_BF16, -1, st.REDUCE_FP16])
    assert st.resolve_reduce_dtype(stated, p, e).tolist() == [st.REDUCE_FP32, st.REDUCE_BF16, st.REDUCE_PARAM, st.REDUCE_FP16]


@pytest.mark.parametrize("change, named", [
    (lambda d: d.update(name="fsdp9"), "name"),
    (lambda d: d["bytes_per_element"]["params"]["value"].pop("fp32"), "params"),
    (lambda d: d["default_reduce_dtype"]["value"].update({"fp32": "fp64"}), "fp64"),
    (lambda d: d["strategies"].update(zero9=d["strategies"]["ddp"]), "zero9"),
    (lambda d: d["layout"].update(value="diagonal"), "diagonal"),
])
def test_a_bad_declaration_is_named_in_one_line(tmp_path, change, named):
    data = json.loads((engines.ENGINE_DIR / "fsdp2.json").read_text())
    change(data)
    path = tmp_path / "fsdp2.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ShardplanError, match=named):
        engines._read(path)
