"""One calibration configuration (RunConfig) and grids of them. No torch import here."""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from shardplan.inputs.model import ModelSpec
from shardplan.support.errors import ShardplanError

Strategy = Literal["full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2", "no_shard"]
Engine = Literal["fsdp2", "fsdp1"]
DType = Literal["float32", "bfloat16", "float16"]
AC = Literal["none", "full", "selective"]
Optimizer = Literal["adamw", "sgd"]
Launch = Literal["fake", "spawn", "torchrun"]
Device = Literal["cpu", "cuda"]


class RunConfig(BaseModel):
    """Everything that determines one measured training run (all ranks share it).

    ``model`` names a built-in ModelSpec (or a path); ``tiny`` overrides its dimensions (an empty
    dict keeps the real dimensions, which needs ``fake_tensors`` for 7B-70B shapes).
    ``shard_size`` is the FSDP shard-group size for hybrid strategies (default: world_size // 2).
    ``device``: where the model lives. None = the backend's device (nccl: CUDA, gloo: CPU; the
    fake process group: CPU); ``"cuda"`` with ``launch="fake"`` builds the model and mesh on one
    GPU, which then holds rank 0 of any world size.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "llama-3.1-8b"
    tiny: dict[str, int] = Field(default_factory=lambda: {"hidden_size": 64, "num_layers": 2, "num_heads": 4,
                                                          "num_kv_heads": 2, "intermediate_size": 128,
                                                          "vocab_size": 256})
    world_size: PositiveInt = 2
    strategy: Strategy = "full_shard"
    shard_size: PositiveInt | None = None
    engine: Engine = "fsdp2"
    param_dtype: DType = "float32"
    reduce_dtype: DType = "float32"
    ac: AC = "none"
    optimizer: Optimizer = "adamw"
    cpu_offload: bool = False
    micro_batch: PositiveInt = 2
    seq_len: PositiveInt = 32
    steps: int = Field(3, ge=2, description="training steps (the first is warm-up); one more runs tracked")
    launch: Launch = "fake"
    device: Device | None = None
    fake_tensors: bool = False
    dropout: float = 0.0
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> "RunConfig":
        if self.strategy.startswith("hybrid"):
            g = self.resolved_shard_size
            if self.world_size % g:
                raise ShardplanError("shard_size", g, f"must divide world_size={self.world_size}")
        if self.engine == "fsdp1" and self.cpu_offload:
            raise ShardplanError("cpu_offload", True, "the harness measures CPU offload with FSDP2 only")
        if self.engine == "fsdp1" and self.fake_tensors:
            raise ShardplanError("fake_tensors", True, "FSDP1 cannot be initialised on fake tensors")
        if self.fake_tensors and self.launch != "fake":
            raise ShardplanError("fake_tensors", True, "fake tensors need the fake process group (launch=fake)")
        return self

    @property
    def resolved_shard_size(self) -> int:
        if self.strategy.startswith("hybrid"):
            return self.shard_size or max(1, self.world_size // 2)
        if self.strategy == "no_shard":
            return 1
        return self.world_size

    def key(self) -> str:
        """Stable identity for resume: hash of the canonical JSON (launch mode excluded: a fake and
        a real run of the same configuration are the same configuration measured two ways)."""
        data = self.model_dump(mode="json")
        data.pop("launch")
        if data.get("device") is None:  # keys of records measured before the field existed stay valid
            data.pop("device", None)
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def label(self) -> str:
        return (f"{self.engine}/{self.strategy}/W{self.world_size}/p={self.param_dtype},r={self.reduce_dtype}/"
                f"ac={self.ac}/{self.optimizer}{'/offload' if self.cpu_offload else ''}"
                f"{'/' + self.device if self.device else ''}")


def default_grid(launch: Launch = "fake") -> list[RunConfig]:
    """The test/CI grid: >= 24 tiny configurations across engines, strategies, precision, AC and
    world size (2/4/8/64 through the fake process group)."""
    configs: list[RunConfig] = []
    precisions = [("float32", "float32"), ("bfloat16", "float32")]
    for strategy, (pd, rd), ac, world in itertools.product(
        ["full_shard", "shard_grad_op"], precisions, ["none", "full", "selective"], [2, 8]
    ):
        configs.append(RunConfig(engine="fsdp2", strategy=strategy, param_dtype=pd, reduce_dtype=rd, ac=ac,
                                 world_size=world, launch=launch))
    for world in (4, 64):
        configs.append(RunConfig(engine="fsdp2", strategy="full_shard", param_dtype="bfloat16", world_size=world,
                                 launch=launch))
    configs.append(RunConfig(engine="fsdp2", strategy="hybrid_shard", world_size=8, shard_size=4,
                             param_dtype="bfloat16", launch=launch))
    configs.append(RunConfig(engine="fsdp2", strategy="no_shard", world_size=4, launch=launch))
    configs.append(RunConfig(engine="fsdp2", strategy="full_shard", world_size=4, optimizer="sgd", launch=launch))
    configs.append(RunConfig(engine="fsdp2", strategy="full_shard", world_size=4, cpu_offload=True, launch=launch))
    configs.append(RunConfig(engine="fsdp2", strategy="full_shard", model="gpt2", world_size=4,
                             tiny={"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 4,
                                   "intermediate_size": 256, "vocab_size": 256}, launch=launch))
    for strategy, (pd, rd), ac in itertools.product(["full_shard", "shard_grad_op", "no_shard", "hybrid_shard"],
                                                     precisions, ["none", "full"]):
        configs.append(RunConfig(engine="fsdp1", strategy=strategy, world_size=4, param_dtype=pd, reduce_dtype=rd,
                                 ac=ac, launch=launch, shard_size=2 if strategy == "hybrid_shard" else None))
    configs.append(RunConfig(engine="fsdp1", strategy="full_shard", world_size=8, param_dtype="bfloat16",
                             ac="full", launch=launch))
    configs.append(RunConfig(engine="fsdp1", strategy="full_shard", world_size=2, launch=launch))
    configs.append(RunConfig(engine="fsdp1", strategy="full_shard", world_size=8, ac="selective", launch=launch))
    configs.append(RunConfig(engine="fsdp1", strategy="full_shard", world_size=64, param_dtype="bfloat16",
                             launch=launch))
    configs.append(RunConfig(engine="fsdp1", strategy="full_shard", world_size=4, optimizer="sgd", launch=launch))
    return configs


TINY_DEFAULTS = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
                     vocab_size=256, max_position_embeddings=128)


def tiny_spec(spec: ModelSpec, **overrides) -> ModelSpec:
    """The same architecture (norm, MLP kind, biases, tying, GQA ratio) at tiny dimensions.

    Keeps the spec's GQA ratio where the tiny head count allows it; MoE/MLA are dropped (the
    harness builds dense blocks only).
    """
    dims = dict(TINY_DEFAULTS)
    ratio = max(1, spec.num_heads // spec.num_kv_heads)
    dims["num_kv_heads"] = max(1, dims["num_heads"] // min(ratio, dims["num_heads"]))
    dims.update(overrides)
    dims.setdefault("head_dim", None)
    update = dict(dims, moe=None, mla=None, sliding_window=None, name=f"tiny-{spec.name}")
    if "head_dim" not in overrides:
        update["head_dim"] = None
    return spec.model_copy(update=update)
