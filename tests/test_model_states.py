"""Model-state bytes against the ZeRO paper and DeepSpeed's own estimators (exact)."""

import csv
from pathlib import Path

import numpy as np
import pytest

from shardplan.formulas.memory import deepspeed_estimator_host_bytes, estimate_memory
from shardplan.formulas.model_states import zero_paper_model_state_bytes
from shardplan.inputs import strategy as st
from tests.helpers import columns

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("stage,expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_figure_1(stage, expected_gb):
    # Rajbhandari et al. SC'20, Fig. 1: Ψ = 7.5B, N = 64, K = 12 -> 120 / 31.4 / 16.6 / 1.9 GB.
    got = zero_paper_model_state_bytes(7.5e9, 64, stage, k=12) / 1e9
    assert got == pytest.approx(expected_gb, abs=0.05)


def test_zero_paper_stages_follow_strategy_shard_degrees():
    # The strategy vocabulary's shard degrees reproduce the paper's stage ordering for N = 64.
    p, g, o = st.shard_degrees(np.array([st.DDP, st.ZERO1, st.ZERO2, st.FULL_SHARD]), st.DEEPSPEED, 64, 64)
    states = 2 * 7.5e9 / p + 2 * 7.5e9 / g + 12 * 7.5e9 / o
    assert np.allclose(states / 1e9, [120, 31.4, 16.6, 1.875], atol=0.05)


def _deepspeed_rows():
    rows = []
    for name in ("deepspeed_estimates.csv", "deepspeed_estimates_hf_models.csv"):
        rows += list(csv.DictReader(open(DATA / name)))
    return rows


def _ds_columns(row):
    g, n = int(row["num_gpus_per_node"]), int(row["num_nodes"])
    stage3 = row["estimator"] == "zero3"
    opt_off = row["offload_optimizer"] == "cpu"
    offload = st.OFFLOAD_NONE
    if opt_off:
        offload = st.OFFLOAD_ALL if (stage3 and row["offload_param"] == "cpu") else st.OFFLOAD_OPTIMIZER
    largest = int(float(row["largest_layer_params"])) if row["largest_layer_params"] else 0
    return columns(total_params=int(row["total_params"]), largest_module_params=largest, world_size=g * n,
                   gpus_per_node=g, shard_group_size=g * n, engine=st.DEEPSPEED,
                   strategy=st.FULL_SHARD if stage3 else st.ZERO2, offload=offload)


def test_deepspeed_estimators_reproduced_exactly():
    rows = _deepspeed_rows()
    assert len(rows) == 864 + 1520
    mismatches = []
    for row in rows:
        m = estimate_memory(_ds_columns(row))
        if int(m["model_state_bytes"]) != int(row["per_gpu_bytes"]):
            mismatches.append((row["estimator"], row["total_params"], row["per_gpu_bytes"], int(m["model_state_bytes"])))
    assert not mismatches, mismatches[:5]


def test_deepspeed_host_ram_reproduced_exactly():
    mismatches = []
    for row in _deepspeed_rows():
        c = _ds_columns(row)
        zero_init = row["zero_init"] in ("", "1", "1.0")
        nodes = int(row["num_nodes"])
        got = deepspeed_estimator_host_bytes(c.total_params, c.largest_module_params, c.gpus_per_node, nodes,
                                             c.strategy, c.offload, zero_init=zero_init)
        if int(got) != int(row["per_cpu_bytes"]):
            mismatches.append((row["estimator"], row["total_params"], row["printed_options"], row["per_cpu_bytes"], int(got)))
    assert not mismatches, mismatches[:5]


def test_fsdp2_mixed_precision_holds_16_bytes_per_param_sharded():
    # FSDP2 with bf16 params / fp32 reduce: fp32 sharded params (master) + fp32 grads + Adam = 16Ψ/N.
    c = columns("llama-3.1-70b", world_size=4, gpus_per_node=4, shard_group_size=4, seq_len=1024)
    m = estimate_memory(c)
    psi = 70_553_706_496
    states = int(m["params"]) + int(m["optimizer_states"]) + psi * 4 // 4
    assert states == pytest.approx(16 * psi / 4, rel=1e-6)
    # ~280 GB per GPU of model state: "no" for full fine-tuning on 4 x 24 GB.
    assert int(m["model_state_bytes"]) / 1e9 == pytest.approx(282.2, abs=0.5)


def test_ddp_default_buckets_double_gradients():
    # torch DDP docstring: gradient_as_bucket_view=True saves memory "equal to the total gradients size".
    m = estimate_memory(columns("gpt2", strategy=st.DDP))
    assert int(m["grad_buckets"]) == 124_439_808 * 4


def test_qlora_base_is_nf4_with_double_quantization():
    # Dettmers et al. 2023: 4-bit NF4 + 8-bit absmax per 64 + fp32 per 256 blocks.
    m = estimate_memory(columns("llama-2-7b", method=st.QLORA, world_size=1, gpus_per_node=1, shard_group_size=1))
    from shardplan.inputs.model import block_linear_params
    from shardplan.inputs.models import get_model
    spec = get_model("llama-2-7b")
    quantized = block_linear_params(spec)
    from shardplan.inputs.model import lora_params_per_block
    adapters = 32 * lora_params_per_block(spec, 16)  # fp32 LoRA A/B on every Linear, rank 16
    assert adapters == 32 * 16 * (4 * (4096 + 4096) + 3 * (4096 + 11008))
    # + per quantized tensor the NF4 code, the nested code and the offset (bitsandbytes QuantState:
    # 64 + 1024 + 4 B; measured on the CPU backend, data/calibration/hf_stack_cpu.jsonl), 7 per block
    expected = (np.ceil(quantized * (0.5 + 1 / 64 + 4 / 16384)) + 1092 * 7 * 32 + 2 * (spec.total_params - quantized)
                + 4 * adapters)
    assert int(m["params"]) == int(expected)
    assert int(m["params"]) / spec.total_params == pytest.approx(0.58, abs=0.02)


def test_deepspeed_hybrid_is_zero_plus_plus_hpz():
    # ZeRO++ hpZ (Wang et al. 2023, §3.2): primary partition of every state over all N ranks, plus a
    # secondary 16-bit parameter partition within the node (g): 18Ψ/N + 2Ψ/g model-state bytes.
    psi, n, g = 6_738_415_616, 64, 8
    hybrid = estimate_memory(columns("llama-2-7b", engine=st.DEEPSPEED, strategy=st.HYBRID_SHARD, world_size=n,
                                     shard_group_size=g))
    zero3 = estimate_memory(columns("llama-2-7b", engine=st.DEEPSPEED, strategy=st.FULL_SHARD, world_size=n,
                                    shard_group_size=n))
    assert int(hybrid["model_state_bytes"]) - int(zero3["model_state_bytes"]) == 2 * psi // g


def test_gptq_and_awq_bytes_from_their_packed_tensors():
    """A 4096 x 4096 Linear in AutoGPTQ's layout: ``qweight`` int32 [in/8, out], ``qzeros`` int32
    [in/128, out/8], ``scales`` fp16 [in/128, out]; AutoAWQ's GEMM layout (``qweight`` int32
    [in, out/8]) holds the same bytes. NF4 packs two weights a byte (its quant_state apart)."""
    from shardplan.formulas.model_states import quant_bytes_per_param
    from shardplan.inputs import strategy as st

    n_in = n_out = 4096
    gptq = (n_in // 8) * n_out * 4 + (n_in // 128) * (n_out // 8) * 4 + (n_in // 128) * n_out * 2
    assert gptq == 8_716_288
    for fmt in ("gptq", "awq"):
        assert float(quant_bytes_per_param(st.QUANT_FORMATS.index(fmt))) * n_in * n_out == gptq
    assert float(quant_bytes_per_param(st.QUANT_FORMATS.index("nf4"))) == 0.5
