"""The model catalogue: resolve ``--model`` to a ModelSpec.

Accepted: a built-in profile name or alias ("llama-3.1-8b", "meta-llama/Llama-3.1-8B"), a path
to a ModelSpec JSON or a Hugging Face ``config.json``, or a bare size ("70B", "1.3b") which picks
the built-in dense reference architecture nearest in total parameters and says so.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from shardplan.errors import ShardplanError
from shardplan.hf_config import how_read, spec_from_hf_config_file
from shardplan.model import ModelSpec
from shardplan.profiles import find_by_name, load_all, load_profile, read_json

_BARE_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([mbt])\s*$", re.IGNORECASE)
_SCALE = {"m": 1e6, "b": 1e9, "t": 1e12}

# Bare sizes resolve among these (dense, widely used; newest family first on equal distance).
SIZE_REFERENCES = (
    "gpt2", "opt-125m", "opt-1.3b", "gpt2-xl", "llama-3.1-8b", "llama-2-7b", "mistral-7b-v0.1", "qwen2.5-7b",
    "gemma-2-9b", "llama-2-13b", "opt-30b", "llama-3.1-70b", "llama-2-70b", "qwen2.5-72b", "gpt3-175b",
    "llama-3.1-405b",
)


@dataclass(frozen=True)
class ResolvedModel:
    spec: ModelSpec
    how: str  # one line for reports: how the user's text became this spec


def model_profiles() -> tuple[ModelSpec, ...]:
    return load_all("model_profiles", ModelSpec)


def get_model(name: str) -> ModelSpec:
    return find_by_name(model_profiles(), name, "model")


def _nearest_reference(target: float) -> ModelSpec:
    """Nearest in log-size; ties go to the earlier (newer-family) entry of SIZE_REFERENCES."""
    specs = [get_model(n) for n in SIZE_REFERENCES]
    return min(specs, key=lambda s: abs(math.log(s.total_params / target)))


def resolve_model(text: str) -> ResolvedModel:
    text = str(text).strip()
    if not text:
        raise ShardplanError("model", text, "empty model name")
    path = Path(text).expanduser()
    if text.endswith(".json") or path.is_file():
        if not path.exists():
            raise ShardplanError("model", text, "no such file")
        data = read_json(path, field="model")
        if "model_type" in data:
            spec = spec_from_hf_config_file(path)
            return ResolvedModel(spec, how_read(spec, path))
        return ResolvedModel(load_profile(path, ModelSpec), f"model profile {path}")
    size = _BARE_SIZE.match(text)
    if size:
        target = float(size.group(1)) * _SCALE[size.group(2).lower()]
        if target <= 0:
            raise ShardplanError("model", text, "size must be positive")
        spec = _nearest_reference(target)
        return ResolvedModel(spec, f"'{text}' -> {spec.display_name} ({spec.total_params / 1e9:.2f}B params), "
                                   "the nearest built-in reference architecture")
    try:
        spec = get_model(text)
    except ShardplanError:
        known = ", ".join(s.name for s in model_profiles())
        raise ShardplanError("model", text, f"unknown model; use a built-in name ({known}), a size like '7B', "
                                            "or a path to a config.json") from None
    return ResolvedModel(spec, spec.display_name)
