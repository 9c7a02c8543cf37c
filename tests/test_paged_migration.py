"""bitsandbytes' paged optimizer states that the device cannot hold cost step time
(``throughput.paged_migration_s``): every step prefetches each parameter's states before its update,
and the UVM driver evicts oldest-resident first, so a sweep over more paged bytes than the room
moves all of them in and back out over the host link. Below the room they cost nothing."""

from __future__ import annotations

import dataclasses

import pytest

from shardplan.formulas import throughput as tp
from shardplan.formulas.columns import columns_for
from shardplan.formulas.memory import estimate_memory
from shardplan.formulas.model_states import optimizer_bytes_per_element
from shardplan.inputs import strategy as st
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.models import get_model
from shardplan.planning.evaluate import time_columns

# torchtune's single-device low-memory full fine-tune: bf16, optimizer stepped in backward, paged states
LOW_MEMORY = TrainingConfig(strategy="single", method="full", precision="bf16-pure", ac="full", seq_len=2048,
                            micro_batch=1, optimizer="adamw", optimizer_in_backward=True, paged_optimizer=True,
                            stack="plain")


def _run(model: str, config: TrainingConfig, cluster):
    c = columns_for(get_model(model), cluster, config)
    return estimate_memory(c, breakdown=False), time_columns(c, cluster), tp.compute_rates(cluster)


def _with_memory(cluster, memory_bytes: int):
    return cluster.model_copy(update={"gpu": cluster.gpu.model_copy(update={"memory_bytes": memory_bytes})})


@pytest.mark.parametrize("precision", [st.BF16_PURE, st.BF16_MIXED, st.FP32])
def test_a_paged_adamw_keeps_fp32_states_whatever_the_parameter_dtype(precision):
    # bitsandbytes PagedAdamW is its 32-bit optimizer: Optimizer2State.init_state makes both states
    # float32 (8 B); torch's AdamW keeps them in the master dtype (4 B under pure bf16)
    assert float(optimizer_bytes_per_element(st.ADAMW, precision, 4096, paged=True)) == 8.0
    assert float(optimizer_bytes_per_element(st.ADAMW_8BIT, precision, 4096, paged=True)) == \
        float(optimizer_bytes_per_element(st.ADAMW_8BIT, precision, 4096))
    assert float(optimizer_bytes_per_element(st.ADAMW, st.BF16_PURE, 4096)) == 4.0


def test_spilled_states_migrate_both_ways_every_step_and_resident_ones_cost_nothing():
    cluster = parse_gpus("1xrtx4090")
    m, t, rates = _run("llama-2-7b", LOW_MEMORY, cluster)
    paged, spill = int(m["paged_state_bytes"]), int(m["paged_spill_bytes"])
    assert paged == 8 * get_model("llama-2-7b").total_params  # fp32 states of every parameter
    assert 0 < spill < paged
    link = float(rates.host_link_bytes_per_s)
    assert float(t["offload_transfer_s"]) == pytest.approx(2 * paged / link, rel=1e-12)
    # the same states on a card that holds them: no migration, and the step is shorter by exactly it
    roomy = _with_memory(cluster, cluster.gpu.memory_bytes + spill)
    m2, t2, _ = _run("llama-2-7b", LOW_MEMORY, roomy)
    assert int(m2["paged_spill_bytes"]) == 0 and float(t2["offload_transfer_s"]) == 0.0
    assert float(t["step_time_s"]) - float(t2["step_time_s"]) == pytest.approx(2 * paged / link, rel=1e-9)
    # one byte short of that room: the oldest-resident-first sweep misses everywhere, all bytes move
    tight = _with_memory(cluster, cluster.gpu.memory_bytes + spill - 1)
    _, t3, _ = _run("llama-2-7b", LOW_MEMORY, tight)
    assert float(t3["offload_transfer_s"]) == pytest.approx(2 * paged / link, rel=1e-12)


def test_the_migration_scales_with_the_paged_bytes_and_the_host_link():
    cluster = parse_gpus("1xrtx4090")
    # states of a small model fit beside it: nothing moves
    m_small, t_small, _ = _run("llama-3.2-1b", LOW_MEMORY, cluster)
    assert int(m_small["paged_spill_bytes"]) == 0 and float(t_small["offload_transfer_s"]) == 0.0
    # 8-bit states of the 7B model are a quarter of the 32-bit ones (+ the fp32 absmax per block);
    # on a card that holds neither, the migration scales with them
    small = _with_memory(cluster, 16 * 2**30)
    m32, t32, rates = _run("llama-2-7b", LOW_MEMORY, small)
    m8, t8, _ = _run("llama-2-7b", LOW_MEMORY.model_copy(update={"optimizer": "adamw-8bit"}), small)
    assert int(m8["paged_spill_bytes"]) > 0
    ratio = float(optimizer_bytes_per_element(st.ADAMW_8BIT, st.BF16_PURE, 4096)) / 8.0
    assert float(t8["offload_transfer_s"]) / float(t32["offload_transfer_s"]) == pytest.approx(ratio, rel=1e-6)
    # twice the link rate, half the time; no spill, no time whatever the paged bytes
    paged, spill = m32["paged_state_bytes"], m32["paged_spill_bytes"]
    fast = dataclasses.replace(rates, host_link_bytes_per_s=2 * rates.host_link_bytes_per_s)
    assert float(tp.paged_migration_s(fast, paged, spill)) == pytest.approx(
        float(tp.paged_migration_s(rates, paged, spill)) / 2, rel=1e-12)
    assert float(tp.paged_migration_s(rates, paged, 0)) == 0.0


def test_unpaged_states_never_migrate():
    cluster = parse_gpus("1xrtx4090")
    m, t, _ = _run("llama-2-7b", LOW_MEMORY.model_copy(update={"paged_optimizer": False}), cluster)
    assert int(m["paged_state_bytes"]) == 0 and int(m["paged_spill_bytes"]) == 0
    assert float(t["offload_transfer_s"]) == 0.0
