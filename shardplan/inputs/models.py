"""The model catalogue: resolve ``--model`` to a ModelSpec.

Accepted (docs/model-names.md has the table of forms and what each resolves to):
- a built-in profile name or alias, spelled under the one name rule (names.normalize):
  "llama-3.1-8b", "Llama 3.1 8B", "meta-llama/Llama-3.1-8B";
- a Hugging Face id of a fine-tune of a built-in, with the publisher and fine-tune words dropped
  (model_names.py): "meta-llama/Meta-Llama-3.1-8B-Instruct" -> llama-3.1-8b, said in the answer;
- a path to a ModelSpec JSON or a Hugging Face ``config.json``, or a folder holding a
  ``config.json`` (a downloaded snapshot, or a hub-cache ``models--org--name`` folder), "~" allowed;
- a bare size ("70B", "1.3b"): the dense profile nearest in total parameters, when one is within
  SIZE_TOLERANCE; otherwise an error naming the two nearest.
Anything else is a one-line error with "did you mean" over every name and alias.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from shardplan.inputs.model import ModelSpec
from shardplan.inputs.profile_index import Entry, entries, find_entry, lookup, profile_of
from shardplan.inputs.profiles import load_all, load_profile, read_json
from shardplan.support.errors import ShardplanError
from shardplan.support.input_files import path_kind, read_text
from shardplan.support.limits import MAX_DIGITS, MAX_PARAMS, _shown
from shardplan.support.names import did_you_mean

_BARE_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([mbt])\s*$", re.IGNORECASE)
_SCALE = {"m": 1e6, "b": 1e9, "t": 1e12}

# A bare size answers for a profile only when its total parameter count is within this fraction of
# the size typed. Why 10 %: model states, the usual largest term, scale with the parameter count, so
# a stand-in within 10 % moves the answer by no more than the same configuration moves between two
# real runs (10-20 %, docs/accuracy.md, class unknown_stack); a farther stand-in answers for another
# model, and the size then is an error naming the two nearest.
SIZE_TOLERANCE = 0.10

# Preferred stand-ins for a bare size: dense, widely fine-tuned architectures, newest family first.
# When one of these is within SIZE_TOLERANCE it wins (nearest first, then this order), so "7B"
# means Mistral-7B rather than Falcon-7B (nearer to 7.0B, but a 2048-token multi-query design). Sizes
# none of these cover fall back to every dense profile (built-in or on SHARDPLAN_PROFILE_PATH), so
# a new dense profile answers for its size without being listed here. Add a profile here only to
# make it the preferred stand-in for its size class.
SIZE_REFERENCES = (
    "gpt2", "opt-125m", "opt-1.3b", "gpt2-xl", "llama-3.1-8b", "llama-2-7b", "mistral-7b-v0.1", "qwen2.5-7b",
    "gemma-2-9b", "llama-2-13b", "opt-30b", "llama-3.1-70b", "llama-2-70b", "qwen2.5-72b", "gpt3-175b",
    "llama-3.1-405b",
)


KIND = "model_profiles"  # their folder (profiles.search_dirs) and catalogue (profile_index.KINDS)
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")  # "org/name", as the Hugging Face hub spells repository ids


@dataclass(frozen=True)
class ResolvedModel:
    spec: ModelSpec
    how: str  # one line for reports: how the user's text became this spec
    hf_id: str | None = None  # the hub repository the user named (exports load it); None: the profile's own

    def record(self, model: dict) -> dict:
        """A result's model record with the named repository added, so an export loads the weights the
        user named ("...-Instruct"), not the base profile's, whose architecture they share."""
        return {**model, "hf_id": self.hf_id} if self.hf_id else model


def catalogue() -> tuple[Entry, ...]:
    """Every model profile's name, aliases and size (``profile_index``), in ``model_profiles()`` order."""
    return entries(KIND)


def spec_of(entry: Entry) -> ModelSpec:
    return profile_of(KIND, entry)


def model_profiles() -> tuple[ModelSpec, ...]:
    """Every model profile, validated (user folders first)."""
    return load_all(KIND, ModelSpec)


def get_model(name: str) -> ModelSpec:
    """The profile of a name or alias (validated alone: the catalogue's index finds it)."""
    return spec_of(find_entry(KIND, name, "model"))


def _size_distance(entry: Entry, target: float) -> float:
    """How far a profile is from a size, in log-parameters (symmetric: 2x too big = 2x too small)."""
    return abs(math.log(entry.total_params / target))


def _within_tolerance(entry: Entry, target: float) -> bool:
    return abs(entry.total_params / target - 1.0) <= SIZE_TOLERANCE


def _dense_profiles() -> list[Entry]:
    """Bare sizes resolve among dense profiles: a size names total parameters, and an MoE model of
    that total computes per token like a model several times smaller (its active parameters)."""
    return [e for e in catalogue() if e.dense]


def _format_params(count: float) -> str:
    return f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.0f}M"


def nearest_for_size(target: float) -> ModelSpec | None:
    """The profile a bare size stands for, or None when no dense profile is within SIZE_TOLERANCE.

    Preferred SIZE_REFERENCES first (nearest, then their order); else any dense profile (nearest;
    equal counts -- one architecture published several times -- go to the longest context, since a
    bare size states none, then to the name, so the answer never depends on file order).
    """
    preferred = [find_entry(KIND, n, "model") for n in SIZE_REFERENCES]
    close = [e for e in preferred if _within_tolerance(e, target)]
    if close:
        return spec_of(min(close, key=lambda e: (_size_distance(e, target), preferred.index(e))))
    close = [e for e in _dense_profiles() if _within_tolerance(e, target)]
    if close:
        return spec_of(min(close, key=lambda e: (_size_distance(e, target), -e.max_position_embeddings, e.name)))
    return None


def _resolve_size(text: str, target: float) -> ResolvedModel:
    spec = nearest_for_size(target)
    if spec is not None:
        return ResolvedModel(spec, f"'{text}' -> {spec.display_name} ({_format_params(spec.total_params)} params), "
                                   "the nearest built-in reference architecture")
    two = sorted(_dense_profiles(), key=lambda s: (_size_distance(s, target), -s.max_position_embeddings, s.name))[:2]
    nearest = ", ".join(f"{s.name} {_format_params(s.total_params)}" for s in two)
    raise ShardplanError("model", text, f"no built-in dense model within {SIZE_TOLERANCE:.0%} of "
                                        f"{text} parameters (nearest: {nearest}); give the "
                                        "model's name or Hugging Face id, or its config.json or the folder holding it")


def _local_config(text: str) -> ResolvedModel | None:
    """A file or folder the text names, read; None when the text is not a path."""
    try:
        path = Path(text).expanduser()
    except RuntimeError:  # '~name' of no such user: a name, not a path
        return None
    kind = path_kind(path)  # never raises: a 300-character model name is a name, not an OSError
    if kind == "dir":
        from shardplan.inputs.hf_config import how_read, spec_from_hf_config_file  # imported only where a path is read

        config = _config_in_folder(path, text)
        spec = spec_from_hf_config_file(config)
        if config.parent.parent.name == "snapshots" and spec.name == config.parent.name:
            # named after the snapshot's commit hash; the hub-cache folder "models--org--name" has the id
            repo = path.name.removeprefix("models--").replace("--", "/")
            spec = spec.model_copy(update={"name": repo, "display_name": repo})
            return ResolvedModel(spec, how_read(spec, config), hf_id=repo)
        return ResolvedModel(spec, how_read(spec, config))
    if kind is not None or text.endswith(".json"):
        data = read_json(path, field="model")  # names what is there instead of a file, or that nothing is
        if "model_type" in data:
            from shardplan.inputs.hf_config import how_read, spec_from_hf_config_file

            spec = spec_from_hf_config_file(path)
            return ResolvedModel(spec, how_read(spec, path))
        return ResolvedModel(load_profile(path, ModelSpec), f"model profile {path}")
    if text.startswith(("/", "~", "./", "../", ".\\", "..\\")) or text.count("/") > 1:
        raise ShardplanError("model", text, "no such file or folder")
    return None


def _config_in_folder(folder: Path, text: str) -> Path:
    """``folder/config.json``; in a hub-cache folder (models--org--name), the snapshot refs/main names."""
    config = folder / "config.json"
    if path_kind(config) is not None:
        return config  # a folder or FIFO named config.json is refused by the reader, by name
    snapshots = folder / "snapshots"
    if path_kind(snapshots) == "dir":
        ref = folder / "refs" / "main"
        found = ([snapshots / read_text(ref, "model").strip() / "config.json"] if path_kind(ref) == "file"
                 else sorted(snapshots.glob("*/config.json")))
        found = [p for p in found if path_kind(p) == "file"]
        if len(found) == 1:
            return found[0]
        if found:
            raise ShardplanError("model", text, "hub-cache folder with several snapshots and no refs/main; "
                                                "give one snapshot folder: " + ", ".join(str(p.parent) for p in found))
    raise ShardplanError("model", text, f"folder has no config.json ({folder.resolve()})")


def _resolve_name(text: str) -> ResolvedModel:
    from shardplan.inputs.model_names import base_name, name_forms  # a name's spellings (a size needs none)

    for i, form in enumerate(name_forms(text)):
        entry = lookup(KIND, form.text)
        if entry is not None:
            shown = entry.display_name or entry.name
            how = shown if i == 0 else f"'{text}' -> {shown}{form.note}"
            return ResolvedModel(spec_of(entry), how, hf_id=text if _HUB_ID.match(text) else None)
    spellings = {n: e.name for e in catalogue() for n in (e.name, e.display_name, *e.aliases) if n}
    hint = did_you_mean(base_name(text), spellings) or did_you_mean(text, spellings)
    raise ShardplanError("model", text, f"unknown model{hint}; give a built-in name or Hugging Face id "
                                        "('shardplan models' lists them), a size like '7B', or a config.json "
                                        "or the folder holding it")


def resolve_model(text: str) -> ResolvedModel:
    text = str(text).strip()
    if not text:
        raise ShardplanError("model", text, "empty model name")
    local = _local_config(text)
    if local is not None:
        return local
    size = _BARE_SIZE.match(text)
    if size:
        digits = size.group(1).split(".")[0].lstrip("0")
        target = float(size.group(1)) * _SCALE[size.group(2).lower()] if len(digits) <= MAX_DIGITS else math.inf
        if not 0 < target <= MAX_PARAMS:
            raise ShardplanError("model", _shown(text), f"a size must be positive and at most {MAX_PARAMS:.0e} "
                                                        "parameters (limits.MAX_PARAMS)")
        return _resolve_size(text, target)
    return _resolve_name(text)
