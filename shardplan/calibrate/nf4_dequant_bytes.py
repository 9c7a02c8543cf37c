"""Bytes one dequantization of a torchao ``NF4Tensor`` moves per weight, eager and compiled, and how
many times a compiled ``linear_nf4`` dequantizes with and without activation checkpointing
(``throughput.torchao_nf4_dequant_bytes_per_weight``, ``throughput.qlora_dequant_s``).

Eager: ``NF4Tensor.get_original_weight`` (what ``LinearNF4``'s ``weight.to(dtype)`` runs) under
``elementwise_bytes.byte_counter``. Compiled: ``linear_nf4`` forward and backward through inductor
(CPU backend) under ``compiled_bytes.fused_bytes_recorder``, one record per graph (forward, then
backward), the GEMMs left out; with ``checkpoint`` the call is wrapped in torch's non-reentrant
checkpoint as torchtune's activation checkpointing wraps each layer.

torchao is not a shardplan dependency: install the version a run used beside the venv, e.g.
``pip install --no-deps --target /tmp/tao torchao==0.6.1``, then

    PYTHONPATH=$PWD:/tmp/tao python -m shardplan.calibrate.nf4_dequant_bytes [out in]

ASSUMPTION: the CPU backend's fusion and the partitioner's save-or-recompute choice are the ones
the CUDA backend makes (both are decided before code generation).
"""

from __future__ import annotations

import sys


def eager_bytes_per_weight(out_features: int, in_features: int) -> float:
    """Element-wise bytes of one eager ``get_original_weight`` per weight."""
    import torch
    from torchao.dtypes.nf4tensor import to_nf4

    from shardplan.calibrate.elementwise_bytes import byte_counter

    weight = to_nf4(torch.randn(out_features, in_features, dtype=torch.bfloat16))
    counter = byte_counter()
    with counter:
        weight.get_original_weight()
    return sum(counter.bytes.values()) / (out_features * in_features)


def compiled_bytes_per_weight(out_features: int, in_features: int, checkpoint: bool, tokens: int = 64) -> list[float]:
    """Inductor's fused element-wise bytes per weight of ``linear_nf4`` forward and backward, per graph."""
    import torch
    import torch._inductor.config as inductor_config
    from torchao.dtypes.nf4tensor import linear_nf4, to_nf4

    from shardplan.calibrate.compiled_bytes import fused_bytes_recorder

    weight = to_nf4(torch.randn(out_features, in_features, dtype=torch.bfloat16))
    x = torch.randn(tokens, in_features, dtype=torch.bfloat16, requires_grad=True)

    def layer(t):
        if checkpoint:
            return torch.utils.checkpoint.checkpoint(lambda u: linear_nf4(u, weight), t, use_reentrant=False)
        return linear_nf4(t, weight)

    torch._dynamo.reset()
    records: list[int] = []
    with inductor_config.patch(force_disable_caches=True), fused_bytes_recorder(records):
        y = torch.compile(layer, fullgraph=True)(x)
        y.backward(torch.ones_like(y))
    return [r / (out_features * in_features) for r in records]


def main(argv: list[str]) -> int:
    from importlib.metadata import version

    out_features, in_features = (int(a) for a in argv) if argv else (1024, 2048)
    print(f"torchao {version('torchao')}, weight {out_features} x {in_features}")
    print(f"  eager get_original_weight: {eager_bytes_per_weight(out_features, in_features):.4f} B/weight")
    for checkpoint in (False, True):
        per_graph = compiled_bytes_per_weight(out_features, in_features, checkpoint)
        print(f"  compiled linear_nf4, checkpoint={checkpoint}: forward, backward graphs "
              + ", ".join(f"{b:.4f}" for b in per_graph) + " B/weight")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
