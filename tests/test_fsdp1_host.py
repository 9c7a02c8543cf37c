"""FSDP1's host operations (``eager_host.fsdp1_operations``, issue 23): equal to what the code issues
on the CPU (``calibrate/fsdp1_launches``) and scaling with the units PEFT's wrap policy makes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from shardplan.calibrate.gpu_heldout import user_columns
from shardplan.formulas import eager_host as eh
from shardplan.inputs import strategy as st

FSDP1_LORA = {"ac": "none", "fsdp": 1, "kind": "user", "method": "lora", "micro_batch": 1, "model": "Llama-3.2-1B",
              "script": "trainer", "seq_len": 512, "use_cache": False, "world_size": 2}


def columns(layers: int, method: str = "lora", adapted: int = 2, ckpt: bool = False, world_size: int = 2):
    c = user_columns({**FSDP1_LORA, "method": method, "world_size": world_size, "ac": "hf" if ckpt else "none"})
    return replace(c, num_layers=np.asarray(layers), lora_adapted_linears=np.asarray(adapted))


def ops(c) -> tuple[float, float]:
    forward, backward = eh.fsdp1_operations(c)
    return float(forward), float(backward)


@pytest.mark.parametrize("layers, method, targets, ckpt, world_size", [
    (2, "full", "all-linear", False, 2),
    (1, "lora", ["q_proj", "v_proj"], False, 2),
    (2, "lora", ["q_proj", "k_proj", "v_proj", "o_proj"], True, 2),
    (2, "full", "all-linear", False, 1),  # NO_SHARD: hooks and the all-reduce, no gathers
])
def test_the_operations_are_what_fsdp1_issues(layers, method, targets, ckpt, world_size):
    """The formula equals the aten operators + hook calls FSDP1 adds to the tiny Llama on the CPU
    (wrapped − unwrapped), with layers, adapted Linears, checkpointing and world size varied. With
    checkpointing the root's pre-backward hook runs once more than counted (1 operation)."""
    pytest.importorskip("peft")
    from shardplan.calibrate.fsdp1_launches import fsdp1_added

    counted = fsdp1_added(layers, method, targets, ckpt, world_size)
    adapted = 0 if method == "full" else len(targets)
    c = columns(layers, method, adapted, ckpt, world_size)
    forward, backward = ops(c)
    assert counted["units"] == layers * (1 + 2 * adapted) + 1
    assert forward == counted["forward"] + counted["forward hooks"]
    assert abs(backward - (counted["backward"] + counted["backward hooks"])) <= (1 if ckpt else 0)


def test_the_operations_scale_with_units():
    """Each adapted Linear adds two units (lora_A, lora_B) per layer: 2·(hooks + gather) forward and
    2·(hooks + gather + reduction) backward per layer; layers scale every per-layer term."""
    f2, b2 = ops(columns(8, adapted=2))
    f4, b4 = ops(columns(8, adapted=4))
    per_unit_f = eh.FSDP1_HOOKS_FORWARD + eh.FSDP1_GATHER
    per_unit_b = eh.FSDP1_HOOKS_BACKWARD + eh.FSDP1_GATHER + eh.FSDP1_REDUCE
    assert (f4 - f2, b4 - b2) == (8 * 2 * 2 * per_unit_f, 8 * 2 * 2 * per_unit_b)
    f16, b16 = ops(columns(16, adapted=4))
    assert f16 - f4 == 8 * (1 + 8) * per_unit_f
    assert b16 - b4 == 8 * ((1 + 8) * (eh.FSDP1_HOOKS_BACKWARD + eh.FSDP1_GATHER) + 8 * eh.FSDP1_REDUCE)


def test_only_fsdp1_pays_and_world_size_one_gathers_nothing():
    c = columns(8, adapted=4)
    assert ops(replace(c, engine=np.asarray(st.FSDP2))) == (0.0, 0.0)
    f1, _ = ops(columns(8, adapted=4, world_size=1))
    assert f1 == (8 * 9 + 1) * eh.FSDP1_HOOKS_FORWARD
    f, b = ops(c)
    assert f > f1 and b > 0


def test_fsdp1_host_time_is_in_the_eager_step():
    """step_operations carries FSDP1's operations: the FSDP1 step has exactly them more than the
    same configuration under FSDP2."""
    c = columns(16, adapted=4, ckpt=True)
    one = [float(x) for x in eh.step_operations(c)]
    two = [float(x) for x in eh.step_operations(replace(c, engine=np.asarray(st.FSDP2)))]
    fwd, bwd = ops(c)
    assert (one[0] - two[0], one[1] - two[1], one[2] - two[2]) == (fwd, bwd, float(eh.fsdp1_clip_operations(c)))


@pytest.mark.parametrize("layers, targets", [(1, ["q_proj", "v_proj"]), (2, ["q_proj", "v_proj"]),
                                             (2, ["q_proj", "k_proj", "v_proj", "o_proj"])])
def test_fsdp1_clipping_is_three_operations_per_adapter_gradient(layers, targets):
    """FSDP1's ``clip_grad_norm_`` on the tiny Llama (fake process group, world size 2) issues 3
    operations per local gradient more than torch's foreach clip of the same gradients: every
    adapter tensor is a unit of its own, split over the ranks, so each rank clips all of them."""
    pytest.importorskip("peft")
    from shardplan.calibrate.fsdp1_launches import clip_operations

    wrapped, local = clip_operations(layers, "lora", targets, True)
    plain, _ = clip_operations(layers, "lora", targets, False)
    assert local == 2 * len(targets) * layers
    assert wrapped - plain == eh.FSDP1_CLIP_PER_GRAD * local
    assert float(eh.fsdp1_clip_operations(columns(layers, adapted=len(targets)))) == wrapped - plain


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_fsdp1_clipping_of_a_full_fine_tune_follows_the_shard(layers):
    """A full fine-tune clips the gradients of its shard of each unit's flat parameter: between T/N
    and T/N + units tensors (a tensor straddling a shard boundary is on both ranks), 3 operations
    each; the formula takes the upper end, and NO_SHARD (world size 1) all T."""
    pytest.importorskip("peft")
    from shardplan.calibrate.fsdp1_launches import clip_operations

    wrapped, local = clip_operations(layers, "full", "all-linear", True)
    plain, tensors = clip_operations(layers, "full", "all-linear", False)
    assert wrapped - plain == eh.FSDP1_CLIP_PER_GRAD * local
    assert tensors / 2 <= local <= tensors / 2 + layers + 1
    c = replace(columns(layers, "full"), param_tensors=np.asarray(tensors))
    assert float(eh.fsdp1_clip_operations(c)) == eh.FSDP1_CLIP_PER_GRAD * (tensors / 2 + layers + 1)
    one = replace(columns(layers, "full", world_size=1), param_tensors=np.asarray(tensors))
    assert float(eh.fsdp1_clip_operations(one)) == eh.FSDP1_CLIP_PER_GRAD * tensors
    assert float(eh.fsdp1_clip_operations(replace(c, engine=np.asarray(st.FSDP2)))) == 0.0
