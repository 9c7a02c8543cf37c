"""The element-wise HBM bytes the time model prices for one eager block
(``throughput.layer_forward_elementwise_bytes``, × (1 + ``BACKWARD_ELEMENTWISE_FACTOR``)) against
the bytes every aten operator of a torchtitan-style block moves when it runs forward and backward
(``calibrate.elementwise_bytes``, TorchDispatchMode on the CPU, bf16). Nothing is fitted: the
model's counts come from reading the code op by op. The bounds are the model's claim: each block's
forward bytes within 5 % and the backward/forward ratio within 10 % of the factor, over shapes that
vary the width, the MLP width and the GQA ratio; halving the RMSNorm count or a factor of 3 fails."""

import pytest

from shardplan.formulas.throughput import BACKWARD_ELEMENTWISE_FACTOR, layer_forward_elementwise_bytes

pytest.importorskip("torch")


@pytest.mark.parametrize("h, heads, kv_heads, ffn", [(256, 8, 2, 768), (512, 8, 8, 1536)])
def test_eager_block_bytes_match_the_code(h, heads, kv_heads, ffn):
    from shardplan.calibrate.elementwise_bytes import measure

    fwd, bwd = measure(h, heads, kv_heads, ffn)
    model = float(layer_forward_elementwise_bytes(2, h, h, kv_heads * h // heads, ffn))
    assert fwd == pytest.approx(model, rel=0.05)
    assert bwd / fwd == pytest.approx(BACKWARD_ELEMENTWISE_FACTOR, rel=0.10)


def test_the_count_scales_with_what_it_names():
    # GQA's repeat_kv is paid only when kv < q; the MLP term grows with ffn; bytes scale with a
    base = float(layer_forward_elementwise_bytes(2, 512, 512, 512, 1536))
    # kv 512 -> 128: RoPE on k shrinks (20 B per element), repeat_kv appears (read kv + write q, 2 B each)
    assert float(layer_forward_elementwise_bytes(2, 512, 512, 128, 1536)) == pytest.approx(base - 20 * 384 + 2 * 2 * (128 + 512))
    assert float(layer_forward_elementwise_bytes(2, 512, 512, 512, 3072)) == pytest.approx(base + 5 * 2 * 1536)
    assert float(layer_forward_elementwise_bytes(4, 512, 512, 512, 1536)) == pytest.approx(2 * base)
