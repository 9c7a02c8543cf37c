"""torch's checkpoint_wrapper around HF blocks under FSDP2 (memory.kv_cache_leftover_bytes), against
the CPU tracker measurement (tests/data/checkpoint_wrapper_cpu.json, a copy of
data/calibration/checkpoint_wrapper_cpu.json) and the H100 campaign (tests/data/gpu/)."""

import json
from pathlib import Path

from shardplan.calibrate.gpu_compare import compare_folder, training_config
from shardplan.formulas.columns import columns_for
from shardplan.formulas.memory import estimate_memory, kv_cache_leftover_bytes
from shardplan.inputs import strategy as st
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.hf_config import spec_from_hf_config

DATA = Path(__file__).parent / "data"
RECORDS = json.loads((DATA / "checkpoint_wrapper_cpu.json").read_text())["records"]


def _tiny(h):
    return spec_from_hf_config(dict(model_type="llama", vocab_size=512, hidden_size=h, intermediate_size=344,
                                    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                    max_position_embeddings=256, tie_word_embeddings=False), "tiny")


def _columns(h, wrapper):
    import dataclasses

    config = TrainingConfig(stack="hf", strategy="full_shard", engine="fsdp2", ac="full", seq_len=256, micro_batch=1,
                            reduce_dtype="fp32", load_mode="meta_init", checkpoint_wrapper=wrapper,
                            use_cache=wrapper)
    c = columns_for(_tiny(h), parse_gpus("8xh100-sxm"), config)
    # the CPU run: per-tensor AdamW, composite dropout, SDPA's flash kernel (compare_hf's CPU semantics)
    return dataclasses.replace(c, optimizer_impl=c.optimizer_impl * 0 + st.OPT_FOR_LOOP, fused_dropout=c.fused_dropout * 0,
                               sdpa_fp32_gqa_math=c.sdpa_fp32_gqa_math * 0)


def test_each_finished_block_leaves_its_kv_cache_and_norm_chain():
    for r in (r for r in RECORDS if r["config"]["ac"] == "full"):
        h = r["config"]["hidden_size"]
        temp = r["temp_at_each_block_backward_peak"]
        steps = [temp[str(k)] - temp[str(k + 1)] for k in range(len(temp) - 1) if str(k + 1) in temp]
        per_block = int(kv_cache_leftover_bytes(_columns(h, True), 2, 1, 1))
        # these tiny decoders have n_kv·d_head = h/2, where (8h + 4) + 8·n_kv·d_head is 12h + 4
        assert per_block == 256 * (8 * h + 4 + 8 * (h // 2)) == 256 * (12 * h + 4)
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
    """The H100 campaign checkpointed its FSDP runs with apply_activation_checkpointing and left
    use_cache on. With the KV cache counted at its size ((8h + 4) + 8·kv_width per token per
    finished block) the 10 runs are -10.5 .. -0.5 % on the allocated peak (median -2.9 %); the
    former 12·h + 4 read +13.0 % at 70B, whose kv_width is h/8. Asserted: what the mechanism claims
    (no run over-predicted: the former over-count came from a width the cache does not have) and
    the median, not the largest error."""
    import statistics

    rows = [r for r in compare_folder(DATA / "gpu")
            if r["kind"] == "fsdp" and r["ac"] != "none" and r["method"] == "full"]
    assert len(rows) == 10  # 8 runs + 2 expandable-segments reruns
    errors = [r["allocated_error"] for r in rows]
    assert max(errors) < 0.01, [round(e, 3) for e in errors]
    assert statistics.median(abs(e) for e in errors) < 0.05


def test_kv_cache_scales_with_kv_width_and_precision():
    """Per finished block and token: (8h + 4) + 8·n_kv·d_head at 16-bit, 12h + 4 + 16·n_kv·d_head at
    fp32; varied over n_kv (1, 2, 4 KV heads of 64) at h = 256, not only the h/2 points it was found on."""
    import dataclasses

    import numpy as np

    from shardplan.inputs import strategy as st

    h = 256
    for kv_heads in (1, 2, 4):
        spec = spec_from_hf_config(dict(model_type="llama", vocab_size=512, hidden_size=h, intermediate_size=344,
                                        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=kv_heads,
                                        max_position_embeddings=256, tie_word_embeddings=False), "tiny")
        config = TrainingConfig(stack="hf", strategy="full_shard", ac="full", seq_len=256, micro_batch=2,
                                checkpoint_wrapper=True, use_cache=True)
        c = columns_for(spec, parse_gpus("8xh100-sxm"), config)
        kv = kv_heads * 64
        assert int(kv_cache_leftover_bytes(c, 2, 3, 4)) == 3 * 512 * (8 * h + 4 + 8 * kv)
        c32 = dataclasses.replace(c, precision=np.asarray(st.FP32))
        assert int(kv_cache_leftover_bytes(c32, 4, 1, 4)) == 512 * (12 * h + 4 + 16 * kv)


def test_no_cache_without_use_cache_or_under_reentrant_checkpointing():
    import dataclasses

    import numpy as np

    c = _columns(128, True)
    assert int(kv_cache_leftover_bytes(c, 2, 3, 4)) > 0
    assert int(kv_cache_leftover_bytes(dataclasses.replace(c, use_cache=np.asarray(False)), 2, 3, 4)) == 0
    assert int(kv_cache_leftover_bytes(dataclasses.replace(c, reentrant_checkpointing=np.asarray(True)), 2, 3, 4)) == 0
    assert int(kv_cache_leftover_bytes(c, 2, 3, 0)) == 0  # no checkpointed block, no recomputation


def test_hf_stack_uses_the_wrapper_under_fsdp_only():
    from shardplan.inputs.stacks import resolve_stack

    assert resolve_stack(TrainingConfig(stack="hf"), 8).checkpoint_wrapper is True
    assert resolve_stack(TrainingConfig(stack="hf"), 8).use_cache is False  # Trainer/TRL turn the cache off
    assert resolve_stack(TrainingConfig(stack="hf"), 1).checkpoint_wrapper is False
    assert training_config({"kind": "hf", "method": "lora", "micro_batch": 1, "seq_len": 8}).checkpoint_wrapper is False


def test_leftovers_inside_each_block_backward_are_the_formula_at_that_many_finished_blocks():
    """The backward's moments scale one block's leftovers (``memory._leftover_after``) instead of
    calling ``kv_cache_leftover_bytes`` per block: equal at every block k, 16-bit and fp32."""
    import dataclasses

    import numpy as np

    from shardplan.formulas.activations import checkpointed_layers, compute_dtype_bytes
    from shardplan.formulas.memory import _leftover_after
    from shardplan.inputs import strategy as st

    for h in (128, 256):
        for precision in (st.BF16_MIXED, st.FP32):
            c = dataclasses.replace(_columns(h, True), precision=np.asarray(precision))
            a, n_ckpt = compute_dtype_bytes(c.precision), checkpointed_layers(c)
            ctx = {"leftover_per_block": kv_cache_leftover_bytes(c, a, 1, n_ckpt)}
            L = int(c.num_layers)
            for k in range(L):
                expected = int(kv_cache_leftover_bytes(c, a, L - 1 - k, n_ckpt))
                assert int(_leftover_after(c, k, ctx)) == expected, (h, precision, k)
                assert (expected > 0) == (k < L - 1)  # every block after k has left its intermediates
