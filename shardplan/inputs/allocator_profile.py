"""The caching allocator's measured constants as data: ``shardplan/data/allocator.json`` (CUDA
context bytes, fragmentation per allocator class with its out-of-source band and sources), read and
validated once. ``formulas/allocator.py`` holds the mechanisms that read them; a calibration
overlay (``calibrate/overlay.py``) replaces them."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field


class FragmentationCoefficient(BaseModel):
    """(reserved − allocated − pools) per byte of the largest transient, per allocator class
    (``calibrate.fragmentation_loso``): ``k`` the least-squares fit, ``band_upper`` / ``band_lower``
    the 0.9 / 0.1 quantiles of the out-of-source residual, as fractions of the transient."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    k: float = Field(ge=0)
    band_upper: float = Field(ge=0)
    band_lower: float = Field(ge=0)
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
