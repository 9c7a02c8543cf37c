"""The caching allocator's measured constants as data: ``shardplan/data/allocator.json`` (CUDA
context bytes, fragmentation per allocator class with its measured spread and sources), read and
validated once. ``formulas/allocator.py`` holds the mechanisms that read them; a calibration
overlay (``calibrate/overlay.py``) replaces them."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field


class FragmentationCoefficient(BaseModel):
    """Measured (reserved − allocated − pools) / largest transient, per allocator class."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    median: float = Field(ge=0)
    low: float = Field(ge=0)
    high: float = Field(ge=0)
    runs: int = Field(ge=0)


class AllocatorModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    cuda_context_bytes: int = Field(ge=0)
    fragmentation_per_transient: dict[str, FragmentationCoefficient]
    sources: dict[str, str]
    calibrated: bool = False

    def coefficient(self, name: str) -> FragmentationCoefficient:
        return self.fragmentation_per_transient[name]


@lru_cache(maxsize=1)
def default_allocator() -> AllocatorModel:
    text = resources.files("shardplan").joinpath("data/allocator.json").read_text()
    return AllocatorModel.model_validate(json.loads(text))
