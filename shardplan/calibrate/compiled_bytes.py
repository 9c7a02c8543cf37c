"""What torch.compile leaves of a decoder block's element-wise HBM traffic
(``throughput.COMPILED_BLOCK_ELEMENTWISE_FRACTION``): the torchtitan-style bf16 block of
``elementwise_bytes`` compiled by inductor (CPU backend), forward and backward, against its eager
bytes (``elementwise_bytes.measure``).

Inductor's scheduler decides which element-wise and reduction nodes fuse into one kernel; after
code generation each fused node reports the bytes it reads and writes
(``BaseSchedulerNode.get_read_write_buffers_sizes``). Summed over the generated (non-extern) nodes
of the forward and backward graphs, plus the non-GEMM fallback kernels (inductor generates no code
for complex arithmetic, so RoPE's complex multiply stays an aten kernel), that is the compiled
block's element-wise traffic. GEMMs and SDPA are extern kernels and left out, as in the eager count.

    python -m shardplan.calibrate.compiled_bytes [h heads kv ffn] [--rope-form FORM]   # compiled / eager

``--rope-form``: the block with another stack's RoPE (``elementwise_bytes.ROPE_QK``: ``matrix``,
fms's 2×2 matrix; ``pairs_fp32``, torchtune's; ``rotate_half``, Transformers'), plain real
arithmetic that inductor fuses with its neighbours (``throughput.compiled_block_fraction``).

The same recorder prices the LoRA adapter path inside a compiled block (``adapter_fraction``:
``throughput.COMPILED_ADAPTER_ELEMENTWISE_FRACTION``).

ASSUMPTION: the CPU backend's fusion decisions are the scheduler's shared ones; the Triton
backend's per-device heuristics may fuse somewhat differently (the constant takes the larger
measured fraction).
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

# extern kernels priced elsewhere (GEMMs, attention) or moving nothing (views: view_as_complex /
# view_as_real alias their input, as in the eager count)
NOT_ELEMENTWISE = ("mm", "addmm", "bmm", "flash", "attention", "view")
# the Linears torchtune's Llama 3.1 8B LoRA configs adapt (9bafd16fc llama3_1/8B_lora_single_device.yaml:
# lora_attn_modules q_proj, v_proj, output_proj; apply_lora_to_mlp), by the block's names
LORA_TARGETS = ("wq", "wv", "wo", "w1", "w2", "w3")


@contextmanager
def fused_bytes_recorder(records: list[int]):
    """While active, each graph inductor compiles appends its fused + fallback element-wise bytes."""
    import torch._inductor.graph as graph
    from torch._inductor.scheduler import ExternKernelSchedulerNode, NopKernelSchedulerNode

    original = graph.GraphLowering.codegen

    def codegen(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        total = 0
        for node in self.scheduler.nodes:
            if isinstance(node, NopKernelSchedulerNode):
                continue
            if isinstance(node, ExternKernelSchedulerNode):
                name = str(getattr(node.node, "python_kernel_name", None) or type(node.node).__name__)
                if any(k in name for k in NOT_ELEMENTWISE):
                    continue
            total += node.get_read_write_buffers_sizes()
        records.append(total)
        return out

    graph.GraphLowering.codegen = codegen
    try:
        yield records
    finally:
        graph.GraphLowering.codegen = original


def measure_compiled(h: int, heads: int, kv_heads: int, ffn: int, tokens: int = 64, rope_form: str = "complex") -> float:
    """Compiled element-wise bytes per token of one bf16 block, forward + backward."""
    from shardplan.calibrate.elementwise_bytes import block_inputs

    return _compiled_bytes(*block_inputs(h, heads, kv_heads, ffn, tokens, rope_form)) / tokens


def _compiled_bytes(fn, *inputs) -> int:
    """Fused + fallback element-wise bytes inductor generates for ``fn(*inputs)`` forward and backward."""
    import torch
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    records: list[int] = []
    with inductor_config.patch(force_disable_caches=True), fused_bytes_recorder(records):
        y = torch.compile(fn, fullgraph=True)(*inputs)
        y.backward(torch.ones_like(y))
    return sum(records)


def _eager_bytes(fn, *inputs) -> int:
    """Eager element-wise bytes of ``fn(*inputs)`` forward and backward (``elementwise_bytes.byte_counter``)."""
    import torch

    from shardplan.calibrate.elementwise_bytes import byte_counter

    counter = byte_counter()
    with counter:
        y = fn(*inputs)
        y.backward(torch.ones_like(y))
    return sum(counter.bytes.values())


def lora_block(h: int, heads: int, kv_heads: int, ffn: int, tokens: int, adapted=LORA_TARGETS):
    """(block, x, freqs): ``block_inputs``' block with its weights frozen and the Linears named in
    ``adapted`` wrapped as torchtune's ``LoRALinear`` (9bafd16fc ``modules/peft/lora.py``: ``out +
    (alpha / rank) * lora_b(lora_a(dropout(x)))``, dropout 0 = ``nn.Identity``), rank 8, alpha 16."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from shardplan.calibrate.elementwise_bytes import block_inputs

    class LoRALinear(nn.Module):
        def __init__(self, base: nn.Linear, rank: int = 8, alpha: float = 16.0):
            super().__init__()
            self.weight, self.scale = base.weight, alpha / rank
            self.lora_a = nn.Linear(base.in_features, rank, bias=False, dtype=torch.bfloat16)
            self.lora_b = nn.Linear(rank, base.out_features, bias=False, dtype=torch.bfloat16)

        def forward(self, x):
            return F.linear(x, self.weight) + self.scale * self.lora_b(self.lora_a(x))

    block, x, freqs = block_inputs(h, heads, kv_heads, ffn, tokens)
    block.requires_grad_(False)
    for name in adapted:
        setattr(block, name, LoRALinear(getattr(block, name)))
    return block, x, freqs


def adapter_fraction(h: int, heads: int, kv_heads: int, ffn: int, tokens: int = 64) -> float:
    """What inductor leaves of the LoRA adapter path's element-wise bytes (``throughput.
    COMPILED_ADAPTER_ELEMENTWISE_FRACTION``): (compiled adapted block − compiled frozen block) /
    (eager adapted block − eager frozen block), forward + backward. Both counts leave the GEMMs out,
    so the rank-r GEMMs' own reads and writes are in neither."""
    blocks = [lora_block(h, heads, kv_heads, ffn, tokens, adapted) for adapted in ((), LORA_TARGETS)]
    eager = [_eager_bytes(*b) for b in blocks]
    blocks = [lora_block(h, heads, kv_heads, ffn, tokens, adapted) for adapted in ((), LORA_TARGETS)]
    compiled = [_compiled_bytes(*b) for b in blocks]
    return (compiled[1] - compiled[0]) / (eager[1] - eager[0])


def cross_entropy_bytes_per_vocab(tokens: int = 64, vocab: int = 4000) -> float:
    """Element-wise bytes per token and vocabulary entry of torchtune's compiled loss
    (``CEWithChunkedOutputLoss.compute_cross_entropy`` @9bafd16fc: ``F.cross_entropy(logits.float(),
    labels, reduction="sum")``) on bf16 logits, forward + backward; the logits' own write (the
    output GEMM's) is not in it."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    logits = torch.randn(tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,))
    return _compiled_bytes(lambda x: F.cross_entropy(x.float(), labels, reduction="sum"), logits) / (tokens * vocab)


def fraction(h: int, heads: int, kv_heads: int, ffn: int, rope_form: str = "complex") -> float:
    """Compiled / eager element-wise bytes of one block, forward + backward."""
    from shardplan.calibrate.elementwise_bytes import measure

    eager = sum(measure(h, heads, kv_heads, ffn, rope_form=rope_form))
    return measure_compiled(h, heads, kv_heads, ffn, rope_form=rope_form) / eager


def main(argv: list[str]) -> int:
    from shardplan.calibrate.elementwise_bytes import ROPE_QK

    form = argv[argv.index("--rope-form") + 1] if "--rope-form" in argv else "complex"
    if form not in ROPE_QK:
        from shardplan.support.errors import ShardplanError
        raise ShardplanError("--rope-form", form, f"not one of {', '.join(ROPE_QK)}")
    numbers = [a for a in argv if a not in ("--rope-form", form)]
    shape = tuple(int(a) for a in numbers) if numbers else (512, 8, 8, 1536)
    print(f"h heads kv ffn {shape}, {form} RoPE: compiled / eager element-wise bytes "
          f"{fraction(*shape, rope_form=form):.3f}")
    print(f"  LoRA adapter path (torchtune LoRALinear): compiled / eager {adapter_fraction(*shape):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
