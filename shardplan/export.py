"""Export a plan to what a framework expects: FSDP2/FSDP1 code, accelerate YAML, DeepSpeed JSON,
Hugging Face Trainer flags, torchrun/SLURM launch lines.

``plan_spec(obj)`` turns a ``FitResult`` / planner plan / dict (as written by ``--json``) into a
``PlanSpec``; ``export(spec, fmt)`` renders one format as text (written by
``shardplan.support.atomic_write.write_text_atomic``); and
``read_back(fmt, text)`` parses an export back into the plan's knobs (the round-trip contract).
No torch, accelerate or DeepSpeed import here: exports are plain text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from shardplan.exporters import deepspeed as ds_export
from shardplan.exporters import fsdp as fsdp_export
from shardplan.exporters import hf as hf_export
from shardplan.exporters import launch as launch_export
from shardplan.exporters.spec import KNOBS, STACK_FIELDS, PlanSpec
from shardplan.support.errors import ShardplanError
from shardplan.support.limits import MAX_BYTES, MAX_GPUS, _shown, bounded_int
from shardplan.support.names import lookup

__all__ = ["FORMATS", "PlanSpec", "export", "load_plans", "plan_spec", "read_back"]

EXPORTERS: dict[str, Callable[[PlanSpec], str]] = {
    "fsdp2": fsdp_export.fsdp2_snippet,
    "fsdp1": fsdp_export.fsdp1_snippet,
    "accelerate": hf_export.accelerate_yaml,
    "deepspeed": ds_export.deepspeed_json,
    "trainer": hf_export.trainer_flags,
    "torchrun": launch_export.torchrun_lines,
}
FORMATS = tuple(EXPORTERS)
READERS: dict[str, Callable[[str], dict[str, Any]]] = {
    "fsdp2": fsdp_export.read_back,
    "fsdp1": fsdp_export.read_back,
    "accelerate": hf_export.read_back_accelerate,
    "deepspeed": ds_export.read_back,
    "trainer": hf_export.read_back_trainer,
    "torchrun": launch_export.read_back,
}


def _model_fields(model: Any, block_class: str | None) -> dict[str, Any]:
    """Model name -> (name, hf_id, block_class), looking the profile up when only a name is given."""
    if isinstance(model, str):
        model = {"name": model}
    model = dict(model or {})
    for key in ("name", "model_name", "hf_id", "block_class"):
        if model.get(key) is not None and not isinstance(model[key], str):
            raise ShardplanError(f"model.{key}", _shown(model[key]), "must be a string")
    name = model.get("name") or model.get("model_name")
    if not name:
        raise ShardplanError("model", None, "the plan names no model")
    hf_id = model.get("hf_id")
    block = block_class or model.get("block_class")
    if not block or not hf_id:
        try:
            from shardplan.inputs.models import get_model

            spec = get_model(name)
            block = block or spec.block_class
            hf_id = hf_id or next((a for a in spec.aliases if "/" in a), None)
        except ShardplanError:
            pass
    if not block:
        raise ShardplanError("block_class", None, f"unknown for model {name!r}; pass --block-class "
                                                  "(the transformers decoder layer class, e.g. LlamaDecoderLayer)")
    return {"model_name": name, "hf_id": hf_id, "block_class": block}


# The JSON type of each field plan_spec reads from a plan record (``fit --json`` / ``plan --json``);
# a list where an object goes would otherwise reach dict() as a TypeError.
_PLAN_SHAPES: dict[str, tuple[type, ...]] = {
    "config": (dict,), "cluster": (dict,), "per_gpu": (dict,), "model": (str, dict), "gpu": (str, dict),
    "fits": (bool,), "breakdown": (dict,),
}


def _check_shapes(obj: dict) -> None:
    for key, types in _PLAN_SHAPES.items():
        value = obj.get(key)
        if value is not None and not isinstance(value, types):
            names = " or ".join({"dict": "a JSON object", "str": "a string", "bool": "true or false"}[t.__name__]
                                for t in types)
            raise ShardplanError(f"plan.{key}", "{...}" if isinstance(value, (dict, list)) else _shown(value),
                                 f"must be {names}")
    for key in ("per_gpu", "cluster"):
        inner = obj.get(key) or {}
        for sub in ("breakdown", "gpu"):
            if sub in inner and inner[sub] is not None and not isinstance(inner[sub], _PLAN_SHAPES[sub]):
                raise ShardplanError(f"plan.{key}.{sub}", "{...}" if isinstance(inner[sub], list) else _shown(inner[sub]),
                                     "has the wrong JSON type")


def plan_spec(obj: Any, block_class: str | None = None) -> PlanSpec:
    """A PlanSpec from a PlanSpec, a FitResult/planner record (pydantic) or a dict of the same keys.

    Accepted dict shapes: PlanSpec's own fields; or ``fit --json`` records (``config``, ``model``,
    ``cluster``, ``gpu``, ``per_gpu``); planner records may carry the knobs at the top level.
    """
    if isinstance(obj, PlanSpec):
        # model_copy(update=...) would skip the validators that keep values out of generated code
        return obj if block_class is None else PlanSpec(**{**obj.model_dump(), "block_class": block_class})
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump(mode="json")
    if not isinstance(obj, dict):
        raise ShardplanError("plan", type(obj).__name__, "expected a plan object (JSON object)")
    _check_shapes(obj)
    if "model_name" in obj and "block_class" in obj:
        data = dict(obj)
        if block_class:
            data["block_class"] = block_class
        return PlanSpec(**data)
    config = {**{k: obj[k] for k in KNOBS if k in obj}, **dict(obj.get("config") or {})}
    cluster = dict(obj.get("cluster") or {})
    gpu = obj.get("gpu") or cluster.get("gpu") or {}
    per_gpu = dict(obj.get("per_gpu") or {})
    fields: dict[str, Any] = {k: config[k] for k in KNOBS + STACK_FIELDS if config.get(k) is not None}
    fields.update(_model_fields(obj.get("model"), block_class))
    fields["nodes"] = bounded_int(cluster.get("nodes", obj.get("nodes", 1)), "cluster.nodes", 1, MAX_GPUS)
    fields["gpus_per_node"] = bounded_int(cluster.get("gpus_per_node", obj.get("gpus_per_node", 1)),
                                          "cluster.gpus_per_node", 1, MAX_GPUS)
    fields["gpu"] = gpu.get("name", "") if isinstance(gpu, dict) else str(gpu)
    for key in ("forward_prefetch", "backward_prefetch", "limit_all_gathers"):
        if key in obj:
            fields[key] = obj[key]
    if "fits" in obj:
        fields["fits"] = obj["fits"]  # a JSON boolean (_check_shapes): bool("no") would be True
    for key in ("peak_allocated_bytes", "peak_reserved_bytes"):
        value = per_gpu.get(key, obj.get(key))
        if value is not None:
            fields[key] = bounded_int(value, key, 0, MAX_BYTES)
    breakdown = per_gpu.get("breakdown", obj.get("breakdown"))
    if isinstance(breakdown, dict):
        fields["breakdown"] = {k: bounded_int(v, f"breakdown.{k}", 0, MAX_BYTES) for k, v in breakdown.items()}
    return PlanSpec(**fields)


def load_plans(path: str | Path) -> list[dict[str, Any]]:
    """Plan objects from a JSON file (one object, a list, or ``{"plans": [...]}``); '-' reads stdin."""
    from shardplan.support.input_files import parse_json, read_stdin, read_text
    from shardplan.support.limits import MAX_PLAN_FILE_BYTES

    if str(path) == "-":
        text = read_stdin("plan", MAX_PLAN_FILE_BYTES)
    else:
        text = read_text(path, "plan", MAX_PLAN_FILE_BYTES)
    data = parse_json(text, "plan", str(path))
    if isinstance(data, dict) and isinstance(data.get("plans"), list):
        # `shardplan plan --json`: the model and the cluster are stated once, beside the plans
        shared = {k: data[k] for k in ("model", "cluster") if k in data}
        data = [{**shared, **p} if isinstance(p, dict) else p for p in data["plans"]]
    plans = data if isinstance(data, list) else [data]
    if not plans or not all(isinstance(p, dict) for p in plans):
        raise ShardplanError("plan", str(path), "expected a JSON object or a non-empty list of objects")
    return plans


def choose_plan(plans: list[dict[str, Any]], index: int | None = None) -> dict[str, Any]:
    """``index`` when given; else the first plan that fits (or the first when none says)."""
    if not isinstance(plans, list) or not plans or not all(isinstance(p, dict) for p in plans):
        raise ShardplanError("plans", type(plans).__name__, "expected a non-empty list of plan objects "
                                                            "(shardplan.export.load_plans)")
    if index is not None:
        index = bounded_int(index, "index", -len(plans), len(plans) - 1)
        if not -len(plans) <= index < len(plans):
            raise ShardplanError("index", index, f"the file holds {len(plans)} plan(s)")
        return plans[index]
    for p in plans:
        if p.get("fits", True):
            return p
    tight = sum(p.get("verdict") == "tight" for p in plans)
    why = f"none fits ({tight} tight: the peak fits, the peak + its error band does not)" if tight else "none fits"
    raise ShardplanError("plan", f"{len(plans)} plan(s)", f"{why}; export one anyway with `shardplan export FILE --index N`")


def export_chosen(plans: list[dict[str, Any]], fmt: str, index: int | None = None,
                  block_class: str | None = None) -> tuple[str, int, str | None]:
    """(text, plan index, note): plan ``index`` when given; else the first fitting plan that ``fmt``
    can express — a plan list ranks DeepSpeed-only ZeRO-1/2 beside FSDP plans, and
    ``--to fsdp2`` should export the best FSDP one rather than refuse. The note says when a
    plan other than the first fitting one was taken, and why."""
    first = choose_plan(plans, index)
    if index is not None:
        return export(plan_spec(first, block_class), fmt), index, None
    fitting = [i for i, p in enumerate(plans) if p.get("fits", True)]
    refusal: ShardplanError | None = None
    for i in fitting:
        try:
            text = export(plan_spec(plans[i], block_class), fmt)
        except ShardplanError as err:
            if err.field in ("to",):  # an unknown format: no plan will do
                raise
            refusal = refusal or err
            continue
        note = None if i == fitting[0] else (f"exported plan {i} (0-based), the first fitting plan {fmt} can express; "
                                             f"plan {fitting[0]}: {refusal}")
        return text, i, note
    assert refusal is not None
    raise refusal


def format_name(fmt: str, field: str = "to") -> str:
    """The format ``fmt`` spells (the one name rule, support/names.py), or a one-line error."""
    name = lookup(fmt, FORMATS)
    if name is None:
        raise ShardplanError(field, fmt, f"unknown format; choose one of {', '.join(FORMATS)}")
    return name


def export(spec: PlanSpec, fmt: str) -> str:
    return EXPORTERS[format_name(fmt)](spec)


def read_back(fmt: str, text: str) -> dict[str, Any]:
    """The knobs an export carries, parsed from the export itself (see each reader for what it can see)."""
    return READERS[format_name(fmt)](text)


def export_option(value: str, path_field: str = "export", force: bool = False) -> tuple[str, Path | None]:
    """``--export FORMAT[=PATH]`` -> (format, path or None); the path is checked writable here, before
    any evaluation, and an error names ``path_field`` (``export``, or ``output`` for ``export -o``);
    ``force``: a read-only file may be replaced (support/output_path.py)."""
    fmt, _, path = value.partition("=")
    if lookup(fmt, FORMATS) is None:
        raise ShardplanError("export", value, f"unknown format; choose one of {', '.join(FORMATS)}")
    fmt = format_name(fmt, "export")
    if path:
        from shardplan.support.output_path import writable_output

        writable_output(path, path_field, force)
    return fmt, Path(path) if path else None

