"""A QLoRA model prepared by PEFT's ``prepare_model_for_kbit_training`` (``kbit_prep``) keeps an fp32
block input under full checkpointing, unless FSDP's mixed precision casts the prepared parameters
back to 16-bit (more than one rank): ``activations.kept_input_bytes_per_token``."""

from __future__ import annotations

import pytest

from shardplan.formulas.activations import kept_input_bytes_per_token, kept_layer_bytes_per_token
from shardplan.inputs import strategy as st
from tests.helpers import columns

torch = pytest.importorskip("torch")
modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")


def test_an_fp32_norm_weight_makes_the_residual_stream_fp32():
    # prepare_model_for_kbit_training casts every non-4-bit parameter to fp32; transformers'
    # LlamaRMSNorm returns weight * hidden.to(input_dtype): bf16 in, fp32 out, and the residual add
    # of a bf16 block input and an fp32 branch is fp32 — the next block's (kept) input
    norm = modeling_llama.LlamaRMSNorm(64).to(torch.float32)
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    out = norm(x)
    assert out.dtype == torch.float32 and (x + out).dtype == torch.float32


@pytest.mark.parametrize("hidden", [2048, 4096, 8192])
def test_the_kept_input_is_fp32_on_one_rank_and_16_bit_under_fsdp_mixed_precision(hidden):
    knobs = dict(hidden_size=hidden, method=st.QLORA, precision=st.BF16_MIXED, ac=st.AC_FULL)
    one = columns("llama-2-7b", **knobs, kbit_prep=True, world_size=1, strategy=st.FULL_SHARD)
    single = columns("llama-2-7b", **knobs, kbit_prep=True, world_size=1, strategy=st.SINGLE)
    two = columns("llama-2-7b", **knobs, kbit_prep=True, world_size=2, strategy=st.FULL_SHARD)
    unprepared = columns("llama-2-7b", **knobs, world_size=1, strategy=st.FULL_SHARD)
    assert int(kept_input_bytes_per_token(one, 2)) == int(kept_input_bytes_per_token(single, 2)) == 4 * hidden
    assert int(kept_input_bytes_per_token(two, 2)) == int(kept_input_bytes_per_token(unprepared, 2)) == 2 * hidden
    assert int(kept_layer_bytes_per_token(one, 2)) == 4 * hidden  # full AC keeps the input only
    lora = columns("llama-2-7b", **{**knobs, "method": st.LORA}, kbit_prep=True, world_size=1)
    assert int(kept_input_bytes_per_token(lora, 2)) == 2 * hidden  # not a 4-bit model: nothing prepared
