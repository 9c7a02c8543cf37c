"""FSDP1 with frozen decoder units under reentrant checkpointing keeps every finished block's input
and its gradient until the end of the backward (``activations.fsdp1_reentrant_held_bytes_per_token``).

Run on CPU: a Llama-shaped stack in bf16 with PEFT LoRA on q/k/v/o (the fms-acceleration rows'
adapters), wrapped as transformers' Trainer wraps a PEFT model (PEFT's ``fsdp_auto_wrap_policy``:
each adapter Linear its own unit, the decoder block another), FSDP1 FULL_SHARD with
``use_orig_params`` and BACKWARD_PRE on a fake process group, and transformers 4.4x's model loop
(``checkpoint(layer.__call__, hidden, use_reentrant=...)`` around the FSDP-wrapped block). The peak
bytes of two token counts give the per-token slope; FSDP1's minus the same model's without FSDP is
what the hook holds."""

import functools

import pytest

from shardplan.formulas.activations import fsdp1_reentrant_held_bytes_per_token
from shardplan.inputs import strategy as st
from tests.helpers import columns
from tests.test_loss_memory import LiveBytes

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
nn, F = torch.nn, torch.nn.functional
HEADS, VOCAB, SEQ, BF16 = 4, 64, 64, 2


class _Norm(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))

    def forward(self, x):  # transformers LlamaRMSNorm
        dtype, x = x.dtype, x.float()
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)


class _Block(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.norm1, self.norm2 = _Norm(h), _Norm(h)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(h, h, bias=False) for _ in range(4))
        self.up, self.down = nn.Linear(h, 3 * h, bias=False), nn.Linear(3 * h, h, bias=False)

    def forward(self, x):
        b, t, h = x.shape
        y = self.norm1(x)
        q, k, v = (p(y).view(b, t, HEADS, h // HEADS).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        x = x + self.o_proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, h))
        return x + self.down(F.silu(self.up(self.norm2(x))))


class _Model(nn.Module):
    def __init__(self, h, layers, reentrant):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, h)
        self.layers = nn.ModuleList(_Block(h) for _ in range(layers))
        self.head = nn.Linear(h, VOCAB, bias=False)
        self.reentrant = reentrant

    def forward(self, ids):
        x = self.embed(ids).requires_grad_()  # PEFT/Trainer's enable_input_require_grads
        for layer in self.layers:
            x = torch.utils.checkpoint.checkpoint(layer.__call__, x, use_reentrant=self.reentrant)
        return F.cross_entropy(self.head(x).float().flatten(0, 1), ids.flatten())


def _peak(h, layers, micro_batch, fsdp_world, reentrant=True):
    """Peak live bytes of the second training step (the first creates AdamW's states)."""
    from peft import LoraConfig, get_peft_model
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import _or_policy, lambda_auto_wrap_policy, transformer_auto_wrap_policy

    from shardplan.calibrate.fsdp1_launches import fake_group

    torch.manual_seed(0)
    model = get_peft_model(_Model(h, layers, reentrant).to(torch.bfloat16),
                           LoraConfig(r=8, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    if fsdp_world:
        fake_group(fsdp_world)  # the one helper, shared with test_fsdp1_host (re-made when the size differs)

        def adapter(module):  # peft utils/other.py fsdp_auto_wrap_policy's lambda_policy_fn
            return not list(module.children()) and getattr(module, "weight", None) is not None and module.weight.requires_grad
        policy = functools.partial(_or_policy, policies=[functools.partial(lambda_auto_wrap_policy, lambda_fn=adapter),
                                                         functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={_Block})])
        model = FSDP(model, auto_wrap_policy=policy, device_id=torch.device("cpu"), use_orig_params=True,
                     sharding_strategy=ShardingStrategy.FULL_SHARD, backward_prefetch=BackwardPrefetch.BACKWARD_PRE)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    ids = torch.randint(0, VOCAB, (micro_batch, SEQ))
    meter = LiveBytes()
    for step in range(2):
        with meter if step else torch.no_grad():
            if step:
                meter.start()
            with torch.enable_grad():
                model(ids).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return meter.peak - meter.base


def _held_per_token(h, layers, fsdp_world=2, reentrant=True):
    """FSDP1's per-token slope minus the unwrapped model's, between 2 and 4 sequences."""
    def slope(world):
        return (_peak(h, layers, 4, world, reentrant) - _peak(h, layers, 2, world, reentrant)) / (2 * SEQ)
    return slope(fsdp_world) - slope(0)


@pytest.mark.parametrize("h, layers", [(64, 4), (128, 4), (64, 8)])
def test_fsdp1_keeps_finished_blocks_inputs_and_gradients(h, layers):
    # at block 0's backward the L-1 finished blocks hold their input and gradient, less the gradient
    # in flight into block 0; the unwrapped run's peak is at block L-1 with L-1 inputs saved:
    # (L-1) + (L-2) - (L-1) = L-2 block inputs of a·h more per token
    assert _held_per_token(h, layers) == (layers - 2) * BF16 * h


def test_no_shard_holds_the_same_and_non_reentrant_holds_nothing():
    assert _held_per_token(64, 4, fsdp_world=1) == 2 * BF16 * 64
    assert _held_per_token(64, 4, reentrant=False) == 0


def test_the_formula_is_gated_as_the_hook_is_registered():
    held = dict(engine=st.FSDP1, strategy=st.FULL_SHARD, world_size=2, method=st.QLORA, reentrant_checkpointing=True,
                ac=st.AC_FULL)
    c = columns("llama-2-7b", **held)
    assert int(fsdp1_reentrant_held_bytes_per_token(c, BF16)) == BF16 * 4096
    for other in (dict(reentrant_checkpointing=False), dict(engine=st.FSDP2), dict(method=st.FULL),
                  dict(strategy=st.SINGLE, world_size=1), dict(ac=st.AC_NONE)):
        assert int(fsdp1_reentrant_held_bytes_per_token(columns("llama-2-7b", **{**held, **other}), BF16)) == 0
