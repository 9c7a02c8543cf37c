"""The stack profiles' schema and reading them (``shardplan/data/stack_profiles/<name>.json``;
what they mean and how a config is filled from them: ``stacks.py``).

Below the vocabulary, which resolves a stack-dependent word ("bf16") through a profile's
``words`` (``stack_word``). Checking a profile's defaults against ``TrainingConfig`` and the
vocabulary needs both, so it sits above them (``stacks.get_stack``); keeping reading and checking
apart is what keeps ``inputs/`` free of import cycles.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict

from shardplan.inputs import knob_names as st
from shardplan.inputs.profiles import DATA_DIR, load_profile
from shardplan.support.errors import ShardplanError

STACK_DIR = DATA_DIR / "stack_profiles"


class StackDefault(BaseModel):
    """One default with where it comes from (library + file/function, or a documentation page)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: Union[bool, int, float, str]
    source: str


class StackCondition(BaseModel):
    """When an override applies: one GPU or several (None: either), and which methods (None: all)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpus: Literal["one", "many"] | None = None
    methods: list[Literal["full", "lora", "qlora"]] | None = None

    def matches(self, world_size: int, method: str) -> bool:
        gpus_ok = self.gpus is None or (self.gpus == "one") == (int(world_size) == 1)
        return gpus_ok and (self.methods is None or method in self.methods)


class StackOverride(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    when: StackCondition
    set: dict[str, StackDefault]


class StackWord(BaseModel):
    """What the stack means by a short word for a knob ("bf16" -> bf16-mixed or bf16-pure); None:
    the stack refuses that mode (``source`` says where)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: str | None
    source: str


class StackProfile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    display_name: str
    description: str
    defaults: dict[str, StackDefault]
    overrides: list[StackOverride] = []
    not_modelled: list[str] = []
    # knob -> word -> meaning: the vocabulary's stack-dependent aliases (shardplan/inputs/vocabulary.py)
    words: dict[str, dict[str, StackWord]] = {}

    def knobs(self, world_size: int, method: str = "full") -> dict[str, Any]:
        """The profile's defaults for a run on ``world_size`` GPUs with ``method`` (names -> values)."""
        out = {k: d.value for k, d in self.defaults.items()}
        for rule in self.overrides:
            if rule.when.matches(world_size, method):
                out.update({k: d.value for k, d in rule.set.items()})
        return out


@lru_cache(maxsize=None)
def read_stack(name: str) -> StackProfile:
    """The built-in profile of the stack named ``name`` (a name of ``knob_names.STACKS``), as its
    schema reads it (``stacks.get_stack`` checks it against the config and the vocabulary)."""
    return load_profile(STACK_DIR / f"{name}.json", StackProfile)


def stack_word(stack: str, knob: str, word: str) -> str:
    """What ``stack`` (a canonical stack name) means by ``word`` for ``knob`` (its profile's
    ``words``), or a one-line error when the stack refuses that mode or does not say."""
    profile = read_stack(stack)
    meaning = profile.words.get(knob, {}).get(word)
    if meaning is None:
        raise ShardplanError(knob, word, f"the {profile.name} stack profile does not say what it means")
    if meaning.value is None:
        raise ShardplanError(knob, word, f"the {profile.name} stack has no such mode ({meaning.source})")
    return meaning.value


def read_stacks() -> list[StackProfile]:
    """Every stack's profile, in code order (docs/vocabulary.md lists their words)."""
    return [read_stack(name) for name in st.STACKS]
