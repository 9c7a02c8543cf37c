"""What a torchtune QLoRA Linear keeps for its backward, eager and under torch.compile
(``activations.nf4_compiled_saved_weight_bytes``): the bytes of the tensors autograd saves between
forward and backward, parameters left out, counted with ``torch.autograd.graph.saved_tensors_hooks``.

The module mirrors torchtune's ``LoRALinear`` with ``quantize_base=True`` (9bafd16fc / 30b8519e8
``torchtune/modules/peft/lora.py``: ``linear_nf4(input=x, weight=self.weight)`` on an
``nn.Parameter(to_nf4(linear.weight))`` plus ``lora_b(lora_a(x))``; the base weight frozen as
``set_trainable_params`` leaves it). torchao's ``LinearNF4`` (v0.6.1 ``dtypes/nf4tensor.py``
l.929-940) saves the NF4 weight (a parameter) and dequantizes it again in its backward; compiled,
AOTAutograd traces forward and backward into one joint graph and its partitioner chooses what
crosses. Cases: eager; compiled (one ``torch.compile`` of the module, inductor); compiled with the
module's call wrapped in a non-reentrant ``checkpoint`` inside the compiled region (torchtune before
torch 2.5: ``model.compile()`` over the checkpoint-wrapped layers). torchtune on torch >= 2.5
compiles each layer and wraps the compiled layer in the checkpoint, so its recomputation runs the
compiled forward, which saves what the ``compiled`` case saves, for one layer, until that layer's
backward: the ``checkpoint_outside_compiled`` case counts what that recomputation saves (torch's
non-reentrant ``_recomputation_hook``), what the layer holds during its backward.
``released_after_last_use``: whether the compiled backward frees a saved weight after its last use
(``activations.nf4_compiled_held_in_backward_bytes``).

torchao is not a shardplan dependency: install the version a run used beside the venv, e.g.
``pip install --no-deps --target /tmp/tao torchao==0.6.1``, then

    PYTHONPATH=$PWD:/tmp/tao python -m shardplan.calibrate.nf4_saved_weight [out.jsonl]

ASSUMPTION: the CPU backend's partitioner choice is the CUDA backend's (min-cut partitioning
happens before code generation, on the same joint graph).
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager

SHAPES = ((256, 512), (512, 1024), (1024, 1024))   # (out_features, in_features) of the 4-bit weight
TOKENS = (32, 128)
RANK = 8
CASES = ("eager", "compiled", "compiled_checkpoint_inside", "checkpoint_outside_compiled")


def lora_nf4_linear(out_features: int, in_features: int):
    """torchtune's ``LoRALinear(quantize_base=True)``, bf16, the base weight frozen."""
    import torch
    from torch import nn
    from torchao.dtypes.nf4tensor import linear_nf4, to_nf4

    class LoRANF4(nn.Module):
        def __init__(self):
            super().__init__()
            base = torch.randn(out_features, in_features, dtype=torch.bfloat16)
            self.weight = nn.Parameter(to_nf4(base), requires_grad=False)
            self.lora_a = nn.Linear(in_features, RANK, bias=False, dtype=torch.bfloat16)
            self.lora_b = nn.Linear(RANK, out_features, bias=False, dtype=torch.bfloat16)

        def forward(self, x):
            return linear_nf4(input=x, weight=self.weight) + 2.0 * self.lora_b(self.lora_a(x))

    return LoRANF4()


def _parameter_storages(module) -> set[int]:
    """Storages of every parameter, the NF4 weight's by its inner tensors (``__tensor_flatten__``)."""
    ptrs = set()
    for p in module.parameters():
        inner = p.__tensor_flatten__()[0] if hasattr(p, "__tensor_flatten__") else ()
        ptrs.update(getattr(p, n).untyped_storage().data_ptr() for n in inner)
        if not inner:
            ptrs.add(p.untyped_storage().data_ptr())
    return ptrs


@contextmanager
def _recording_recomputation(record):
    """Route what a non-reentrant checkpoint's recomputation saves through ``record`` too."""
    import torch.utils.checkpoint as ckpt

    original = ckpt._recomputation_hook

    class Recording(original):
        def __init__(self, *args):
            super().__init__(*args)
            inner = self.pack_hook
            self.pack_hook = lambda t: inner(record(t))

    ckpt._recomputation_hook = Recording
    try:
        yield
    finally:
        ckpt._recomputation_hook = original


def _layer_call(layer, case: str):
    """The layer as each case runs it (see the module docstring)."""
    import torch

    if case == "eager":
        return layer
    torch._dynamo.reset()
    if case == "compiled":
        return torch.compile(layer)
    if case == "compiled_checkpoint_inside":
        return torch.compile(lambda t: torch.utils.checkpoint.checkpoint(layer, t, use_reentrant=False))
    compiled = torch.compile(layer)
    return lambda t: torch.utils.checkpoint.checkpoint(compiled, t, use_reentrant=False)


def saved_bytes(out_features: int, in_features: int, tokens: int, case: str) -> dict:
    """Bytes saved for backward (unique storages, parameters excluded) by one forward of the layer
    (``checkpoint_outside_compiled``: by its recomputation in the backward)."""
    import torch

    torch.manual_seed(0)
    layer = lora_nf4_linear(out_features, in_features)
    params = _parameter_storages(layer)
    x = torch.randn(tokens, in_features, dtype=torch.bfloat16, requires_grad=True)
    call = _layer_call(layer, case)
    seen: dict[int, tuple] = {}

    def record(t):
        if hasattr(t, "__tensor_flatten__"):  # eager LinearNF4 saves the NF4 parameter itself
            return t
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = (t.untyped_storage().nbytes(), tuple(t.shape), str(t.dtype).removeprefix("torch."))
        return t

    outside = case == "checkpoint_outside_compiled"
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t if outside else record(t), lambda t: t):
        y = call(x)
    with _recording_recomputation(record if outside else lambda t: t):
        y.sum().backward()
    # what scales with the tokens: the layer input (saved by lora_a) and lora_a's output (by lora_b)
    per_token = [v for v in seen.values() if v[1] and v[1][0] == tokens]
    total = sum(v[0] for v in seen.values())
    token_bytes = sum(v[0] for v in per_token)
    return dict(case=case, out_features=out_features, in_features=in_features, tokens=tokens,
                saved_bytes=total, token_scaled_bytes=token_bytes,
                other_bytes_per_weight=round((total - token_bytes) / (out_features * in_features), 4),
                saved=sorted(f"{v[2]}{list(v[1])}" for v in seen.values()))


_PROBE: dict = {}


def _probe_ops():
    """An identity op whose backward calls an opaque op (``probe::mark``) that records which saved
    storages are alive: inductor calls it as a fallback kernel in the middle of the compiled backward."""
    import torch

    if _PROBE:
        return _PROBE
    _PROBE.update(refs=[], alive=[])

    @torch.library.custom_op("shardplan_probe::mark", mutates_args=(), schema="(Tensor x) -> Tensor")
    def mark(x: torch.Tensor) -> torch.Tensor:
        _PROBE["alive"].append([(shape, not ref.expired()) for shape, ref in _PROBE["refs"]])
        return x.clone()

    @torch.library.custom_op("shardplan_probe::ident", mutates_args=(), schema="(Tensor x) -> Tensor")
    def ident(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    mark.register_fake(torch.empty_like)
    ident.register_fake(torch.empty_like)
    ident.register_autograd(lambda ctx, grad: mark(grad))
    _PROBE["ident"] = ident
    return _PROBE


def released_after_last_use(tokens: int = 16) -> dict:
    """Compiled ``linear_nf4(ident(linear_nf4(x, W1)), W2)``: which saved bf16 weights are alive when
    the backward reaches ``ident`` (W2's input-gradient matmul done, W1's not yet)."""
    import torch
    from torch import nn
    from torch.multiprocessing.reductions import StorageWeakRef
    from torchao.dtypes.nf4tensor import linear_nf4, to_nf4

    probe = _probe_ops()
    probe["refs"].clear()
    probe["alive"].clear()
    w1 = nn.Parameter(to_nf4(torch.randn(256, 512, dtype=torch.bfloat16)), requires_grad=False)
    w2 = nn.Parameter(to_nf4(torch.randn(512, 256, dtype=torch.bfloat16)), requires_grad=False)
    torch._dynamo.reset()
    chain = torch.compile(lambda t: linear_nf4(probe["ident"](linear_nf4(t, w1)), w2))
    x = torch.randn(tokens, 512, dtype=torch.bfloat16, requires_grad=True)

    def pack(t):
        if not hasattr(t, "__tensor_flatten__"):
            probe["refs"].append((tuple(t.shape), StorageWeakRef(t.untyped_storage())))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = chain(x)
    y.sum().backward()
    alive = dict(probe["alive"][0])
    return dict(case="released_after_last_use", w1_alive=alive.get((256, 512)), w2_alive=alive.get((512, 256)))


def main(argv: list[str]) -> int:
    from importlib.metadata import version

    import torch

    from shardplan.support.atomic_write import write_text_atomic

    rows = []
    for case in CASES:
        for out_features, in_features in SHAPES:
            for tokens in TOKENS:
                row = saved_bytes(out_features, in_features, tokens, case)
                row.update(torch=torch.__version__, torchao=version("torchao"))
                print(json.dumps(row))
                rows.append(row)
    release = released_after_last_use()
    release.update(torch=torch.__version__, torchao=version("torchao"))
    print(json.dumps(release))
    rows.append(release)
    if argv:
        write_text_atomic(argv[0], "".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
