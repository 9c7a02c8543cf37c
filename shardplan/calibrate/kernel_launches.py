"""Kernel launches of one eager Hugging Face training step, counted from the code that runs
(issue 23 item 2): a tiny ``LlamaForCausalLM`` with the same module structure as the GPU runs
(SDPA attention, bf16 autocast, HF gradient checkpointing non-reentrant, PEFT LoRA r16 with
dropout, bitsandbytes ``Linear4bit`` after ``prepare_model_for_kbit_training``, fused AdamW,
Trainer's ``clip_grad_norm_(max_norm=1.0)``), run on the CPU under a ``TorchDispatchMode`` that
counts every aten operator that would launch a kernel (views, ``empty*`` and ``detach`` launch
none). The count of a phase does not depend on the tokens, only on the module structure; counted
for 1 and 2 layers, the difference is the per-layer count and the rest the per-step one.

    python -m shardplan.calibrate.kernel_launches        # prints the counts behind throughput's HOST_* constants

ASSUMPTION: one counted operator = one launch (a cuBLAS GEMM, an element-wise kernel, an SDPA
kernel); CUDA's multi-tensor kernels (fused AdamW, ``_foreach_norm``) launch once per chunk of
tensors: one per call here, as for the few tensors a LoRA step updates. Needs torch, transformers
and peft (the ``[calibrate]`` extra); QLoRA needs bitsandbytes' CPU backend.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

# aten operators that allocate or alias without a kernel (``OpOverload.is_view`` covers the views)
NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias",
             "lift_fresh", "_unsafe_view", "sym_size", "sym_stride", "sym_numel", "set_",
             "_record_function_enter_new", "_record_function_exit"}
# bitsandbytes 0.50.2 ``gemm_4bit`` on CUDA (``backends/cuda/ops.py``): past 512 tokens for a weight of
# >= 4M elements the heuristic ``_gemm_4bit_use_custom_cuda`` picks ``_dequant_linear_fallback``:
# the nested (double-quant) absmax's ``dequantize_blockwise`` + offset add, ``dequantize_4bit``,
# ``F.linear`` = 4 launches (the CPU kernel counted here is one fused operator)
# Dropout (PEFT's lora_dropout): on the CPU ``aten::dropout`` decomposes into bernoulli_, div_ and
# mul; on CUDA it is one ``native_dropout`` kernel (``is_fused_kernel_acceptable``, aten
# ``native/Dropout.cpp``): bernoulli_ and div_ launch nothing there, the mul stands for it.
CUDA_LAUNCHES = {"gemm_4bit": 4, "bernoulli_": 0, "div_": 0}
PHASES = ("forward", "backward", "optimizer")


def launch_counter():
    """A dispatch mode counting kernel-launching aten operators into ``.counts[phase]``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counting(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.phase, self.counts, self.ops = "forward", Counter(), Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if not (func.is_view or name in NO_KERNEL):
                n = CUDA_LAUNCHES.get(name, 1)
                self.counts[self.phase] += n
                self.ops[(self.phase, name)] += n
            return func(*args, **(kwargs or {}))

    return Counting()


def tiny_llama(layers: int, method: str, checkpointing: bool, targets: str = "all-linear", tied: bool = True):
    """Llama-3.2's structure at toy width (GQA 4 heads / 2 kv heads, gated MLP, tied embeddings unless
    ``tied`` is False, as Llama-2 and Mistral), PEFT wrapped as ``benchmarks/gpu_userscripts.py``
    ``with_adapters`` does."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128, tie_word_embeddings=tied, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg)
    if method == "qlora":
        model = quantized(model)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if method == "full":
        return model
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if method == "qlora":
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=checkpointing,
                                                gradient_checkpointing_kwargs={"use_reentrant": False})
    mods = {"qv": ["q_proj", "v_proj"], "all-linear": "all-linear"}[targets] if isinstance(targets, str) else list(targets)
    return get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=mods,
                                            task_type="CAUSAL_LM"))


def quantized(model):
    """Every block Linear replaced by a bitsandbytes ``Linear4bit`` (nf4, bf16 compute), as
    ``from_pretrained(quantization_config=BitsAndBytesConfig(load_in_4bit=True))`` leaves them."""
    import bitsandbytes as bnb
    import torch

    for block in model.model.layers:
        for parent in (block.self_attn, block.mlp):
            for name, lin in list(parent.named_children()):
                if isinstance(lin, torch.nn.Linear):
                    q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=False, compute_dtype=torch.bfloat16,
                                          quant_type="nf4")
                    q.weight = bnb.nn.Params4bit(lin.weight.data, requires_grad=False, quant_type="nf4")
                    setattr(parent, name, q.to("cpu"))
    return model


def count_step(layers: int, method: str, checkpointing: bool, targets: str = "all-linear") -> dict[str, int]:
    """Launches per phase of the second training step (the first builds optimizer state)."""
    import torch

    model = tiny_llama(layers, method, checkpointing, targets)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, fused=True)
    ids = torch.randint(0, 128, (1, 16))
    counter = launch_counter()
    for _ in range(2):
        counter.counts.clear()
        with counter:
            counter.phase = "forward"
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            counter.phase = "backward"  # Trainer: accelerator.backward, then clip_grad_norm_ (max_norm 1.0)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            counter.phase = "optimizer"
            opt.step()
            opt.zero_grad(set_to_none=True)
    return {p: counter.counts[p] for p in PHASES}


def per_layer(method: str, checkpointing: bool, targets: str = "all-linear") -> dict[str, tuple[int, int]]:
    """(per step, per layer) launches per phase: counted at 1 and 2 layers."""
    one, two = count_step(1, method, checkpointing, targets), count_step(2, method, checkpointing, targets)
    return {p: (one[p] - (two[p] - one[p]), two[p] - one[p]) for p in PHASES}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.parse_args(argv)
    for method, ckpt, targets in (("full", False, "all-linear"), ("full", True, "all-linear"),
                                  ("lora", False, "all-linear"), ("lora", True, "all-linear"),
                                  ("lora", True, "qv"), ("qlora", True, "all-linear")):
        print(method, "ckpt" if ckpt else "no-ckpt", targets, per_layer(method, ckpt, targets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
