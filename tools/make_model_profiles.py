"""Regenerate model_profiles/*.json from the published HF configs (run once; output is committed).

Usage: python tools/make_model_profiles.py PATH/TO/hf_configs.json [MODEL ...]
Two layouts (see tests/data/README.md): tests/data/hf_configs.json holds each model's config
kwargs with its ``config_class``; tests/data/hf_configs_new.json holds each model's config.json
(``model_type`` included, multimodal ones with their ``text_config``). Naming models writes only
those profiles. Run it with transformers installed so defaults come from transformers' classes.
"""

import json
import sys
from pathlib import Path

from shardplan.inputs.hf_config import spec_from_hf_config
from shardplan.inputs.profile_index import write_index
from shardplan.support.atomic_write import write_text_atomic

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
    "Llama-3.1-8B": ("llama-3.1-8b", ["meta-llama/Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B",
                                      "deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "deepseek-r1-distill-llama-8b"]),
    "Llama-3.1-70B": ("llama-3.1-70b", ["meta-llama/Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B"]),
    "Llama-3.1-405B": ("llama-3.1-405b", ["meta-llama/Llama-3.1-405B", "meta-llama/Meta-Llama-3.1-405B"]),
    "Mistral-7B-v0.1": ("mistral-7b-v0.1", ["mistralai/Mistral-7B-v0.1", "mistral-7b"]),
    "Mixtral-8x7B-v0.1": ("mixtral-8x7b", ["mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b-v0.1"]),
    "Qwen2.5-7B": ("qwen2.5-7b", ["Qwen/Qwen2.5-7B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
                                  "deepseek-r1-distill-qwen-7b"]),
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
    # tests/data/hf_configs_new.json
    "Meta-Llama-3-8B": ("llama-3-8b", ["meta-llama/Meta-Llama-3-8B", "meta-llama/Meta-Llama-3-8B-Instruct"]),
    "Meta-Llama-3-70B": ("llama-3-70b", ["meta-llama/Meta-Llama-3-70B", "meta-llama/Meta-Llama-3-70B-Instruct"]),
    "Llama-3.2-1B": ("llama-3.2-1b", ["meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-1B-Instruct"]),
    "Llama-3.2-3B": ("llama-3.2-3b", ["meta-llama/Llama-3.2-3B", "meta-llama/Llama-3.2-3B-Instruct"]),
    "Llama-3.3-70B": ("llama-3.3-70b", ["meta-llama/Llama-3.3-70B-Instruct", "deepseek-ai/DeepSeek-R1-Distill-Llama-70B",
                                        "deepseek-r1-distill-llama-70b"]),
    "Qwen3-0.6B": ("qwen3-0.6b", ["Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B-Base"]),
    "Qwen3-1.7B": ("qwen3-1.7b", ["Qwen/Qwen3-1.7B", "Qwen/Qwen3-1.7B-Base"]),
    "Qwen3-4B": ("qwen3-4b", ["Qwen/Qwen3-4B", "Qwen/Qwen3-4B-Base"]),
    "Qwen3-8B": ("qwen3-8b", ["Qwen/Qwen3-8B", "Qwen/Qwen3-8B-Base"]),
    "Qwen3-14B": ("qwen3-14b", ["Qwen/Qwen3-14B", "Qwen/Qwen3-14B-Base"]),
    "Qwen3-32B": ("qwen3-32b", ["Qwen/Qwen3-32B"]),
    "Qwen3-30B-A3B": ("qwen3-30b-a3b", ["Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B-Base"]),
    "Gemma-3-1B": ("gemma-3-1b", ["google/gemma-3-1b-pt", "google/gemma-3-1b-it"]),
    "Gemma-3-4B": ("gemma-3-4b", ["google/gemma-3-4b-pt", "google/gemma-3-4b-it"]),
    "Gemma-3-12B": ("gemma-3-12b", ["google/gemma-3-12b-pt", "google/gemma-3-12b-it"]),
    "Gemma-3-27B": ("gemma-3-27b", ["google/gemma-3-27b-pt", "google/gemma-3-27b-it"]),
    "Phi-3-mini-4k": ("phi-3-mini", ["microsoft/Phi-3-mini-4k-instruct", "phi-3-mini-4k"]),
    "Phi-3-medium-4k": ("phi-3-medium", ["microsoft/Phi-3-medium-4k-instruct", "phi-3-medium-4k"]),
    "Phi-4": ("phi-4", ["microsoft/phi-4"]),
    "Mistral-Nemo-12B": ("mistral-nemo-12b", ["mistralai/Mistral-Nemo-Base-2407", "mistralai/Mistral-Nemo-Instruct-2407",
                                              "mistral-nemo"]),
    "Mistral-Small-24B-2501": ("mistral-small-24b", ["mistralai/Mistral-Small-24B-Base-2501",
                                                     "mistralai/Mistral-Small-24B-Instruct-2501", "mistral-small-24b-2501"]),
    "Llama-4-Scout-17B-16E": ("llama-4-scout", ["meta-llama/Llama-4-Scout-17B-16E",
                                                "meta-llama/Llama-4-Scout-17B-16E-Instruct"]),
    "Llama-4-Maverick-17B-128E": ("llama-4-maverick", ["meta-llama/Llama-4-Maverick-17B-128E",
                                                       "meta-llama/Llama-4-Maverick-17B-128E-Instruct"]),
    "OLMo-2-7B": ("olmo-2-7b", ["allenai/OLMo-2-1124-7B", "olmo-2-1124-7b"]),
    "Granite-3.1-8B": ("granite-3.1-8b", ["ibm-granite/granite-3.1-8b-base", "ibm-granite/granite-3.1-8b-instruct"]),
    "DeepSeek-V3": ("deepseek-v3", ["deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V3-Base"]),
    # tests/data/hf_configs_2025.json (issue 22 item 10). DeepSeek-R1's distills are fine-tunes of these
    # architectures (R1 paper §2.4: Qwen2.5-Math-1.5B/7B, Qwen2.5-14B/32B, Llama-3.1-8B, Llama-3.3-70B-Instruct);
    # their configs keep the base's shape fields, so they are aliases of it (the 7B: qwen2.5-7b.json, 8B:
    # llama-3.1-8b.json, 70B: llama-3.3-70b.json carry those aliases).
    "Qwen2.5-0.5B": ("qwen2.5-0.5b", ["Qwen/Qwen2.5-0.5B"]),
    "Qwen2.5-1.5B": ("qwen2.5-1.5b", ["Qwen/Qwen2.5-1.5B"]),
    "Qwen2.5-3B": ("qwen2.5-3b", ["Qwen/Qwen2.5-3B"]),
    "Qwen2.5-14B": ("qwen2.5-14b", ["Qwen/Qwen2.5-14B",
                                    "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B", "deepseek-r1-distill-qwen-14b"]),
    "Qwen2.5-32B": ("qwen2.5-32b", ["Qwen/Qwen2.5-32B",
                                    "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "deepseek-r1-distill-qwen-32b"]),
    "Gemma-2-2B": ("gemma-2-2b", ["google/gemma-2-2b"]),
    "Gemma-2-27B": ("gemma-2-27b", ["google/gemma-2-27b"]),
    "OLMo-2-1B": ("olmo-2-1b", ["allenai/OLMo-2-0425-1B", "olmo-2-0425-1b"]),
    "OLMo-2-13B": ("olmo-2-13b", ["allenai/OLMo-2-1124-13B", "olmo-2-1124-13b"]),
    "OLMo-2-32B": ("olmo-2-32b", ["allenai/OLMo-2-0325-32B", "olmo-2-0325-32b"]),
    "SmolLM2-135M": ("smollm2-135m", ["HuggingFaceTB/SmolLM2-135M", "HuggingFaceTB/SmolLM-135M", "smollm-135m"]),
    "SmolLM2-360M": ("smollm2-360m", ["HuggingFaceTB/SmolLM2-360M", "HuggingFaceTB/SmolLM-360M", "smollm-360m"]),
    "SmolLM2-1.7B": ("smollm2-1.7b", ["HuggingFaceTB/SmolLM2-1.7B", "HuggingFaceTB/SmolLM-1.7B", "smollm-1.7b"]),
    "Mixtral-8x22B-v0.1": ("mixtral-8x22b", ["mistralai/Mixtral-8x22B-v0.1"]),
    "Mistral-7B-v0.3": ("mistral-7b-v0.3", ["mistralai/Mistral-7B-v0.3"]),
    "Qwen3-235B-A22B": ("qwen3-235b-a22b", ["Qwen/Qwen3-235B-A22B"]),
}


def hf_config(entry: dict) -> dict:
    """One entry of either layout -> a config.json dict (with ``model_type``)."""
    if "config" in entry:
        return entry["config"]
    return {"model_type": MODEL_TYPES[entry["config_class"]], **entry["kwargs"]}


def main(path: str, *only: str) -> None:
    models = json.loads(Path(path).read_text())["models"]
    for ref_name, entry in models.items():
        name, aliases = NAMES[ref_name]
        if only and name not in only:
            continue
        spec = spec_from_hf_config(hf_config(entry), name=name, display_name=ref_name.replace("(gpt2-arch)", ""),
                                   aliases=tuple(aliases), source=entry["source"])
        data = spec.model_dump(mode="json", exclude_none=True)
        write_text_atomic(OUT / f"{name}.json", json.dumps(data, indent=2) + "\n")
        print(f"{name}: {spec.total_params:,}")
    write_index()  # the catalogues' index of names and sizes (shardplan/inputs/profile_index.py) follows the profiles


if __name__ == "__main__":
    main(*sys.argv[1:])
