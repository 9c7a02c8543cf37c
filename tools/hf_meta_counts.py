"""Count the parameters of Hugging Face causal LMs built on the meta device (no weights, no network).

Usage: python tools/hf_meta_counts.py tests/data/hf_configs_new.json tests/data/hf_model_counts_new.csv

Each entry's ``config`` is its published config.json (see the entry's ``source``). The config is
completed by ``transformers.AutoConfig.for_model``; a multimodal config (Gemma 3, Llama 4) is reduced
to its ``text_config``, the decoder a causal-LM fine-tune trains (the vision tower is not counted).
The model is built with ``AutoModelForCausalLM.from_config`` under ``torch.device("meta")``
(``accelerate.init_empty_weights`` un-ties embeddings in transformers 5; the meta device does not).
Needs the ``calibrate`` extra (torch) and transformers; output is committed, tests read the CSV.
"""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path

COLUMNS = [
    "model", "config_class", "model_class", "total_params", "embedding_params", "lm_head_params",
    "lm_head_tied_to_embedding", "position_embedding_params", "other_non_block_params", "num_blocks", "block_class",
    "block0_params", "block_params_min", "block_params_max", "distinct_block_sizes", "sum_block_params",
    "non_embedding_params", "largest_module_params_direct", "largest_module_name_direct", "moe_num_experts",
    "moe_experts_per_token", "moe_layers", "moe_routed_expert_params_total", "active_params_per_token",
    "hidden_size", "vocab_size", "build_seconds", "config_source",
]


def text_config(config):
    """The decoder's config: ``text_config`` for multimodal wrappers, else the config itself."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def count(entry: dict) -> dict:
    import torch
    import transformers

    raw = dict(entry["config"])
    config = text_config(transformers.AutoConfig.for_model(raw.pop("model_type"), **raw))
    start = time.perf_counter()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    seconds = time.perf_counter() - start

    total = sum(p.numel() for p in model.parameters())  # parameters() deduplicates tied tensors
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    tied = head is embed
    blocks = model.model.layers
    block_sizes = [sum(p.numel() for p in b.parameters()) for b in blocks]
    position = 0  # none of these families learns position embeddings
    other = total - embed.numel() - (0 if tied else head.numel()) - position - sum(block_sizes)

    direct = [(sum(p.numel() for p in m.parameters(recurse=False)), name) for name, m in model.named_modules()]
    largest, largest_name = max(direct)

    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None) \
        or getattr(config, "n_routed_experts", None)
    top_k = getattr(config, "num_experts_per_tok", None) if experts else None
    banks = [m for name, m in model.named_modules() if name.endswith("mlp.experts") or name.endswith("feed_forward.experts")]
    routed = sum(p.numel() for m in banks for p in m.parameters())
    active = total - round(routed * (experts - top_k) / experts) if experts else total
    return dict(
        config_class=type(config).__name__, model_class=type(model).__name__, total_params=total,
        embedding_params=embed.numel(), lm_head_params=head.numel(), lm_head_tied_to_embedding=tied,
        position_embedding_params=position, other_non_block_params=other, num_blocks=len(blocks),
        block_class=type(blocks[0]).__name__, block0_params=block_sizes[0], block_params_min=min(block_sizes),
        block_params_max=max(block_sizes), distinct_block_sizes=";".join(str(s) for s in sorted(set(block_sizes))),
        sum_block_params=sum(block_sizes),
        non_embedding_params=total - embed.numel() - (0 if tied else head.numel()) - position,
        largest_module_params_direct=largest, largest_module_name_direct=largest_name,
        moe_num_experts=experts or "", moe_experts_per_token=top_k or "", moe_layers=len(banks) if experts else "",
        moe_routed_expert_params_total=routed if experts else "", active_params_per_token=active,
        hidden_size=config.hidden_size, vocab_size=config.vocab_size, build_seconds=f"{seconds:.2f}",
        config_source=entry["source"],
    )


def main(configs_path: str, out_path: str) -> None:
    import transformers

    data = json.loads(Path(configs_path).read_text())
    if data["transformers_version"] != transformers.__version__:
        sys.exit(f"{configs_path} records transformers {data['transformers_version']}, "
                 f"this is {transformers.__version__}")
    rows = []
    for name, entry in data["models"].items():
        row = dict(model=name, **count(entry))
        rows.append(row)
        print(f"{name}: {row['total_params']:,} ({row['build_seconds']} s)")
    tmp = Path(out_path).with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(out_path)


if __name__ == "__main__":
    main(*sys.argv[1:3])
