"""The operations FSDP1 adds to an eager Hugging Face step, counted from the code that runs (issue 23,
the fsdp1 × LoRA / QLoRA classes): the tiny Llama of ``kernel_launches`` wrapped as the
fms-acceleration benchmark wraps it, run on the CPU under the same ``TorchDispatchMode``, against
the same model unwrapped; the difference is FSDP's.

How the benchmark wraps (the published fms-acceleration rows): accelerate's FSDP plugin
(``scripts/benchmarks/accelerate.yaml`` @876e2ed: FULL_SHARD, TRANSFORMER_BASED_WRAP, BACKWARD_PRE,
no forward prefetch, ``mixed_precision: 'no'``; accelerate 1.0.1 passes ``use_orig_params`` and
``limit_all_gathers`` True), and for a PEFT model fms-hf-tuning v2.5.0 ``tuning/sft_trainer.py``
line 390 replaces the policy by PEFT's ``fsdp_auto_wrap_policy``: the decoder layers, and every leaf
module whose weight requires grad, i.e. each ``lora_A`` and each ``lora_B`` Linear as a unit of its
own (peft ``utils/other.py`` ``lambda_policy_fn``). A LoRA model with n adapted Linears per layer
so has L·(1 + 2n) + 1 units where the full fine-tune has L + 1. Versions of the rows
(``scripts/benchmarks/refs/requirements.txt`` @24bdadb): torch 2.4.1, accelerate 1.0.1,
transformers 4.48.1, peft 0.13.2; counted here with the venv's torch (2.13), whose FSDP1
``_runtime_utils.py`` keeps the same per-unit structure (``_pre_forward`` → ``_unshard``: one
all-gather; ``_post_backward_hook`` → ``_reduce_grad``: pad/flatten + reduce-scatter).

A fake process group of world size 2 (torch ``testing/_internal/distributed/fake_pg.py``: the
collectives return at once) gives FULL_SHARD without sending anything. World size 1 is NO_SHARD
(FSDP1 ``_init_utils._init_process_group_state``: "FSDP is switching to use `NO_SHARD` ... since the
world size is 1"), which torch 2.13 cannot run with a frozen base under ``use_orig_params``
(``_use_sharded_views`` asserts on the views it made in forward): counted for the full fine-tune only.

    python -m shardplan.calibrate.fsdp1_launches     # per-step and per-layer operations FSDP1 adds
    python -m shardplan.calibrate.fsdp1_launches --time   # and its host time per unit, in operations

``clip_operations`` counts FSDP1's own ``clip_grad_norm_`` against torch's unwrapped one after the
same backward (``eager_host.fsdp1_clip_operations``).
ASSUMPTION: the optimizer over the original parameters is left as ``eager_host`` counts it; untied
embeddings (Mistral, Llama-2).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys

from shardplan.calibrate.kernel_launches import launch_counter, tiny_llama

PHASES = ("forward", "backward")
KEYS = PHASES + tuple(p + " hooks" for p in PHASES)


def fake_group(world_size: int) -> None:
    """A fake process group of ``world_size`` ranks in this process (re-made when the size changes)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        if dist.get_world_size() == world_size:
            return
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())


def fsdp1_wrapped(model, method: str):
    """``model`` under FSDP1 as accelerate + fms-hf-tuning wrap it (module docstring)."""
    import torch
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    if method == "full":
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
    else:
        from peft.utils.other import fsdp_auto_wrap_policy

        policy = fsdp_auto_wrap_policy(model)
    return FSDP(model, auto_wrap_policy=policy, use_orig_params=True, sharding_strategy=ShardingStrategy.FULL_SHARD,
                backward_prefetch=BackwardPrefetch.BACKWARD_PRE, limit_all_gathers=True,
                device_id=torch.device("cpu"))


# FSDP1's per-unit Python hooks (torch ``distributed/fsdp/_runtime_utils.py``): each call is one host
# operation, as ``eager_host`` counts a non-reentrant checkpoint hook
HOOKS = ("_pre_forward", "_post_forward", "_pre_backward_hook", "_post_backward_hook",
         "_post_backward_reshard_only_hook")


@contextlib.contextmanager
def hook_calls(counter):
    """Counts FSDP1's hook calls into ``counter.counts[phase + " hooks"]`` while active."""
    from torch.distributed.fsdp import _runtime_utils as rt
    from torch.distributed.fsdp import fully_sharded_data_parallel as fsdp_module

    originals = {name: getattr(rt, name) for name in HOOKS}

    def counted(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            counter.counts[counter.phase + " hooks"] += 1
            return fn(*args, **kwargs)
        return call

    try:
        for name, fn in originals.items():
            setattr(rt, name, counted(fn))
            if hasattr(fsdp_module, name):  # imported by name there
                setattr(fsdp_module, name, getattr(rt, name))
        yield counter
    finally:
        for name, fn in originals.items():
            setattr(rt, name, fn)
            if hasattr(fsdp_module, name):
                setattr(fsdp_module, name, fn)


def count_phases(layers: int, method: str, targets, fsdp: bool, checkpointing: bool = False,
                 world_size: int = 2) -> dict[str, int]:
    """Launching aten operators and FSDP1 hook calls (``"<phase> hooks"``) of one step's forward and
    backward (the second step), with or without FSDP1, and the FSDP unit count (``"units"``)."""
    import torch

    fake_group(world_size)
    model = tiny_llama(layers, method, checkpointing, targets, tied=False)
    model = fsdp1_wrapped(model, method) if fsdp else model
    model.train()
    ids = torch.randint(0, 128, (1, 16))
    counter = launch_counter()
    for _ in range(2):
        counter.counts.clear()
        with counter, hook_calls(counter):
            counter.phase = "forward"
            loss = model(input_ids=ids, labels=ids).loss
            counter.phase = "backward"
            loss.backward()
        model.zero_grad(set_to_none=True)
    units = sum(1 for m in model.modules() if type(m).__name__ == "FullyShardedDataParallel")
    return {**{k: counter.counts[k] for k in KEYS}, "units": units}


def clip_operations(layers: int, method: str, targets, fsdp: bool, world_size: int = 2) -> tuple[int, int]:
    """(operations, local gradients) of one gradient clipping after a backward: FSDP1's
    ``clip_grad_norm_`` on the wrapped model (rank 0 of ``world_size``), or torch's
    ``nn.utils.clip_grad_norm_`` over the trainable parameters of the unwrapped one."""
    import torch

    fake_group(world_size)
    model = tiny_llama(layers, method, False, targets, tied=False)
    model = fsdp1_wrapped(model, method) if fsdp else model
    ids = torch.randint(0, 128, (1, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    counter = launch_counter()
    with counter:
        if fsdp:
            model.clip_grad_norm_(1.0)
        else:
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    return counter.counts["forward"], sum(1 for p in model.parameters() if p.grad is not None)


def fsdp1_added(layers: int, method: str, targets, checkpointing: bool = False, world_size: int = 2) -> dict[str, int]:
    """Operations FSDP1 adds per phase (wrapped − unwrapped) and the unit count."""
    plain = count_phases(layers, method, targets, False, checkpointing, world_size)
    wrapped = count_phases(layers, method, targets, True, checkpointing, world_size)
    return {**{k: wrapped[k] - plain[k] for k in KEYS}, "units": wrapped["units"]}


def timed_phases(layers: int, method: str, targets, fsdp: bool, steps: int = 12) -> tuple[float, float]:
    """Median host seconds of a forward and a backward of the tiny Llama on one CPU thread, with or
    without FSDP1 (no dispatch mode): the wall clock of the Python and the CPU kernels together."""
    import statistics
    import time

    import torch

    fake_group(2)
    torch.set_num_threads(1)
    model = tiny_llama(layers, method, False, targets, tied=False)
    model = fsdp1_wrapped(model, method) if fsdp else model
    model.train()
    ids = torch.randint(0, 128, (1, 16))
    forward, backward = [], []
    for i in range(steps):
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        if i >= 2:
            forward.append(t1 - t0)
            backward.append(t2 - t1)
    return statistics.median(forward), statistics.median(backward)


def hook_cost_in_operations(layers: int = 4, targets=("q_proj", "k_proj", "v_proj", "o_proj")) -> dict[str, float]:
    """FSDP1's host seconds per unit, in units of the unwrapped step's host seconds per counted
    operation (same CPU, same thread): how many "operations" one unit's FSDP work costs."""
    out = {}
    for method, t in (("full", "all-linear"), ("lora", list(targets))):
        plain, wrapped = timed_phases(layers, method, t, False), timed_phases(layers, method, t, True)
        counts, units = count_phases(layers, method, t, False), count_phases(layers, method, t, True)["units"]
        for i, phase in enumerate(PHASES):
            per_op = plain[i] / counts[phase]
            out[f"{method} {phase}"] = (wrapped[i] - plain[i]) / units / per_op
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time", action="store_true", help="also time FSDP1's host work per unit on this CPU")
    args = ap.parse_args(argv)
    if args.time:
        print("FSDP1 host time per unit, in counted operations of the unwrapped step:", hook_cost_in_operations())
    cases = (("full", "all-linear", False), ("full", "all-linear", True), ("lora", ["q_proj", "v_proj"], False),
             ("lora", ["q_proj", "k_proj", "v_proj", "o_proj"], False),
             ("lora", ["q_proj", "k_proj", "v_proj", "o_proj"], True), ("lora", "all-linear", False))
    for method, targets, ckpt in cases:
        one, two = fsdp1_added(1, method, targets, ckpt), fsdp1_added(2, method, targets, ckpt)
        per_layer = {k: two[k] - one[k] for k in two}
        per_step = {k: one[k] - per_layer[k] for k in one}
        print(method, targets, "ckpt" if ckpt else "no-ckpt", "per step", per_step, "per layer", per_layer)
    full_ns = fsdp1_added(2, "full", "all-linear", world_size=1)
    print("full, world size 1 (NO_SHARD), 2 layers:", full_ns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
