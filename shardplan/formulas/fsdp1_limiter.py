"""The host time FSDP1's rate limiter exposes when PEFT makes every adapter its own FSDP unit
(issue 23; the mechanism read in session 6, the price measured in session 7).

Mechanism (torch 2.4.1, the fms-acceleration rows' version, and 2.11, the measurement's): with
``limit_all_gathers`` (the default: ``FullyShardedDataParallel.__init__`` l.427 in 2.4.1; accelerate
1.0.1 ``FullyShardedDataParallelPlugin`` keeps it True and transformers 4.48.1 ``Trainer`` changes it
only when ``fsdp_config`` names it) each ``_unshard`` first blocks the host on the free event recorded
at the reshard two reshards back (``_runtime_utils._unshard`` / ``_reshard``,
``_limiter_utils._FreeEventQueue``: depth 2, one queue for every unit). PEFT's wrap policy
(peft 0.13.2 ``utils/other.py`` ``fsdp_auto_wrap_policy``) makes each ``lora_A`` / ``lora_B`` a unit,
so the host can run at most one adapted Linear ahead of the GPU: a layer is a chain of *cycles*, each
from one adapted Linear's ``lora_B`` reshard to the next, and a cycle whose host work is longer than
its GPU work leaves the GPU idle for the difference, which no later slack can win back. Exposure of a
pass = Σ over cycles max(0, host − GPU). Without the limiter the host may run arbitrarily far ahead
and a phase costs max(Σ host, Σ GPU) (``eager_host``'s overlap), which this sum never undercuts. At
world size 1 FSDP1 runs NO_SHARD (``_init_utils.py`` l.433–441): no reshard, no event, no term.

A cycle's GPU seconds: the layer's (``throughput.micro_batches_s``: compute + FSDP's copies per
layer) split over the layer's eight positions (q, k, v, the attention core, o, gate, up, down; the
reverse order in backward) by their time weights: 2·in·out FLOPs per token of each Linear at the
GEMM rate (twice in backward for a trainable one), the causal attention core's 2·seq·q_width (× 2.5
in backward) at the attention rate, and PEFT's adapter path (casts, dropout, scaling, add) of each
adapted Linear at the HBM rate; the rest of the element-wise work follows the split. A position that is not adapted joins the next adapted one's
cycle (wrapping to the next layer); without adapters (a full fine-tune) a layer is one cycle. Host
seconds: ``eager_host``'s counted operations of the layer (spread evenly over the positions) and of
each adapter (PEFT's and FSDP1's hooks, gather and reduction of its two units) × ``HOST_OP_S``, plus
``UNIT_SHARDED_HOST_S`` per unit per pass (forward, recompute, backward) for the layer unit and the
two adapter units of an adapted Linear.

ASSUMPTION: a sharded unit's unshard + reshard costs the host ``UNIT_SHARDED_HOST_S`` beyond its
counted operations, on every host: the price was calibrated on one H100 fake-process-group pair
(below) and the A100 rows ran torch 2.4.1 on another host. ASSUMPTION: the exposure of a cycle is
max(0, host − GPU); a one-operation-at-a-time host/GPU timeline of the same segments with the
depth-2 queue (a session-7 prototype, not shipped) differs from this sum by ≤ 15 ms a step on the
Mistral fms-acceleration rows and by +11 % on the fake-PG pair (the price below is calibrated on
this sum, not on the timeline).
ASSUMPTION: the limiter is on wherever FSDP1 shards (no ``limit_all_gathers`` knob: its default).
ASSUMPTION: ``hf`` stack only, where ``eager_host`` counts the host (0 elsewhere).
"""

from __future__ import annotations

import numpy as np

from shardplan.formulas import eager_host as eh
from shardplan.formulas.activations import recompute_fraction
from shardplan.inputs import strategy as st

# Host seconds of one sharded FSDP1 unit's unshard + reshard beyond its counted operations, per pass.
# Calibrated on one H100 fake-process-group pair (data/calibration/gpu/fsdp1world/fsdp1world.jsonl,
# README there): Mistral-7B PEFT LoRA r16 all-linear (481 units), seq 4096, micro-batch 2, FSDP1 +
# PEFT's wrap policy, no communication; world size 2 (FULL_SHARD) − world size 1 (NO_SHARD) =
# +0.591 s (fastest steps) / +0.668 s (median of steps 4–8). This value makes the time model's
# difference +0.59 s (fastest); the median pair gives UNIT_SHARDED_HOST_S_MEDIAN
# (``tests/test_fsdp1_limiter.py`` recomputes both). One pair: the only measurement; its
# fastest-to-median spread is the stated uncertainty.
UNIT_SHARDED_HOST_S = 730e-6
UNIT_SHARDED_HOST_S_MEDIAN = 811e-6
BACKWARD_ATTENTION_FACTOR = 2.5  # FlashAttention-2's backward: 2.5 forward matmuls (5 of 2)
# positions of a decoder layer in forward order; the attention core is never adapted
POSITIONS = ("q", "k", "v", "attn", "o", "gate", "up", "down")


def adapted_positions(c):
    """Per position (``POSITIONS``) a 0/1 column: adapted by PEFT (q, v, k as ``lora_qkv_adapted``
    counts them, o as the rest of the attention's, the MLP's three when ``lora_mlp_adapted``);
    all 0 for a full fine-tune."""
    lora = np.asarray(c.method) != st.FULL
    qkv = np.where(lora, np.asarray(c.lora_qkv_adapted, dtype=np.float64), 0.0)
    mlp = np.where(lora, np.asarray(c.lora_mlp_adapted, dtype=np.float64), 0.0)
    gate = mlp * np.asarray(c.gated_mlp, dtype=np.float64)
    mlp_linears = mlp * (2 + gate)
    o = np.clip(np.where(lora, np.asarray(c.lora_adapted_linears, dtype=np.float64), 0.0) - qkv - mlp_linears, 0, 1)
    return {"q": qkv >= 1, "k": qkv >= 3, "v": qkv >= 2, "attn": np.zeros_like(o, dtype=bool), "o": o >= 1,
            "gate": gate >= 1, "up": mlp >= 1, "down": mlp >= 1}


def position_weights(c, adapted, rates, backward=False):
    """Per position its share of the layer's GPU seconds (module docstring). ``rates``: seconds per
    GEMM FLOP, per attention-core FLOP, and the layer's PEFT adapter-path seconds per token (forward,
    backward: ``throughput.lora_adapter_pass_bytes`` at the HBM rate), which each adapted Linear
    takes in proportion to its in + out widths."""
    gemm_s, attn_s, (adapter_f, adapter_b) = rates
    h, s = np.asarray(c.hidden_size, dtype=np.float64), np.asarray(c.seq_len, dtype=np.float64)
    q_w, kv_w = np.asarray(c.q_width, dtype=np.float64), np.asarray(c.kv_width, dtype=np.float64)
    i_w, o_w = np.asarray(c.mlp_width, dtype=np.float64), np.asarray(c.attn_out_width, dtype=np.float64)
    gate = np.asarray(c.gated_mlp, dtype=np.float64)
    shape = {"q": (h, q_w), "k": (h, kv_w), "v": (h, kv_w), "o": (o_w, h), "gate": (h, gate * i_w),
             "up": (h, i_w), "down": (i_w, h)}
    widths = {p: np.where(adapted[p], i + o, 0.0) for p, (i, o) in shape.items()}
    all_widths = np.maximum(sum(widths.values()), 1.0)
    # a frozen Linear's backward is its input gradient (one GEMM), a trainable one's also its weight's
    grads = np.where(backward, np.where(np.asarray(c.method) == st.FULL, 2.0, 1.0), 1.0)
    adapter = adapter_b if backward else adapter_f
    w = {p: grads * 2 * i * o * gemm_s + adapter * widths[p] / all_widths for p, (i, o) in shape.items()}
    w["attn"] = 2 * s * q_w * attn_s * (BACKWARD_ATTENTION_FACTOR if backward else 1.0)
    total = sum(w.values())
    return {k: v / total for k, v in w.items()}


def pass_exposure_s(order, adapted, gpu, weights, host_layer, host_adapter, host_unit):
    """Σ over one layer's cycles of max(0, host − GPU) for one pass over ``order``: ``gpu`` the
    layer's GPU seconds, ``host_layer`` its counted host seconds outside the adapters (spread evenly),
    ``host_adapter`` an adapted Linear's (its two units included), ``host_unit`` the layer unit's.
    Positions after the last adapted one join the first adapted one's cycle (the next layer's); a
    layer with no adapted position is one cycle."""
    per_h = host_layer / len(order)
    gpu = np.asarray(gpu, dtype=np.float64)
    ahead, any_after = {}, np.zeros(np.shape(gpu), dtype=bool)
    for p in reversed(order):  # ahead[p]: an adapted position at or after p
        any_after = any_after | adapted[p]
        ahead[p] = any_after
    trail_h = host_unit + sum(np.where(ahead[p], 0.0, per_h) for p in order)
    trail_g = sum(np.where(ahead[p], 0.0, gpu * weights[p]) for p in order)
    carry_h, carry_g, exposed = trail_h, trail_g, np.zeros_like(gpu)
    for p in order:
        carry_h = carry_h + np.where(ahead[p], per_h + np.where(adapted[p], host_adapter, 0.0), 0.0)
        carry_g = carry_g + np.where(ahead[p], gpu * weights[p], 0.0)
        exposed = exposed + np.where(adapted[p], np.maximum(carry_h - carry_g, 0.0), 0.0)
        carry_h, carry_g = np.where(adapted[p], 0.0, carry_h), np.where(adapted[p], 0.0, carry_g)
    return exposed + np.where(any_after, 0.0, np.maximum(trail_h - trail_g, 0.0))


def limiter_exposure_s(c, forward_layer_s, backward_layer_s, rates):
    """(forward, backward) seconds per micro-batch the limiter adds beyond the GPU alone (module
    docstring): ``forward_layer_s`` / ``backward_layer_s`` one layer's GPU seconds (backward with its
    recompute); ``rates`` as ``position_weights``; 0 unless FSDP1 reshards after forward (FULL_SHARD, HYBRID_SHARD) over > 1 rank on
    the hf stack (SHARD_GRAD_OP frees nothing in forward; NO_SHARD never frees)."""
    layers = np.asarray(c.num_layers, dtype=np.float64)
    adapted = adapted_positions(c)
    fwd, bwd, rec, saved = eh.layer_operations(c)
    ckpt = recompute_fraction(c)
    hooks = ~np.asarray(c.reentrant_checkpointing, dtype=bool) * saved  # non-reentrant pack hooks
    n_a = sum(np.asarray(a, dtype=np.float64) for a in adapted.values())
    unit_f = eh.FSDP1_HOOKS_FORWARD + eh.FSDP1_GATHER
    unit_b = eh.FSDP1_HOOKS_BACKWARD + eh.FSDP1_GATHER
    price, op = UNIT_SHARDED_HOST_S, eh.HOST_OP_S
    full = np.asarray(c.method) == st.FULL
    w_f, w_b = position_weights(c, adapted, rates), position_weights(c, adapted, rates, backward=True)
    bwd_gpu = backward_layer_s - ckpt * forward_layer_s  # the recompute is the forward again
    fw = pass_exposure_s(POSITIONS, adapted, forward_layer_s, w_f, op * (fwd - eh.LORA_FORWARD * n_a + hooks),
                         op * (eh.LORA_FORWARD + 2 * unit_f) + 2 * price, op * unit_f + price)
    rc = pass_exposure_s(POSITIONS, adapted, forward_layer_s, w_f, op * (rec - eh.LORA_RECOMPUTE * n_a + hooks),
                         op * (eh.LORA_RECOMPUTE + 2 * unit_f) + 2 * price, op * unit_f + price)
    bw = pass_exposure_s(POSITIONS[::-1], adapted, bwd_gpu, w_b,
                         op * (bwd - eh.LORA_BACKWARD * n_a + hooks),
                         op * (eh.LORA_BACKWARD + 2 * (unit_b + eh.FSDP1_REDUCE)) + 2 * price,
                         op * (unit_b + eh.FSDP1_REDUCE * full) + price)
    reshards = (np.asarray(c.strategy) == st.FULL_SHARD) | (np.asarray(c.strategy) == st.HYBRID_SHARD)
    on = (np.asarray(c.engine) == st.FSDP1) & (np.asarray(c.stack) == st.HF) & reshards \
        & (np.asarray(c.world_size) > 1)
    return np.where(on, layers * fw, 0.0), np.where(on, layers * (ckpt * rc + bw), 0.0)
