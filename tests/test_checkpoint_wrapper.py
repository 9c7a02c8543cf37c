"""torch's checkpoint_wrapper around HF blocks under FSDP2 (memory.wrapper_leftover_bytes), against
the CPU tracker measurement (tests/data/checkpoint_wrapper_cpu.json, a copy of
data/calibration/checkpoint_wrapper_cpu.json) and the H100 campaign (tests/data/gpu/)."""

import json
from pathlib import Path

from shardplan.calibrate.gpu_compare import compare_folder, training_config
from shardplan.formulas.columns import columns_for
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.hf_config import spec_from_hf_config
from shardplan.formulas.memory import estimate_memory, wrapper_leftover_bytes

DATA = Path(__file__).parent / "data"
RECORDS = json.loads((DATA / "checkpoint_wrapper_cpu.json").read_text())["records"]


def _tiny(h):
    return spec_from_hf_config(dict(model_type="llama", vocab_size=512, hidden_size=h, intermediate_size=344,
                                    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                    max_position_embeddings=256, tie_word_embeddings=False), "tiny")


def _columns(h, wrapper):
    import dataclasses

    config = TrainingConfig(stack="hf", strategy="full_shard", engine="fsdp2", ac="full", seq_len=256, micro_batch=1,
                            reduce_dtype="fp32", load_mode="meta_init", checkpoint_wrapper=wrapper)
    c = columns_for(_tiny(h), parse_gpus("8xh100-sxm"), config)
    # the CPU run: per-tensor AdamW, composite dropout, SDPA's flash kernel (compare_hf's CPU semantics)
    return dataclasses.replace(c, foreach_optimizer=c.foreach_optimizer * 0, fused_dropout=c.fused_dropout * 0,
                               sdpa_fp32_gqa_math=c.sdpa_fp32_gqa_math * 0)


def test_each_finished_block_leaves_one_rmsnorm_set_of_intermediates():
    for r in (r for r in RECORDS if r["config"]["ac"] == "full"):
        h = r["config"]["hidden_size"]
        temp = r["temp_at_each_block_backward_peak"]
        steps = [temp[str(k)] - temp[str(k + 1)] for k in range(len(temp) - 1) if str(k + 1) in temp]
        per_block = int(wrapper_leftover_bytes(_columns(h, True), 2, 1, 1))
        assert per_block == 256 * (12 * h + 4)
        assert steps and all(s == per_block for s in steps), (h, steps)


def test_the_knob_closes_the_cpu_gap():
    """Measured tracker peaks vs prediction: -1.2 % (h=128), -4.5 % (h=256) with the knob; the
    h=128 run was -14.6 % without it."""
    for r in (r for r in RECORDS if r["config"]["ac"] == "full"):
        h, measured = r["config"]["hidden_size"], r["peak_breakdown"]["Total"]
        on = int(estimate_memory(_columns(h, True), optimizer_step_on_device=True)["peak_allocated_bytes"])
        off = int(estimate_memory(_columns(h, False), optimizer_step_on_device=True)["peak_allocated_bytes"])
        assert abs(on - measured) / measured < 0.05, (h, on, measured)
        assert abs(on - measured) < abs(off - measured)
    off128 = int(estimate_memory(_columns(128, False), optimizer_step_on_device=True)["peak_allocated_bytes"])
    assert (off128 - 6_338_276) / 6_338_276 < -0.14


def test_h100_fsdp_runs_with_activation_checkpointing():
    """With the knob (the campaign checkpointed its FSDP runs with apply_activation_checkpointing),
    the full fine-tuning runs are -5.9 .. +13.0 % on the allocated peak (over-predicted at 70B);
    without it they were -12 .. -39 %."""
    rows = [r for r in compare_folder(DATA / "gpu")
            if r["kind"] == "fsdp" and r["ac"] != "none" and r["method"] == "full"]
    assert len(rows) == 10  # 8 runs + 2 expandable-segments reruns
    assert all(-0.06 < r["allocated_error"] < 0.131 for r in rows), [round(r["allocated_error"], 3) for r in rows]


def test_hf_stack_uses_the_wrapper_under_fsdp_only():
    from shardplan.inputs.stacks import resolve_stack

    assert resolve_stack(TrainingConfig(stack="hf"), 8).checkpoint_wrapper is True
    assert resolve_stack(TrainingConfig(stack="hf"), 1).checkpoint_wrapper is False
    assert training_config({"kind": "hf", "method": "lora", "micro_batch": 1, "seq_len": 8}).checkpoint_wrapper is False


def test_leftovers_inside_each_block_backward_are_the_formula_at_that_many_finished_blocks():
    """The backward's moments scale one block's leftovers (``memory._leftover_after``) instead of
    calling ``wrapper_leftover_bytes`` per block: equal at every block k, 16-bit and fp32."""
    import dataclasses

    import numpy as np

    from shardplan.formulas.activations import checkpointed_layers, compute_dtype_bytes
    from shardplan.formulas.memory import _leftover_after
    from shardplan.inputs import strategy as st

    for h in (128, 256):
        for precision in (st.BF16_MIXED, st.FP32):
            c = dataclasses.replace(_columns(h, True), precision=np.asarray(precision))
            a, n_ckpt = compute_dtype_bytes(c.precision), checkpointed_layers(c)
            ctx = {"leftover_per_block": wrapper_leftover_bytes(c, a, 1, n_ckpt)}
            L = int(c.num_layers)
            for k in range(L):
                expected = int(wrapper_leftover_bytes(c, a, L - 1 - k, n_ckpt))
                assert int(_leftover_after(c, k, ctx)) == expected, (h, precision, k)
                assert (expected > 0) == (k < L - 1)  # every block after k has left its intermediates
