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

    python -m shardplan.calibrate.compiled_bytes [h heads kv ffn] [--matrix-rope]   # compiled / eager

``--matrix-rope``: the block with fms's 2×2-matrix RoPE (``elementwise_bytes.matrix_rope_qk``),
plain real arithmetic that inductor fuses with its neighbours
(``throughput.COMPILED_MATRIX_ROPE_BLOCK_FRACTION``).

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


def measure_compiled(h: int, heads: int, kv_heads: int, ffn: int, tokens: int = 64, matrix_rope: bool = False) -> float:
    """Compiled element-wise bytes per token of one bf16 block, forward + backward."""
    import torch
    import torch._inductor.config as inductor_config

    from shardplan.calibrate.elementwise_bytes import block_inputs

    torch._dynamo.reset()
    block, x, freqs = block_inputs(h, heads, kv_heads, ffn, tokens, matrix_rope)
    records: list[int] = []
    with inductor_config.patch(force_disable_caches=True), fused_bytes_recorder(records):
        y = torch.compile(block, fullgraph=True)(x, freqs)
        y.backward(torch.ones_like(y))
    return sum(records) / tokens


def fraction(h: int, heads: int, kv_heads: int, ffn: int, matrix_rope: bool = False) -> float:
    """Compiled / eager element-wise bytes of one block, forward + backward."""
    from shardplan.calibrate.elementwise_bytes import measure

    eager = sum(measure(h, heads, kv_heads, ffn, matrix_rope=matrix_rope))
    return measure_compiled(h, heads, kv_heads, ffn, matrix_rope=matrix_rope) / eager


def main(argv: list[str]) -> int:
    matrix = "--matrix-rope" in argv
    numbers = [a for a in argv if a != "--matrix-rope"]
    shape = tuple(int(a) for a in numbers) if numbers else (512, 8, 8, 1536)
    rope = "fms 2x2-matrix" if matrix else "complex"
    print(f"h heads kv ffn {shape}, {rope} RoPE: compiled / eager element-wise bytes "
          f"{fraction(*shape, matrix_rope=matrix):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
