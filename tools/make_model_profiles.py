"""Regenerate model_profiles/*.json from the published HF configs (run once; output is committed).

Usage: python tools/make_model_profiles.py PATH/TO/hf_configs.json
The configs are the kwargs of each model's published config.json (see tests/data/README.md).
"""

import json
import sys
from pathlib import Path

from shardplan.atomic_write import write_text_atomic
from shardplan.hf_config import spec_from_hf_config

OUT = Path(__file__).resolve().parents[1] / "shardplan" / "data" / "model_profiles"

MODEL_TYPES = {
    "LlamaConfig": "llama", "MistralConfig": "mistral", "MixtralConfig": "mixtral", "Qwen2Config": "qwen2",
    "Gemma2Config": "gemma2", "GPT2Config": "gpt2", "OPTConfig": "opt", "FalconConfig": "falcon",
    "DeepseekV2Config": "deepseek_v2",
}

# reference name -> (canonical name, aliases)
NAMES = {
    "Llama-2-7B": ("llama-2-7b", ["meta-llama/Llama-2-7b-hf"]),
    "Llama-2-13B": ("llama-2-13b", ["meta-llama/Llama-2-13b-hf"]),
    "Llama-2-70B": ("llama-2-70b", ["meta-llama/Llama-2-70b-hf"]),
    "Llama-3.1-8B": ("llama-3.1-8b", ["meta-llama/Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B"]),
    "Llama-3.1-70B": ("llama-3.1-70b", ["meta-llama/Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B"]),
    "Llama-3.1-405B": ("llama-3.1-405b", ["meta-llama/Llama-3.1-405B", "meta-llama/Meta-Llama-3.1-405B"]),
    "Mistral-7B-v0.1": ("mistral-7b-v0.1", ["mistralai/Mistral-7B-v0.1", "mistral-7b"]),
    "Mixtral-8x7B-v0.1": ("mixtral-8x7b", ["mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b-v0.1"]),
    "Qwen2.5-7B": ("qwen2.5-7b", ["Qwen/Qwen2.5-7B"]),
    "Qwen2.5-72B": ("qwen2.5-72b", ["Qwen/Qwen2.5-72B"]),
    "GPT-2-124M": ("gpt2", ["gpt2-124m", "gpt-2", "openai-community/gpt2"]),
    "GPT-2-XL": ("gpt2-xl", ["gpt-2-xl", "openai-community/gpt2-xl"]),
    "OPT-125m": ("opt-125m", ["facebook/opt-125m"]),
    "OPT-1.3B": ("opt-1.3b", ["facebook/opt-1.3b"]),
    "OPT-30B": ("opt-30b", ["facebook/opt-30b"]),
    "Falcon-7B": ("falcon-7b", ["tiiuae/falcon-7b"]),
    "Gemma-2-9B": ("gemma-2-9b", ["google/gemma-2-9b"]),
    "DeepSeek-V2-Lite": ("deepseek-v2-lite", ["deepseek-ai/DeepSeek-V2-Lite"]),
    "GPT-3-175B(gpt2-arch)": ("gpt3-175b", ["gpt-3-175b", "gpt3"]),
}


def main(path: str) -> None:
    models = json.loads(Path(path).read_text())["models"]
    for ref_name, entry in models.items():
        name, aliases = NAMES[ref_name]
        config = {"model_type": MODEL_TYPES[entry["config_class"]], **entry["kwargs"]}
        spec = spec_from_hf_config(config, name=name, display_name=ref_name.replace("(gpt2-arch)", ""),
                                   aliases=tuple(aliases), source=entry["source"])
        data = spec.model_dump(mode="json", exclude_none=True)
        write_text_atomic(OUT / f"{name}.json", json.dumps(data, indent=2) + "\n")
        print(f"{name}: {spec.total_params:,}")


if __name__ == "__main__":
    main(sys.argv[1])
