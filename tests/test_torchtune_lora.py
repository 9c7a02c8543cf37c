"""torchtune's LoRA as its code allocates it (issue 21: TTN033/TTN034, the README flags table).

* ``LoRALinear`` (torchtune ``modules/peft/lora.py`` at 1814feb17) keeps its adapters in the
  recipe dtype and casts nothing: ``lora_b(lora_a(dropout(x)))`` saves the layer's own 16-bit
  input, shared by the layers that read it, and each ``lora_a`` output — PEFT's fp32 input copies
  (``activations.lora_adapter_dtype_bytes``) do not exist on the torchtune stack. Measured on CPU
  with saved-tensor hooks on a replica block, hidden and MLP widths varied.
* A torchtune row's bf16 is the recipe's ``dtype: bf16`` (``runs.TORCHTUNE_RECIPE_DTYPE``):
  adapters, their gradients and AdamW states in bf16, 2 + 2 + 4 bytes per adapter weight.
* Under activation offloading a LoRA block being recomputed sees the inputs of only
  ``layers_on_device`` earlier blocks on the GPU, however many layers the model has.
"""

import numpy as np
import pytest

from shardplan.formulas import memory
from shardplan.formulas.activations import lora_recompute_bytes_per_token, lora_saved_bytes_per_token
from shardplan.formulas.model_states import model_states
from shardplan.inputs import strategy as st
from shardplan.validation.runs import express, read_runs
from tests.helpers import columns

torch = pytest.importorskip("torch")

B, S, RANK = 2, 32, 4
RUNS = "tests/data/published_runs/runs.csv"


class _TorchtuneLoRA(torch.nn.Module):
    """A frozen 16-bit Linear plus rank-``RANK`` adapters in the same dtype, forward as torchtune's."""

    def __init__(self, n_in, n_out, adapted=True):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n_out, n_in, dtype=torch.bfloat16), requires_grad=False)
        self.adapted = adapted
        self.lora_a = torch.nn.Linear(n_in, RANK, bias=False, dtype=torch.bfloat16)
        self.lora_b = torch.nn.Linear(RANK, n_out, bias=False, dtype=torch.bfloat16)

    def forward(self, x):
        out = torch.nn.functional.linear(x, self.weight)
        return out + 2.0 * self.lora_b(self.lora_a(x)) if self.adapted else out


def _block_saved_bytes(h, i, kv, adapted):
    """Distinct storages a gated block of such layers saves (parameters and the attention output,
    which SDPA saves anyway, left out)."""
    torch.manual_seed(0)
    q, k, v, o = (_TorchtuneLoRA(h, h, adapted), _TorchtuneLoRA(h, kv, adapted), _TorchtuneLoRA(h, kv, adapted),
                  _TorchtuneLoRA(h, h, adapted))
    gate, up, down = _TorchtuneLoRA(h, i, adapted), _TorchtuneLoRA(h, i, adapted), _TorchtuneLoRA(i, h, adapted)
    x = torch.randn(B, S, h, dtype=torch.bfloat16, requires_grad=True)
    attention_out = torch.randn(B, S, h, dtype=torch.bfloat16, requires_grad=True)
    left_out = {p.untyped_storage().data_ptr() for m in (q, k, v, o, gate, up, down) for p in m.parameters()}
    left_out.add(attention_out.untyped_storage().data_ptr())
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in left_out:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        normed = x * 1.0  # the attention norm's output (saves nothing: a constant factor)
        attn_in = q(normed) + k(normed).repeat(1, 1, h // kv) + v(normed).repeat(1, 1, h // kv)
        hidden = x + o(attention_out) + 0.0 * attn_in.sum()
        mlp_in = hidden * 1.0
        down(torch.nn.functional.silu(gate(mlp_in)) * up(mlp_in))
    return sum(seen.values())


def _lora_columns(stack, h, i, kv, **knobs):
    """One-GPU bf16 LoRA columns of a Llama-shaped model with these widths."""
    cfg = dict(hidden_size=h, mlp_width=i, kv_width=kv, q_width=h, attn_out_width=h, lora_rank_out=7 * RANK,
               lora_unique_in=2 * h + i, lora_adapted_in=6 * h + i - 2 * (h - kv), lora_adapted_linears=7)
    return columns(method=st.LORA, strategy=st.SINGLE, world_size=1, precision=st.BF16_PURE, stack=stack,
                   lora_dropout=0.0, **{**cfg, **knobs})


@pytest.mark.parametrize("h,i", [(64, 176), (128, 176), (64, 352)])
def test_torchtune_lora_saves_its_16_bit_inputs_and_no_fp32_copy(h, i):
    kv = h // 4
    measured = (_block_saved_bytes(h, i, kv, True) - _block_saved_bytes(h, i, kv, False)) / (B * S)
    a = np.asarray(2)
    torchtune = int(np.ravel(lora_saved_bytes_per_token(_lora_columns(st.TORCHTUNE, h, i, kv), a))[0])
    peft = int(np.ravel(lora_saved_bytes_per_token(_lora_columns(st.HF, h, i, kv), a))[0])
    assert torchtune == 2 * (2 * h + i) + 2 * 7 * RANK == measured  # norm outputs, the product, 7 lora_a outputs
    assert peft > torchtune  # PEFT's fp32 copies of every adapted input: the hf stack only


@pytest.mark.parametrize("row_id", ["TTN033", "TTN034", "TTN003"])
def test_torchtune_bf16_rows_read_the_recipe_dtype_and_hf_rows_do_not(row_id):
    rows = {r.row_id: r for r in read_runs(RUNS)}
    assert rows[row_id].config.precision == "bf16-pure"
    assert any("torchtune's dtype: bf16" in a for a in rows[row_id].assumed)
    hf = next(r for r in rows.values() if getattr(r, "config", None) is not None and r.config.stack == "hf"
              and r.config.method == "lora" and r.config.precision == "bf16-mixed")
    assert express(dict(hf.row)).config.precision == "bf16-mixed"


@pytest.mark.parametrize("rank", [8, 64])
def test_recipe_dtype_keeps_adapter_weights_gradients_and_adamw_states_in_bf16(rank):
    """2 + 2 + 4 bytes per adapter weight, whatever the rank (PEFT under bf16 mixed: 4 + 4 + 8)."""
    params = 7 * rank * 4096
    per_weight = {}
    for precision in (st.BF16_PURE, st.BF16_MIXED):
        s = model_states(columns(method=st.LORA, strategy=st.SINGLE, world_size=1, precision=precision,
                                 stack=st.TORCHTUNE, lora_params=params, total_params=10**9))
        trainable = {k: int(np.ravel(s[k])[0]) for k in ("grads", "optimizer_states")}
        per_weight[precision] = (trainable["grads"] + trainable["optimizer_states"]) / params
    assert per_weight[st.BF16_PURE] == 2 + 4 and per_weight[st.BF16_MIXED] == 4 + 8


@pytest.mark.parametrize("layers", [16, 32])
def test_offloaded_lora_recompute_keeps_two_block_inputs_whatever_the_depth(layers):
    """The moment the last block is recomputed at the start of its backward: under activation
    offloading its activations do not grow with the layers before it; without, by one block input
    (a·h per token) per layer."""
    def recompute_activations(n, offload):
        c = columns(method=st.LORA, strategy=st.SINGLE, world_size=1, precision=st.BF16_PURE, stack=st.TORCHTUNE,
                    ac=st.AC_FULL, activation_offload=offload, num_layers=n, micro_batch=2, seq_len=4096)
        acts = memory._activation_context(c)
        ctx = memory._backward_context(c, model_states(c), 1, np.int64(0), acts)
        ctx["lora_recompute"] = lora_recompute_bytes_per_token(c, acts["a"])
        return int(np.ravel(memory._backward_activation_bytes(c, n - 1, ctx, recompute=True))[0])

    block_input = 2 * 4096 * 2 * 4096  # a·h per token × tokens (Llama-2 7B's h, 2 × 4096 tokens)
    assert recompute_activations(layers, True) == recompute_activations(8, True)
    assert recompute_activations(layers, False) - recompute_activations(8, False) == (layers - 8) * block_input
