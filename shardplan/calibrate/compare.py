"""Predicted vs measured: hold shardplan's memory model against the harness's records, category by
category. No torch import: it reads committed JSONL records (``data/calibration/*.jsonl``).

Each record's configuration (model + tiny dimensions, world size, strategy, engine, param/reduce
dtype, AC, optimizer, micro-batch, sequence length, CPU offload) becomes one row of ``Columns``;
``estimate_memory`` predicts, and ``compare_records`` returns a tidy table: configuration,
category, predicted bytes, measured bytes, relative error.

Harness specifics (stated, not fitted):

* Precision is the run's real policy: fp32 parameters with ``param_dtype`` p and ``reduce_dtype``
  r is ``{p}-mixed`` with reduce dtype r (the harness never stores 16-bit parameters, so bf16
  param + bf16 reduce is bf16-mixed with a bf16 reduction, not ``bf16-pure``); fp32 compute is
  ``fp32`` with reduce dtype r.
* The CPU harness is one memory pool: Adam's per-tensor ``step`` scalars (CPU tensors under
  torch's default on CUDA) are on the measured device, so the prediction counts them
  (``optimizer_step_on_device=True``), and its AdamW runs per tensor (``optimizer_impl`` for_loop,
  torch's default off CUDA). CPU offload on a CPU-only run moves nothing: it is predicted as no
  offload.
* A CUDA record (``device`` cuda, or CUDA allocator peaks in it) is measured on the GPU alone:
  Adam's ``step`` scalars are host memory (not counted), FSDP2 ``CPUOffloadPolicy`` is offload of
  params, grads and optimizer, and every CUDA allocation counts rounded up to 512 bytes
  (``CUDA_BLOCK_BYTES``; torch ``mem_tracker._PYTORCH_MIN_ALLOCATE``, the caching allocator's
  ``kMinBlockSize``), applied to each allocation of the state and buffer categories
  (``cuda_rounding``).
* The tracker also counts the step's inputs (input ids and labels: 2·8·b·s bytes) and the model's
  buffers (Llama: RoPE ``inv_freq``, head_dim/2 fp32; the GPT-2-style harness model: a P×P bool
  causal mask per block); they are added to the phase and total peaks.
* FSDP1 records come from ``storage_tracker.StorageTracker`` (real storage sizes; FSDP2's
  category names); FSDP1's own buffers are predicted by ``_fsdp1_categories``.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Annotated, Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shardplan.calibrate.config import RunConfig, tiny_spec
from shardplan.formulas.activations import compute_dtype_bytes
from shardplan.formulas.buffers import fsdp1_unit_buffers, fsdp_units
from shardplan.formulas.columns import Columns, model_values
from shardplan.formulas.memory import estimate_memory
from shardplan.formulas.model_states import model_states
from shardplan.inputs import strategy as st
from shardplan.inputs.model import ModelSpec
from shardplan.inputs.models import resolve_model
from shardplan.support.errors import ShardplanError
from shardplan.support.input_files import check_file
from shardplan.support.limits import MAX_BYTES

CATEGORIES = ("params_sharded", "grads_sharded", "optimizer", "all_gather_buffers", "reduce_scatter_buffers",
              "unsharded_params", "unsharded_grads", "activations", "forward_peak", "backward_peak", "total_peak")
EXACT = ("params_sharded", "grads_sharded", "optimizer", "all_gather_buffers", "reduce_scatter_buffers",
         "unsharded_params", "unsharded_grads")
MEASURED_FIELD = {
    "params_sharded": "params_sharded_bytes", "grads_sharded": "grads_sharded_bytes",
    "optimizer": "optimizer_state_bytes", "all_gather_buffers": "all_gather_bytes",
    "reduce_scatter_buffers": "reduce_scatter_bytes", "unsharded_params": "params_unsharded_bytes",
    "unsharded_grads": "grads_unsharded_bytes", "activations": "activations_bytes",
}
FSDP1_CATEGORIES = CATEGORIES


_Bytes = Annotated[int, Field(ge=0, le=MAX_BYTES)]


class MeasuredRecord(BaseModel):
    """The fields of a harness record (status ok) that a comparison reads, with their ranges; the
    record's other fields (breakdowns, env, timings) pass through unread. A record past these is a
    one-line error naming the file, the line's key and the field, never a KeyError."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    key: str | None = None
    status: Literal["ok"]
    config: RunConfig
    measured: dict[str, _Bytes]
    forward_peak_bytes: _Bytes | None = None
    backward_peak_bytes: _Bytes | None = None
    total_peak_bytes: _Bytes | None = None
    cuda_max_allocated_bytes: _Bytes | None = None


def check_record(record: dict, where: str) -> None:
    """``record`` as a ``MeasuredRecord``, or a one-line error."""
    try:
        MeasuredRecord.model_validate(record)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(record)"
        value = None if first["type"] == "missing" else first.get("input")
        raise ShardplanError(f"records: {where}: {field}", "{...}" if isinstance(value, (dict, list)) else value,
                             first["msg"].removeprefix("Value error, ")) from None


def record_spec(record: dict) -> ModelSpec:
    cfg = record["config"]
    spec = resolve_model(cfg["model"]).spec
    return tiny_spec(spec, **cfg["tiny"]) if cfg.get("tiny") else spec


CUDA_BLOCK_BYTES = 512
_REDUCE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _precision(param_dtype: str, reduce_dtype: str) -> tuple[str, str]:
    """(precision, reduce dtype) names of the harness's policy: its parameters are always fp32
    (``MixedPrecisionPolicy`` / ``MixedPrecision`` only cast for compute and reduction)."""
    if param_dtype == "float32":
        return "fp32", _REDUCE[reduce_dtype]
    half = "bf16" if param_dtype == "bfloat16" else "fp16"
    return f"{half}-mixed", _REDUCE[reduce_dtype]


def record_on_cuda(record: dict) -> bool:
    """The record was measured on a GPU (its device, tracker devices or CUDA allocator peaks say so)."""
    if str(record.get("device", "")).startswith("cuda") or record.get("cuda_max_allocated_bytes") is not None:
        return True
    return any(str(d).startswith("cuda") for d in record.get("devices") or ())


def cuda_bytes(nbytes) -> int:
    """One allocation as the CUDA caching allocator (and torch's trackers on CUDA) counts it."""
    return -(-int(nbytes) // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES


def record_columns(record: dict, spec: ModelSpec | None = None) -> Columns:
    """The configuration of one harness record as 0-d ``Columns``."""
    cfg = record["config"]
    spec = spec or record_spec(record)
    world = cfg["world_size"]
    strategy = cfg["strategy"]
    if strategy.startswith("hybrid"):
        group = cfg.get("shard_size") or max(1, world // 2)
    else:
        group = world
    precision, reduce = _precision(cfg["param_dtype"], cfg["reduce_dtype"])
    # CPUOffloadPolicy moves sharded params, grads and optimizer states to the host: on a GPU run
    # that is offload of all three; a CPU run has one pool, nothing moves
    offload = st.OFFLOAD_ALL if cfg.get("cpu_offload") and record_on_cuda(record) else st.OFFLOAD_NONE
    return Columns.build(
        **model_values(spec), world_size=world, gpus_per_node=world, gpu_memory_bytes=1 << 50,
        host_ram_bytes_per_node=1 << 50, nccl_buffer_bytes=0,
        strategy=st.code(st.STRATEGIES, strategy, "strategy"), engine=st.code(st.ENGINES, cfg["engine"], "engine"),
        precision=st.code(st.PRECISIONS, precision, "precision"),
        reduce_dtype=st.code(st.REDUCE_DTYPES, reduce, "reduce_dtype"),
        optimizer=st.code(st.OPTIMIZERS, cfg["optimizer"], "optimizer"), ac=st.code(st.AC_MODES, cfg["ac"], "ac"),
        ac_every_k=1, offload=offload, method=st.FULL, micro_batch=cfg["micro_batch"],
        seq_len=cfg["seq_len"], grad_accum=1, shard_group_size=group,
        attention=st.SDPA if spec.norm == "rmsnorm" else st.EAGER, dropout=bool(cfg.get("dropout", 0.0) > 0),
        # the tiny harness expands position ids to b rows (transformers builds RoPE from one row);
        # its runs are CPU runs, whose flash SDPA kernel takes fp32 with GQA
        rope_shared_batch=False, sdpa_fp32_gqa_math=False, optimizer_impl=st.OPT_FOREACH if record_on_cuda(record) else st.OPT_FOR_LOOP,
    )


def harness_extra_bytes(record: dict, spec: ModelSpec) -> int:
    """Inputs (ids + labels, int64) and module buffers the harness's tracker also counts."""
    cfg = record["config"]
    inputs = 2 * 8 * cfg["micro_batch"] * cfg["seq_len"]
    if spec.norm == "rmsnorm":
        buffers = 4 * (spec.resolved_head_dim // 2)
    else:
        buffers = spec.num_layers * spec.max_position_embeddings ** 2
    return inputs + buffers


def predict(record: dict) -> dict[str, int]:
    """Predicted bytes per category for one record."""
    spec = record_spec(record)
    c = record_columns(record, spec)
    cuda = record_on_cuda(record)
    m = estimate_memory(c, optimizer_step_on_device=not cuda)
    states = model_states(c, optimizer_step_on_device=not cuda)
    n_p, _, _ = st.shard_degrees(c.strategy, c.engine, c.world_size, c.shard_group_size)
    u = fsdp_units(c, n_p)
    L = int(c.num_layers)
    keep = bool(u["keep_unsharded"])
    extra = harness_extra_bytes(record, spec)
    ag_root, ag_block = int(u["all_gather_root"]), int(u["all_gather_block"])
    pairs = [ag_root + ag_block] + ([2 * ag_block] if L > 1 else [])
    out = {
        "params_sharded": int(states["params"]),
        "grads_sharded": int(states["grads"]),
        "optimizer": int(states["optimizer_states"]),
        "all_gather_buffers": max(pairs) if ag_block else 0,
        "reduce_scatter_buffers": max(int(u["reduce_scatter_root"]), int(u["reduce_scatter_block"])),
        "unsharded_params": int(u["root_unsharded"] + u["block_unsharded"] * (L if keep else 1)),
        "unsharded_grads": max(int(u["unsharded_grads_root"]), int(u["unsharded_grads_block"])),
        "activations": int(m["forward_peak_activations"]) if "forward_peak_activations" in m else None,
        "forward_peak": int(m["forward_peak_bytes"]) + extra,
        "backward_peak": int(m["backward_peak_bytes"]) + extra,
        "total_peak": int(max(m["forward_peak_bytes"], m["backward_peak_bytes"], m["optimizer_step_peak_bytes"])) + extra,
    }
    if out["activations"] is None:
        from shardplan.formulas.activations import block_activation_bytes, head_activation_bytes, logits_forward_bytes

        out["activations"] = int(block_activation_bytes(c) + head_activation_bytes(c) + logits_forward_bytes(c))
    if record["config"]["engine"] == "fsdp1":
        out.update(_fsdp1_categories(c, n_p, alloc=cuda_bytes if cuda else int))
    if cuda:
        out = cuda_rounding(out, record, spec, c, n_p, u)
    return out


def _allocations(record: dict, spec: ModelSpec, c, n_p: int) -> dict[str, list[int]]:
    """The separate allocations (bytes) of the persistent state categories on one rank.

    FSDP2 (torch ``_fully_shard/_fsdp_param.py``): every parameter is its own padded shard of
    ceil(dim0/n) rows (fp32: the harness's parameters), and AdamW's ``exp_avg`` / ``exp_avg_sq``
    (SGD: ``momentum_buffer``) are ``zeros_like`` of it; the sharded gradients of one unit are
    views of that unit's one reduce-scatter output (``_fsdp_collectives.foreach_reduce``:
    ``as_strided`` of ``reduce_output``, cast once to the parameter dtype when the reduce dtype
    differs). FSDP1 (``use_orig_params=False``): one flat parameter per unit, ceil(P_unit/n)
    elements on a rank, its gradient and optimizer states one tensor each. Under CPU offload the
    states are host memory: no CUDA allocations.
    """
    if int(c.offload) != st.OFFLOAD_NONE:
        return {"params_sharded": [], "grads_sharded": [], "optimizer": []}
    n = max(int(n_p), 1)
    states = 2 if record["config"]["optimizer"] == "adamw" else 1
    units = spec.parameter_shapes()
    if record["config"]["engine"] == "fsdp1":
        per_unit = [4 * -(-sum(math.prod(t) for t in shapes) // n) for shapes in units.values()]
        return {"params_sharded": per_unit, "grads_sharded": per_unit, "optimizer": per_unit * states}
    shard = lambda t: -(-t[0] // n) * math.prod(t[1:])  # noqa: E731
    per_param = [4 * shard(t) for shapes in units.values() for t in shapes]
    per_unit = [4 * sum(shard(t) for t in shapes) for shapes in units.values()]
    return {"params_sharded": per_param, "grads_sharded": per_unit, "optimizer": per_param * states}


def cuda_rounding(out: dict[str, int], record: dict, spec: ModelSpec, c, n_p: int, u) -> dict[str, int]:
    """Predicted bytes as a CUDA run counts them: each allocation rounded up to 512 bytes.

    State categories: the allocations of ``_allocations``. FSDP2 transient buffers: the unit's
    flat all-gather buffer (input is a slice of the output), its reduce-scatter input, every
    unsharded parameter (a view of its own padded all-gather output) and unsharded gradient
    (unpadded, one per parameter). Phase peaks add the rounding of the states alive then
    (forward: params + optimizer, the gradients are freed by ``zero_grad(set_to_none=True)``;
    backward and overall: params + grads + optimizer). ASSUMPTION: activations and temporaries,
    hundreds of tensors of model-dependent sizes, are left unrounded (≤ 511 B each).
    """
    out = dict(out)
    slack = {}
    for cat, sizes in _allocations(record, spec, c, n_p).items():
        slack[cat] = sum(cuda_bytes(b) - b for b in sizes)
        out[cat] += slack[cat]
    if record["config"]["engine"] == "fsdp2":
        n = max(int(n_p), 1)
        a = int(compute_dtype_bytes(c.precision))
        units = spec.parameter_shapes()
        unsh = {k: sum(cuda_bytes(a * -(-t[0] // n) * n * math.prod(t[1:])) for t in v) for k, v in units.items()}
        grads = {k: sum(cuda_bytes(a * math.prod(t)) for t in v) for k, v in units.items()}
        block = max((k for k in units if k != "root"), key=lambda k: unsh[k], default="root")
        L = int(c.num_layers)
        keep = bool(u["keep_unsharded"])
        if out["unsharded_params"]:
            out["unsharded_params"] = unsh["root"] + unsh[block] * (L if keep else 1)
        if out["unsharded_grads"]:
            out["unsharded_grads"] = max(grads["root"], grads[block])
        ag_root, ag_block = cuda_bytes(int(u["all_gather_root"])), cuda_bytes(int(u["all_gather_block"]))
        if out["all_gather_buffers"]:
            out["all_gather_buffers"] = max([ag_root + ag_block] + ([2 * ag_block] if L > 1 else []))
        if out["reduce_scatter_buffers"]:
            out["reduce_scatter_buffers"] = max(cuda_bytes(int(u["reduce_scatter_root"])),
                                                cuda_bytes(int(u["reduce_scatter_block"])))
    live = slack["params_sharded"] + slack["optimizer"]
    out["forward_peak"] += live
    out["backward_peak"] += live + slack["grads_sharded"]
    out["total_peak"] += live + slack["grads_sharded"]
    return out


def _fsdp1_categories(c, n_p, alloc=int) -> dict[str, int]:
    """FSDP1's buffers as ``StorageTracker`` categorises them (the maximum of each category over the
    step), from the production sizes (``buffers.fsdp_units``, ``buffers.fsdp1_unit_buffers``):

    * unsharded params: the root is not resharded after forward and, in backward, the next block
      is prefetched (BACKWARD_PRE) while the current one computes: root + min(L, 2) blocks
      (SHARD_GRAD_OP: root + every block); none for NO_SHARD;
    * all-gather input: the largest ``_mp_shard``. NO_SHARD computes on it (the unit's 16-bit
      copy) and frees it at each reshard (``FlatParamHandle.post_reshard``, after the unit's forward
      and in its post-backward hook): the root's and min(L, 2) blocks' (measured: 4 blocks,
      fsdp1_grad_moments_cpu.jsonl; every unit's before, +94 % there, exact only with 2 blocks);
    * reduce-scatter: the largest unit's input + output shard; unsharded gradient: the largest
      unit's ``flat_param.grad`` (autograd's, then upcast to the reduce dtype).

    ``alloc`` maps one allocation's bytes to what the run counts (``cuda_bytes`` on CUDA).
    """
    L = int(c.num_layers)
    u, one = fsdp_units(c, n_p), fsdp1_unit_buffers(c, n_p)
    if int(n_p) <= 1:
        return {"unsharded_params": 0, "all_gather_buffers": alloc(int(one["mp_shard_root"])) + min(L, 2) * alloc(int(one["mp_shard_block"])),
                "reduce_scatter_buffers": 0, "unsharded_grads": 0}
    keep = bool(u["keep_unsharded"])
    rs = [alloc(int(n_p) * int(one[f"rs_output_{k}"])) + alloc(int(one[f"rs_output_{k}"])) if int(u[f"reduce_scatter_{k}"]) else 0
          for k in ("root", "block")]
    return {"unsharded_params": alloc(int(u["root_unsharded"])) + alloc(int(u["block_unsharded"])) * (L if keep else min(L, 2)),
            "all_gather_buffers": max(alloc(int(one["mp_shard_root"])), alloc(int(one["mp_shard_block"]))),
            "reduce_scatter_buffers": max(rs),
            "unsharded_grads": max(alloc(int(u["unsharded_grads_root"])), alloc(int(u["unsharded_grads_block"])))}


def config_label(record: dict) -> str:
    cfg = record["config"]
    model = cfg["model"] + ("" if not cfg.get("tiny") else "-tiny")
    group = f"/g{cfg['shard_size']}" if cfg.get("shard_size") else ""
    return (f"{cfg['engine']}/{cfg['strategy']}{group}/W{cfg['world_size']}/{model}/p={cfg['param_dtype']},"
            f"r={cfg['reduce_dtype']}/ac={cfg['ac']}/{cfg['optimizer']}/b{cfg['micro_batch']}s{cfg['seq_len']}"
            f"{'/offload' if cfg.get('cpu_offload') else ''}")


def measured(record: dict) -> dict[str, int]:
    m = record["measured"]
    out = {cat: int(m.get(field, 0)) for cat, field in MEASURED_FIELD.items()}
    out["forward_peak"] = int(record.get("forward_peak_bytes") or 0)
    out["backward_peak"] = int(record.get("backward_peak_bytes") or 0)
    out["total_peak"] = int(record.get("total_peak_bytes") or 0)
    return out


def compare_records(records: Iterable[dict], source: str = "") -> list[dict]:
    """Tidy rows: source, key, configuration, engine, device, category, predicted, measured, error.

    CUDA records add ``cuda_max_allocated``: the predicted total peak against the caching
    allocator's own ``max_memory_allocated`` over the tracked step (max over ranks), which also
    sees what the dispatcher-level trackers do not (e.g. cuBLAS workspaces)."""
    rows = []
    for rec in records:
        if rec.get("status") != "ok" or "hf_config" in rec:  # real-HF-stack records: compare_hf
            continue
        check_record(rec, f"{source or 'records'} key {rec.get('key')!r}"[:120])
        pred, meas = predict(rec), measured(rec)
        cats = FSDP1_CATEGORIES if rec["config"]["engine"] == "fsdp1" else CATEGORIES
        cuda = record_on_cuda(rec)
        if cuda and rec.get("cuda_max_allocated_bytes") is not None:
            cats = (*cats, "cuda_max_allocated")
            pred["cuda_max_allocated"], meas["cuda_max_allocated"] = pred["total_peak"], int(rec["cuda_max_allocated_bytes"])
        for cat in cats:
            p, mv = pred[cat], meas[cat]
            err = 0.0 if p == mv else (float("inf") if mv == 0 else (p - mv) / mv)
            rows.append(dict(source=source, key=rec.get("key"), configuration=config_label(rec),
                             engine=rec["config"]["engine"], fake_tensors=bool(rec["config"].get("fake_tensors")),
                             device="cuda" if cuda else "cpu", category=cat, predicted_bytes=p, measured_bytes=mv,
                             error=err))
    return rows


def compare_files(paths: Iterable[str | Path]) -> list[dict]:
    from shardplan.calibrate.results import read_jsonl

    rows = []
    for path in paths:
        check_file(path, "records")  # a missing path is an error here, not an empty file to append to
        rows += compare_records(read_jsonl(path), source=Path(path).name)
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Max and median |error| per (engine, shape, category)."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        shape = "7B fake tensors" if r["fake_tensors"] else "tiny"
        if r.get("device", "cpu") != "cpu":
            shape = f"{shape}, {r['device']}"
        groups.setdefault((r["engine"], shape, r["category"]), []).append(abs(r["error"]))
    out = []
    for (engine, shape, cat), errs in groups.items():
        out.append(dict(engine=engine, shape=shape, category=cat, n=len(errs), max_abs_error=max(errs),
                        median_abs_error=statistics.median(errs)))
    order = {c: i for i, c in enumerate((*CATEGORIES, "cuda_max_allocated"))}
    return sorted(out, key=lambda r: (r["engine"], r["shape"], order.get(r["category"], 99)))


def summary_markdown(rows: list[dict], command: str = "") -> str:
    lines = ["# Predicted vs measured (shardplan memory model vs torch 2.13 FSDPMemTracker / MemTracker)", ""]
    if command:
        cuda = any(r.get("device", "cpu") != "cpu" for r in rows)
        where = ("CPU and CUDA records; CUDA rows are marked in the runs column" if cuda else
                 "CPU only: fake process group, gloo, FakeTensorMode; no GPU")
        lines += [f"Produced by `{command}` from the committed records in `data/calibration/` ({where}).", ""]
    lines += ["| engine | runs | category | n | max abs error | median abs error |",
              "| --- | --- | --- | ---: | ---: | ---: |"]
    for s in summarize(rows):
        lines.append(f"| {s['engine']} | {s['shape']} | {s['category']} | {s['n']} | {100 * s['max_abs_error']:.3f} % "
                     f"| {100 * s['median_abs_error']:.3f} % |")
    worst = sorted(rows, key=lambda r: -abs(r["error"]))[:5]
    lines += ["", "Largest errors:", ""]
    for r in worst:
        lines.append(f"* {r['configuration']} {r['category']}: predicted {r['predicted_bytes']:,}, "
                     f"measured {r['measured_bytes']:,} ({100 * r['error']:+.3f} %)")
    return "\n".join(lines) + "\n"


def print_table(rows: list[dict], echo=print) -> None:
    echo(f"{'configuration':72s} {'category':22s} {'predicted':>16s} {'measured':>16s} {'error':>9s}")
    for r in rows:
        echo(f"{r['configuration'][:72]:72s} {r['category']:22s} {r['predicted_bytes']:16,d} "
             f"{r['measured_bytes']:16,d} {100 * r['error']:8.3f}%")


def write_outputs(rows: list[dict], csv_path=None, json_path=None, md_path=None, command: str = "",
                  force: bool = False) -> None:
    from shardplan.calibrate.results import write_csv_atomic, write_json_atomic
    from shardplan.support.atomic_write import write_text_atomic

    if csv_path:
        columns = ["source", "key", "configuration", "engine", "fake_tensors", "category", "predicted_bytes",
                   "measured_bytes", "error"]
        if any(r.get("device", "cpu") != "cpu" for r in rows):
            columns.insert(4, "device")
        write_csv_atomic(csv_path, rows, columns=columns, force=force)
    if json_path:
        write_json_atomic(json_path, {"rows": rows, "summary": summarize(rows)}, force=force)
    if md_path:
        write_text_atomic(md_path, summary_markdown(rows, command), force=force)
