"""Invariants of the memory model (hypothesis), and vectorized == scalar evaluation."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as hs

from shardplan.formulas.activations import block_activation_bytes, compute_dtype_bytes, recompute_extra_bytes_per_token
from shardplan.formulas.columns import Columns
from shardplan.formulas.memory import BREAKDOWN_TERMS, estimate_memory
from shardplan.inputs import strategy as st
from tests.helpers import DEFAULT_KNOBS

STATE_KEYS = ("params", "grads", "grad_buckets", "master_params", "optimizer_states")


@hs.composite
def model_dims(draw):
    hidden = draw(hs.sampled_from([256, 512, 1024, 2048, 4096, 8192]))
    heads = draw(hs.sampled_from([4, 8, 16, 32]))
    kv = draw(hs.sampled_from([h for h in (1, 2, 4, 8, 16, 32) if heads % h == 0]))
    layers = draw(hs.integers(1, 96))
    vocab = draw(hs.integers(1000, 256_000))
    mlp = draw(hs.integers(hidden, 4 * hidden))
    head_dim = hidden // heads
    block = 2 * hidden * hidden + 2 * hidden * kv * head_dim + 3 * hidden * mlp + 2 * hidden
    root = 2 * vocab * hidden + hidden
    total = root + layers * block
    return dict(total_params=total, root_params=root, unit_params=block, largest_module_params=max(vocab * hidden, hidden * mlp),
                num_layers=layers, hidden_size=hidden, vocab_size=vocab, q_width=hidden, kv_width=kv * head_dim,
                attn_out_width=hidden, num_heads=heads, mlp_width=mlp, gated_mlp=True, layernorm=False,
                tied_embeddings=False, lora_params=layers * 16 * 4 * 2 * hidden, quantizable_params=layers * (block - 2 * hidden))


def build(dims, **knobs):
    values = {**DEFAULT_KNOBS, **dims}
    values.update(knobs)
    return Columns.build(**values)


def states(m):
    # persistent states + all gradients: the gradients in the peak's breakdown depend on the
    # moment (inside backward only the blocks already reduced hold sharded gradients)
    return int(m["model_state_bytes"])


@settings(max_examples=60, deadline=None)
@given(model_dims(), hs.sampled_from(list(range(len(st.STRATEGIES)))), hs.sampled_from([0, 1, 2]))
def test_more_shard_ranks_never_raise_model_states(dims, strategy, engine):
    if not st.is_valid(strategy, engine):
        return
    worlds = np.array([1, 2, 4, 8, 16, 64, 256, 1024])
    m = estimate_memory(build(dims, strategy=strategy, engine=engine, world_size=worlds, shard_group_size=worlds,
                              gpus_per_node=8))
    total = sum(m[k] for k in STATE_KEYS)
    assert np.all(np.diff(total) <= 0)


@settings(max_examples=60, deadline=None)
@given(model_dims(), hs.sampled_from([8, 64, 512]))
def test_strategy_ordering_of_model_states(dims, world):
    def at(strategy, engine):
        return states(estimate_memory(build(dims, strategy=strategy, engine=engine, world_size=world, shard_group_size=world)))
    for engine in (st.FSDP2, st.FSDP1):
        assert at(st.FULL_SHARD, engine) <= at(st.SHARD_GRAD_OP, engine) <= at(st.DDP, engine)
    ds = st.DEEPSPEED
    assert at(st.FULL_SHARD, ds) <= at(st.ZERO2, ds) <= at(st.ZERO1, ds) <= at(st.DDP, ds)
    # Across engines, as the engine declarations map them: full_shard ≤ shard_grad_op ≤ zero1 ≤ ddp.
    assert at(st.FULL_SHARD, st.FSDP2) <= at(st.SHARD_GRAD_OP, st.FSDP2) <= at(st.ZERO1, ds) <= at(st.DDP, st.FSDP2)


@settings(max_examples=60, deadline=None)
@given(model_dims(), hs.sampled_from([st.AC_FULL, st.AC_SELECTIVE, st.AC_EVERY_K]), hs.integers(1, 8),
       hs.sampled_from([128, 1024, 8192]), hs.sampled_from([st.SDPA, st.EAGER]))
def test_checkpointing_never_raises_activations(dims, ac, k, seq, attention):
    base_c = build(dims, seq_len=seq, attention=attention)
    ckpt_c = build(dims, seq_len=seq, attention=attention, ac=ac, ac_every_k=k)
    assert block_activation_bytes(ckpt_c) <= block_activation_bytes(base_c)
    base, ckpt = estimate_memory(base_c), estimate_memory(ckpt_c)
    # Measured (torch 2.13, 7B and tiny runs): inside a checkpointed block's backward its input,
    # kept by the checkpoint, coexists with the recomputed set (no AC frees the 16-bit input once
    # the norm saved its fp32 copy). When the peak is that moment and activations are small next
    # to gradients, AC can cost that one tensor more than no AC — never more.
    tokens = seq * int(ckpt_c.micro_batch)
    allowance = tokens * int(recompute_extra_bytes_per_token(ckpt_c, compute_dtype_bytes(ckpt_c.precision)))
    assert int(ckpt["peak_allocated_bytes"]) <= int(base["peak_allocated_bytes"]) + allowance


@settings(max_examples=60, deadline=None)
@given(model_dims(), hs.sampled_from(list(range(len(st.STRATEGIES)))), hs.sampled_from([0, 1, 2]),
       hs.sampled_from([st.OFFLOAD_OPTIMIZER, st.OFFLOAD_ALL]), hs.sampled_from([0, 1, 2]))
def test_offload_never_raises_gpu_bytes(dims, strategy, engine, offload, method):
    off = build(dims, strategy=strategy, engine=engine, offload=offload, method=method)
    m_off = estimate_memory(off)
    if not bool(m_off["valid"]):
        return
    m_on = estimate_memory(build(dims, strategy=strategy, engine=engine, method=method))
    assert int(m_off["peak_allocated_bytes"]) <= int(m_on["peak_allocated_bytes"])


def test_vectorized_equals_scalar_loop_on_1000_random_configurations():
    rng = np.random.default_rng(0)
    n = 1000
    hidden = rng.choice([512, 1024, 4096, 8192], n)
    heads = rng.choice([8, 16, 32], n)
    layers = rng.integers(1, 80, n)
    vocab = rng.integers(1000, 200_000, n)
    mlp = hidden * rng.integers(2, 4, n)
    block = 4 * hidden * hidden + 3 * hidden * mlp + 2 * hidden
    root = 2 * vocab * hidden + hidden
    world = rng.choice([1, 2, 4, 8, 16, 64], n)
    values = dict(
        total_params=root + layers * block, root_params=root, unit_params=block,
        largest_module_params=np.maximum(vocab * hidden, hidden * mlp), num_layers=layers, hidden_size=hidden,
        vocab_size=vocab, q_width=hidden, kv_width=hidden, attn_out_width=hidden, num_heads=heads, mlp_width=mlp,
        gated_mlp=rng.random(n) < 0.5, layernorm=rng.random(n) < 0.5, tied_embeddings=rng.random(n) < 0.5,
        lora_params=layers * 16 * 8 * hidden, quantizable_params=layers * (block - 2 * hidden),
        world_size=world, gpus_per_node=np.minimum(world, 8), gpu_memory_bytes=rng.choice([24, 40, 80], n) * 2**30,
        host_ram_bytes_per_node=rng.choice([128, 512, 2048], n) * 2**30, nccl_buffer_bytes=rng.choice([0, 2**28], n),
        strategy=rng.integers(0, len(st.STRATEGIES), n), engine=rng.integers(0, 3, n),
        precision=rng.integers(0, len(st.PRECISIONS), n), optimizer=rng.integers(0, len(st.OPTIMIZERS), n),
        ac=rng.integers(0, len(st.AC_MODES), n), ac_every_k=rng.integers(1, 5, n), offload=rng.integers(0, 3, n),
        method=rng.integers(0, 3, n), micro_batch=rng.integers(1, 9, n), seq_len=rng.choice([512, 2048, 8192], n),
        grad_accum=rng.integers(1, 4, n), shard_group_size=np.minimum(world, 8), attention=rng.integers(0, 2, n),
        dropout=rng.random(n) < 0.3,
    )
    vector = estimate_memory(Columns.build(**values))
    # the breakdown at the peak moment adds up to the peak, and the totals don't need it
    assert np.array_equal(sum(vector[k] for k in BREAKDOWN_TERMS), vector["peak_allocated_bytes"])
    totals_only = estimate_memory(Columns.build(**values), breakdown=False)
    assert np.array_equal(totals_only["peak_allocated_bytes"], vector["peak_allocated_bytes"])
    keys = list(BREAKDOWN_TERMS) + ["peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes",
                                    "host_bytes_per_node", "fits", "valid", "model_state_bytes"]
    for i in range(n):
        scalar = estimate_memory(Columns.build(**{k: v[i] for k, v in values.items()}))
        for key in keys:
            assert scalar[key] == vector[key][i], (i, key)


@settings(max_examples=40, deadline=None)
@given(model_dims(), hs.sampled_from([0, 1, 2]), hs.sampled_from([st.BF16_MIXED, st.FP16_MIXED, st.BF16_PURE, st.FP32]),
       hs.sampled_from([2, 8, 64]))
def test_deepspeed_ddp_and_no_shard_are_one_engine_stage_0(dims, method, precision, world):
    # data/engine_profiles/deepspeed.json framework names: DeepSpeed runs both as stage 0, so every byte and every collective agree
    # (they did not: PEFT's fp32 input casts and no reduce bucket were charged to 'ddp' as if torch DDP)
    from shardplan.formulas.comm import comm_volume

    ddp = build(dims, strategy=st.STRATEGIES.index("ddp"), engine=st.ENGINES.index("deepspeed"), method=method,
                precision=precision, world_size=world)
    no_shard = build(dims, strategy=st.STRATEGIES.index("no_shard"), engine=st.ENGINES.index("deepspeed"),
                     method=method, precision=precision, world_size=world)
    m_ddp, m_ns = estimate_memory(ddp), estimate_memory(no_shard)
    for term in (*BREAKDOWN_TERMS, "peak_allocated_bytes"):
        assert int(m_ddp[term]) == int(m_ns[term]), term
    v_ddp, v_ns = comm_volume(ddp), comm_volume(no_shard)
    for key in v_ddp:
        assert np.array_equal(np.asarray(v_ddp[key]), np.asarray(v_ns[key])), key


def test_fsdp_units_has_the_same_terms_with_and_without_fsdp_rows():
    """``buffers.fsdp_units`` answers a batch without FSDP rows with zeros: the same keys as with
    FSDP rows (``FSDP_UNIT_TERMS`` is the list it fills), every term zero (no Python branch on the
    rows' values: the sizes are computed and masked)."""
    from shardplan.formulas.buffers import FSDP_UNIT_TERMS, fsdp_units
    from shardplan.formulas.columns import columns_for
    from shardplan.inputs.config import TrainingConfig
    from shardplan.inputs.hardware import parse_gpus
    from shardplan.inputs.models import get_model

    spec, cluster = get_model("llama-3.1-8b"), parse_gpus("8xh100-sxm")
    with_fsdp = fsdp_units(columns_for(spec, cluster, TrainingConfig(strategy="full_shard", engine="fsdp1")), 8)
    without = fsdp_units(columns_for(spec, cluster, TrainingConfig(strategy="ddp")), 8)
    assert with_fsdp.keys() == without.keys() == set(FSDP_UNIT_TERMS) | {"keep_unsharded", "fsdp", "fsdp1_buffers"}
    assert all(int(without[k]) == 0 for k in FSDP_UNIT_TERMS)
    assert int(with_fsdp["block_unsharded"]) > 0 and with_fsdp["fsdp1_buffers"] is not None
