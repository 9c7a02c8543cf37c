"""The accuracy band's data: per term class, the relative error the model is known to make, how it
was derived and its source (``shardplan/data/accuracy_bands.json``; docs/accuracy.md).

Frozen pydantic models with ``extra="forbid"``: a malformed file is a one-line error naming the
file, the field and the value. A calibration overlay's ``accuracy`` section (``--calibration``)
replaces the classes it names with errors measured on the user's own runs.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shardplan.support.errors import ShardplanError

BANDS_FILE = Path(__file__).parents[1] / "data" / "accuracy_bands.json"
SCHEMA = "shardplan.accuracy/1"
# The term classes, in the order reports list them; verdict.py codes ``risk_term`` by this tuple.
BAND_CLASSES = ("model_states", "activations", "engine_buffers", "peak_moments", "allocator", "non_torch",
                "unknown_stack")
# What a class's relative error multiplies (bytes at the peak moment; see verdict.class_bytes).
BASES = ("model_states", "activations", "engine_buffers", "peak_allocated", "allocator_slack", "allocator_band", "non_torch")
Status = Literal["measured", "assumption", "placeholder"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class StackBand(_Frozen):
    """A stack measured against real runs: its own relative errors replace the default's.
    ``relative_error``: how much more than predicted real runs of the stack held (the upper band);
    ``lower_relative_error``: how much less (the lower band, ``verdict.judge``)."""

    relative_error: float = Field(ge=0)
    lower_relative_error: float = Field(0.0, ge=0, lt=1)
    status: Status
    derivation: str = Field(min_length=1)
    source: str = Field(min_length=1)


class ClassBand(_Frozen):
    relative_error: float = Field(ge=0)
    of: Literal["model_states", "activations", "engine_buffers", "peak_allocated", "allocator_slack", "allocator_band", "non_torch"]
    status: Status
    derivation: str = Field(min_length=1)
    source: str = Field(min_length=1)


class UnknownStackBand(ClassBand):
    lower_relative_error: float = Field(0.0, ge=0, lt=1, description="the lower band's default fraction")
    stacks: dict[str, StackBand] = {}


class BandClasses(_Frozen):
    model_states: ClassBand
    activations: ClassBand
    engine_buffers: ClassBand
    peak_moments: ClassBand
    allocator: ClassBand
    non_torch: ClassBand
    unknown_stack: UnknownStackBand


class FamilyBand(_Frozen):
    """tokens/s: low = estimate / (1 + slower_than_predicted), high = estimate × (1 + faster_than_predicted),
    over ``runs`` out-of-source errors: one GPU family's (``hardware.gpu_family``), or all of them
    (``ThroughputBand``)."""

    slower_than_predicted: float = Field(ge=0)
    faster_than_predicted: float = Field(ge=0)
    runs: int = Field(ge=1)
    median_error: float


def widened(base: FamilyBand, own: FamilyBand | None) -> tuple[float, float]:
    """(slower, faster): ``base``'s fractions, each side widened to ``own``'s where it is wider."""
    if own is None:
        return base.slower_than_predicted, base.faster_than_predicted
    return (max(base.slower_than_predicted, own.slower_than_predicted),
            max(base.faster_than_predicted, own.faster_than_predicted))


class ThroughputBand(FamilyBand):
    """The all-runs band with its provenance; ``gpu_families``: each GPU family's own band, which
    widens the band of an answer on that family (``fractions``)."""

    status: Status
    derivation: str = Field(min_length=1)
    source: str = Field(min_length=1)
    gpu_families: dict[str, FamilyBand] = {}

    def fractions(self, family: str | None) -> tuple[float, float]:
        """(slower, faster) for an answer on a GPU family: the all-runs fractions, each side widened
        to the family's own where its published runs erred further. Never narrowed: a few runs of
        one family do not make an estimate surer than all the runs do, and where the family erred
        less the all-runs quantile still holds what the model gets wrong elsewhere."""
        return widened(self, self.gpu_families.get(family or ""))

    def evidence(self, family: str, calibrated: bool = False) -> dict[str, Any]:
        """What the runs behind the band say about answers on ``family``: its published runs, their
        signed median error, and whether they widened the band (``fractions``); runs 0 where none
        was published. ``calibrated``: the band came from the user's own runs (a calibration
        overlay's ``throughput``, which replaces the published runs' band and its families)."""
        own = self.gpu_families.get(family)
        slower, faster = self.fractions(family)
        return {"family": family, "calibrated": calibrated, "band_runs": self.runs, "runs": own.runs if own else 0,
                "median_error": own.median_error if own else None, "slower_than_predicted": slower,
                "faster_than_predicted": faster, "all_runs": (self.slower_than_predicted, self.faster_than_predicted),
                "widened": (slower, faster) != (self.slower_than_predicted, self.faster_than_predicted)}


class AccuracyBands(_Frozen):
    schema_: Literal["shardplan.accuracy/1"] = Field(alias="schema")
    combine: Literal["sum"]
    classes: BandClasses
    throughput: ThroughputBand

    def cls(self, name: str) -> ClassBand:
        return getattr(self.classes, name)

    def stack_error(self, stack: str) -> float:
        """Relative error of the code around the engine for one stack (the default when unmeasured)."""
        measured = self.classes.unknown_stack.stacks.get(stack)
        return measured.relative_error if measured else self.classes.unknown_stack.relative_error

    def stack_lower_error(self, stack: str) -> float:
        """How much less than predicted a run of the stack may hold (the lower band's fraction)."""
        measured = self.classes.unknown_stack.stacks.get(stack)
        return measured.lower_relative_error if measured else self.classes.unknown_stack.lower_relative_error

    def with_overlay(self, overlay: "AccuracyOverlay | None") -> "AccuracyBands":
        """These bands with the classes (and stacks, and throughput) an overlay measured replaced."""
        if overlay is None:
            return self
        data = self.model_dump(by_alias=True)
        for name, band in overlay.classes.items():
            merged = {**data["classes"][name], **band.model_dump(exclude_none=True)}
            if name == "unknown_stack":
                merged["stacks"] = {**data["classes"][name]["stacks"],
                                    **{k: v.model_dump() for k, v in overlay.stacks.items()}}
            data["classes"][name] = merged
        if overlay.stacks and "unknown_stack" not in overlay.classes:
            data["classes"]["unknown_stack"]["stacks"].update({k: v.model_dump() for k, v in overlay.stacks.items()})
        if overlay.throughput is not None:
            data["throughput"] = overlay.throughput.model_dump()
        return AccuracyBands.model_validate(data)


class OverlayClassBand(_Frozen):
    relative_error: float = Field(ge=0)
    status: Status = "measured"
    derivation: str = Field(min_length=1)
    source: str = Field(min_length=1)
    of: Literal["model_states", "activations", "engine_buffers", "peak_allocated", "allocator_slack", "allocator_band", "non_torch"] | None = None


class AccuracyOverlay(_Frozen):
    """The ``accuracy`` section of a calibration overlay: errors measured on the user's own runs."""

    classes: dict[Literal["model_states", "activations", "engine_buffers", "peak_moments", "allocator", "non_torch",
                          "unknown_stack"], OverlayClassBand] = {}
    stacks: dict[str, StackBand] = {}
    throughput: ThroughputBand | None = None


def load_bands(path: str | Path | None = None) -> AccuracyBands:
    """The band data (the built-in file when ``path`` is None); one-line errors for a bad file."""
    if path is None:
        return _default_bands()
    return _read(Path(path))


@lru_cache(maxsize=1)
def _default_bands() -> AccuracyBands:
    return _read(BANDS_FILE)


def _read(path: Path) -> AccuracyBands:
    from shardplan.inputs.profiles import read_json

    data = read_json(path, field="accuracy_bands")
    try:
        return AccuracyBands.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        value = first.get("input")
        if isinstance(value, dict):
            value = "{...}"
        raise ShardplanError(f"{path.name}: {'.'.join(str(p) for p in first['loc']) or '(root)'}", value,
                             first["msg"]) from None
