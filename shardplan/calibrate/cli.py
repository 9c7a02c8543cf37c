"""``shardplan calibrate ...``: the typer app ``calibrate_app`` (mount with
``app.add_typer(calibrate_app, name="calibrate")``). Thin: parse, call the library, write files
atomically, print a short table. torch is imported inside the commands only.

Errors are raised as ``ShardplanError``, never printed here: ``shardplan.cli.app.main`` turns them
into one stderr line and exit code 2 (a refused fit, a too-small sample, nothing to compare, no
configuration measured). Run the commands through ``shardplan.cli.app.main`` (as the ``shardplan``
script and ``python -m shardplan`` do), not by calling ``calibrate_app`` directly."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer

from shardplan.support.errors import ShardplanError
from shardplan.support.extras import require
from shardplan.support.limits import MAX_BYTES, MAX_MATMUL_SIZE, bounded_int
from shardplan.support.output_path import FORCE_OUTPUT_HELP

calibrate_app = typer.Typer(help="Measure real torch runs and fit link / compute coefficients.",
                            no_args_is_help=True, add_completion=False)


def _check_outputs(force: bool, **paths: Optional[Path]) -> None:
    """Every file the command will write, checked before anything is measured (output_path.py):
    never a symbolic link, a read-only file only with ``force`` (the policy of every writer,
    shardplan/support/atomic_write.py)."""
    from shardplan.support.output_path import writable_output

    for field, path in paths.items():
        writable_output(path, field, force)


def _progress(msg: str) -> None:
    typer.echo(msg, err=True)


@calibrate_app.command("fsdp")
def fsdp_cmd(
    out: Path = typer.Option(Path("calibration_fsdp.jsonl"), help="results JSONL (appended; resumable)"),
    grid: str = typer.Option("", help="'default' = the built-in test grid (>= 24 tiny configurations)"),
    config: Optional[Path] = typer.Option(None, help="JSON file: one RunConfig object or a list of them"),
    model: str = typer.Option("llama-3.1-8b", help="model name/path (tiny dimensions unless --full-size)"),
    full_size: bool = typer.Option(False, help="keep the model's real dimensions (use with --fake-tensors)"),
    world_size: List[int] = typer.Option([2], help="repeatable"),
    engine: List[str] = typer.Option(["fsdp2"], help="fsdp2 / fsdp1 (repeatable)"),
    strategy: List[str] = typer.Option(["full_shard"], help="full_shard / shard_grad_op / hybrid_shard / no_shard"),
    param_dtype: str = typer.Option("bfloat16"),
    reduce_dtype: str = typer.Option("float32"),
    ac: List[str] = typer.Option(["none"], help="none / full / selective (repeatable)"),
    optimizer: str = typer.Option("adamw"),
    micro_batch: int = typer.Option(2),
    seq_len: int = typer.Option(32),
    launch: str = typer.Option("auto", help="auto (spawn when CUDA GPUs are visible, else fake), fake (one "
                                            "process, fake PG) or spawn (real ranks, one per GPU: nccl; gloo on CPU)"),
    device: Optional[str] = typer.Option(None, help="cuda: with --launch fake, real CUDA tensors on one GPU "
                                                    "(rank 0 of any world size); cpu: keep a fake run on the CPU"),
    fake_tensors: bool = typer.Option(False, help="FakeTensorMode: no real allocation (7B-70B shapes)"),
    timeout: float = typer.Option(600.0, help="seconds per configuration before it is recorded as a timeout"),
    isolate: bool = typer.Option(True, help="run each configuration in a child process (survives OOM/hangs)"),
    resume: bool = typer.Option(True, help="skip configurations already in --out"),
    retry_failed: bool = typer.Option(False, help="with --resume: run again the configurations --out records "
                                                  "with a status other than ok (an OOM, a timeout, an error)"),
    csv: Optional[Path] = typer.Option(None, help="also write a flat CSV of all records in --out"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="also write all records as one JSON file"),
    compare_csv: Optional[Path] = typer.Option(None, help="write predicted vs measured per category (CSV)"),
    compare_json: Optional[Path] = typer.Option(None, help="write predicted vs measured per category (JSON)"),
    force: bool = typer.Option(False, "--force", help=FORCE_OUTPUT_HELP),
):
    """Measure FSDP training runs: per-category peak memory, phase peaks, step time, collectives;
    then print shardplan's prediction next to each measured category."""
    from shardplan.calibrate.launch import run_grid

    _check_options(world_size=world_size, micro_batch=micro_batch, seq_len=seq_len, timeout=timeout)
    _check_outputs(force, out=out, csv=csv, json=json_out, compare_csv=compare_csv, compare_json=compare_json)
    axes = {"world_size": world_size, "engine": engine, "strategy": strategy, "ac": ac}
    fields = dict(model=model, param_dtype=param_dtype, reduce_dtype=reduce_dtype, optimizer=optimizer,
                  micro_batch=micro_batch, seq_len=seq_len, fake_tensors=fake_tensors,
                  **({"tiny": {}} if full_size else {}))
    configs = _fsdp_configs(grid, config, launch, device, axes, fields)
    run_grid(configs, out, isolate=isolate, timeout_s=timeout, resume=resume, retry_failed=retry_failed,
             progress=_progress, force=force)
    _report_fsdp(configs, out, csv, json_out, force)
    _compare([out], compare_csv, compare_json, None, force=force)


def _fsdp_configs(grid: str, config: Optional[Path], launch: str, device: Optional[str], axes: dict,
                  fields: dict) -> list:
    """The configurations to run: the built-in grid, a ``--config`` file, or the product of the
    repeatable options (``axes``) over the single-valued ones (``fields``); each validated, and its
    world size checked against the devices, before anything runs."""
    import itertools

    from shardplan.calibrate.config import RunConfig, default_grid
    from shardplan.calibrate.launch import check_world_size, resolve_launch

    try:
        require("torch", "calibrate")  # before anything runs or is recorded
        if launch not in ("auto", "fake", "spawn", "torchrun"):
            raise ShardplanError("launch", launch, "expected auto, fake, spawn or torchrun")
        launch = resolve_launch(launch)
        extra = _device_field(launch, device)
        if grid == "default":
            configs = [c.model_copy(update=extra) for c in default_grid(launch=launch)]
        elif config is not None:
            from shardplan.support.input_files import read_json

            data = read_json(config, "config")
            configs = [RunConfig.model_validate(d) for d in (data if isinstance(data, list) else [data])]
        else:
            configs = [RunConfig(**dict(zip(axes, values)), **fields, launch=launch, **extra)
                       for values in itertools.product(*axes.values())]
        for c in configs:  # before anything runs: more ranks than GPUs would hang inside NCCL
            RunConfig.model_validate(c.model_dump())
            check_world_size(c)
    except ShardplanError:
        raise
    except (ValueError, OSError) as err:  # the --config file: unreadable, not JSON, or not a RunConfig
        raise ShardplanError("config", str(config or grid or fields["model"]), str(err).splitlines()[0]) from None
    return configs


def _device_field(launch: str, device: Optional[str]) -> dict:
    """``{"device": ...}`` for every configuration, or nothing: real ranks on a GPU box run on CUDA,
    and say so, so that their resume keys differ from CPU runs'."""
    if device is None and launch != "fake":
        import torch

        device = "cuda" if torch.cuda.is_available() else None
    return {"device": device} if device else {}


def _report_fsdp(configs: list, out: Path, csv: Optional[Path], json_out: Optional[Path], force: bool) -> None:
    """Write the optional CSV / JSON of every record in ``out`` and print them; refuse (exit 2) when
    none of this run's configurations was measured, so a script sees it."""
    from shardplan.calibrate.results import flatten, read_jsonl, write_csv_atomic, write_json_atomic

    records = read_jsonl(out)
    rows = [flatten(r) for r in records]
    if csv:
        write_csv_atomic(csv, rows, force=force)
    if json_out:
        write_json_atomic(json_out, records, force=force)
    _print_rows(rows)
    asked = {c.key() for c in configs}
    mine = [r for r in records if r.get("key") in asked]
    if not any(r.get("status") == "ok" for r in mine):  # nothing measured: nothing to compare
        statuses = ", ".join(sorted({str(r.get("status")) for r in mine}))
        raise ShardplanError("out", str(out), f"none of the {len(asked)} configuration(s) was measured: recorded as "
                                              f"{statuses} (see the error column; --retry-failed runs them again)")


def _compare(paths, csv_path, json_path, md_path, command: str = "", force: bool = False):
    from shardplan.calibrate.compare import compare_files, print_table, write_outputs

    table = compare_files(paths)
    if not table:
        raise ShardplanError("records", ", ".join(str(p) for p in paths),
                             "nothing to compare: no FSDP harness record with status ok (real-HF-stack records "
                             "are compared by benchmarks/calibrate_hf_stack.py)")
    print_table(table, echo=typer.echo)
    write_outputs(table, csv_path=csv_path, json_path=json_path, md_path=md_path, command=command, force=force)


@calibrate_app.command("compare")
def compare_cmd(
    records: List[Path] = typer.Argument(..., help="harness JSONL files (e.g. data/calibration/*.jsonl)"),
    csv: Optional[Path] = typer.Option(None, help="write the table as CSV"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the table and its summary as JSON"),
    md: Optional[Path] = typer.Option(None, help="write a markdown summary (max/median error per category)"),
    force: bool = typer.Option(False, "--force", help=FORCE_OUTPUT_HELP),
):
    """Predicted vs measured per category for records already measured (no torch needed)."""
    _check_outputs(force, csv=csv, json=json_out, md=md)
    _compare(records, csv, json_out, md, command="shardplan calibrate compare " + " ".join(str(r) for r in records)
             + (f" --csv {csv}" if csv else "") + (f" --md {md}" if md else ""), force=force)


def _print_rows(rows):
    cols = ["engine", "strategy", "world_size", "param_dtype", "ac", "status", "total_peak_bytes",
            "forward_peak_bytes", "backward_peak_bytes"]
    typer.echo("  ".join(cols))
    for r in rows:
        typer.echo("  ".join(str(r.get(c, "")) for c in cols))


@calibrate_app.command("collectives")
def collectives_cmd(
    out: Path = typer.Option(Path("calibration.json"), help="calibration overlay to write/merge"),
    nccl_tests: List[Path] = typer.Option([], help="import nccl-tests output file(s) instead of measuring"),
    samples: List[Path] = typer.Option([], help="import samples written by 'torchrun ... -m "
                                                "shardplan.calibrate.collectives --out FILE' (multi-node)"),
    op: Optional[str] = typer.Option(None, help="collective of the nccl-tests file (default: from its text)"),
    world_size: List[int] = typer.Option([2], help="ranks to benchmark with (repeatable); or of the file"),
    tier: Optional[str] = typer.Option(None, help="link tier (intra_node / inter_node); default: from the file's "
                                                  "host names, or intra_node for local ranks"),
    min_bytes: int = typer.Option(1024),
    max_bytes: Optional[int] = typer.Option(None, help="default 1 GiB on GPUs (links saturate), 16 MiB on CPU"),
    factor: int = typer.Option(2, help="size step factor"),
    iters: int = typer.Option(20, help="back-to-back iterations timed as one batch per size (nccl-tests -n)"),
    warmup: int = typer.Option(5, help="untimed iterations per size (nccl-tests -w)"),
    dtype: str = typer.Option("float32", help="element type of the buffers"),
    min_r2_log: float = typer.Option(0.90, help="refuse fits with a lower R² (log space)"),
    max_rel_err: float = typer.Option(0.50, help="refuse fits with a larger max relative error"),
    samples_csv: Optional[Path] = typer.Option(None, help="write the raw samples as CSV"),
    fits_json: Optional[Path] = typer.Option(None, help="write the fits with residuals as JSON"),
    link: Optional[str] = typer.Option(None, help="link profile the ranks talked over (nvlink4, pcie4, ib-ndr ...): "
                                                  "recorded in the overlay, which fit/plan then refuse on other links"),
    gpu: Optional[str] = typer.Option(None, help="GPU profile of imported files (measured here: the device's own)"),
    force: bool = typer.Option(False, "--force", help=FORCE_OUTPUT_HELP),
):
    """Benchmark (or import nccl-tests output for) AG/RS/AR and fit t = α + S·f(n)/B per size regime."""
    from dataclasses import asdict

    from shardplan.calibrate.collectives import fit_all
    from shardplan.calibrate.overlay import write_calibration
    from shardplan.calibrate.results import write_csv_atomic, write_json_atomic

    _check_options(world_size=world_size, iters=iters, warmup=warmup, min_r2_log=min_r2_log, max_rel_err=max_rel_err)
    _check_outputs(force, out=out, samples_csv=samples_csv, fits_json=fits_json)
    link, gpu_name = _stated_machine(link, gpu)
    if nccl_tests or samples:
        got, source = _imported_samples(nccl_tests, samples, op=op, world_size=world_size, tier=tier)
    else:
        got, source = _benchmarked_samples(world_size, tier=tier, min_bytes=min_bytes, max_bytes=max_bytes,
                                           factor=factor, iters=iters, warmup=warmup, dtype=dtype)
    if samples_csv:  # written before fitting, so a refused fit can still be inspected
        write_csv_atomic(samples_csv, [dict(asdict(s), algbw_bytes_per_s=s.algbw_bytes_per_s,
                                            busbw_bytes_per_s=s.busbw_bytes_per_s) for s in got], force=force)
    fits = fit_all(got, min_r2_log=min_r2_log, max_rel_err=max_rel_err)
    if fits_json:
        write_json_atomic(fits_json, [f.to_dict() for f in fits], force=force)
    write_calibration(out, links=fits, source={**({"gpu": gpu_name} if gpu_name else {}), **source}, link=link,
                      force=force)
    _print_link_fits(fits)
    typer.echo(f"wrote {out}")


def _imported_samples(nccl_tests: List[Path], samples: List[Path], op: Optional[str], world_size: List[int],
                      tier: Optional[str]) -> tuple[list, dict]:
    """Samples read from nccl-tests output and from files the torchrun benchmark wrote, and the
    overlay's ``source`` naming those files. A ``--world-size`` other than the default states the
    nccl-tests files' rank count."""
    from shardplan.calibrate.collectives import load_samples, parse_nccl_tests_file

    ws = world_size[0] if world_size != [2] else None
    got = []
    for f in nccl_tests:
        got += parse_nccl_tests_file(f, op=op, world_size=ws, tier=tier)
    for f in samples:
        got += load_samples(f)
    return got, {"imported": [str(f) for f in [*nccl_tests, *samples]]}


def _benchmarked_samples(world_size: List[int], tier: Optional[str], min_bytes: int, max_bytes: Optional[int],
                         factor: int, iters: int, warmup: int, dtype: str) -> tuple[list, dict]:
    """Samples measured here, on ranks spawned on this node, and the overlay's ``source`` (the
    environment they ran in)."""
    from shardplan.calibrate.collectives import benchmark_spawn, check_devices, default_sizes

    if tier == "inter_node":
        raise ShardplanError("tier", tier, "locally spawned ranks share one node; run "
                                           "'torchrun ... -m shardplan.calibrate.collectives' across nodes")
    torch = require("torch", "calibrate")

    cuda = torch.cuda.is_available()
    for w in world_size:
        check_devices(w)
    sizes = default_sizes(min_bytes, max_bytes, factor, cuda=cuda)
    got = []
    for w in world_size:
        _progress(f"benchmarking all_gather / reduce_scatter / all_reduce on {w} local ranks, "
                  f"{len(sizes)} sizes up to {sizes[-1]:,} B, {iters} iterations each ...")
        got += benchmark_spawn(w, sizes=sizes, iters=iters, warmup=warmup, dtype=dtype, tier="intra_node")
    return got, _env()


def _stated_machine(link: Optional[str], gpu: Optional[str]) -> tuple[Optional[str], Optional[str]]:
    """``--link`` and ``--gpu`` as profile names (one-line errors for unknown ones)."""
    from shardplan.inputs.hardware import get_gpu, get_link

    return (get_link(link).name if link else None), (get_gpu(gpu).name if gpu else None)


def _print_link_fits(fits: list) -> None:
    typer.echo("op              n  tier         segment             alpha_us   B_GB/s   R2_log  max_rel_err")
    for f in fits:
        for s in f.segments:
            typer.echo(f"{f.op:14s} {f.world_size:3d}  {f.tier:11s}  {s.min_bytes:>9d}-{s.max_bytes:<9d} "
                       f"{s.alpha_s * 1e6:9.2f} {_gb_per_s(s.bandwidth_bytes_per_s)}   {f.r2_log:.4f}  {f.max_rel_err:.3f}")


def _gb_per_s(bandwidth: float | None) -> str:
    return " latency" if bandwidth is None else f"{bandwidth / 1e9:8.3f}"


@calibrate_app.command("compute")
def compute_cmd(
    out: Path = typer.Option(Path("calibration.json"), help="calibration overlay to write/merge"),
    dtype: List[str] = typer.Option([], help="bfloat16 / float16 / float32 / tf32 / float8_e4m3fn (repeatable); "
                                             "default: all the device runs (CPU: float32, bfloat16)"),
    size: List[int] = typer.Option([], help="square matmul sizes m (repeatable); default 256..16384 on GPUs, "
                                            "64..1024 on CPU"),
    iters: int = typer.Option(50, help="back-to-back matmuls timed as one batch per size"),
    warmup: int = typer.Option(5),
    bandwidth: bool = typer.Option(True, help="also measure element-wise memory bandwidth (copy, add)"),
    bandwidth_bytes: List[int] = typer.Option([], help="operand sizes in bytes for the bandwidth kernels"),
    min_saturation: float = typer.Option(0.9, help="refuse a fit whose largest size reaches less of F_max"),
    peak_tflops: Optional[float] = typer.Option(None, help="nameplate peak (TFLOP/s) to express efficiency"),
    threads: int = typer.Option(1, help="CPU threads (torch.set_num_threads)"),
    samples_csv: Optional[Path] = typer.Option(None),
    force: bool = typer.Option(False, "--force", help=FORCE_OUTPUT_HELP),
):
    """Measure achieved GEMM FLOP/s per dtype and size (fit F_max/(1+(m_half/m)^p)) and the
    element-wise memory bandwidth."""
    from dataclasses import asdict

    _check_options(iters=iters, warmup=warmup, min_saturation=min_saturation, peak_tflops=peak_tflops, threads=threads)
    size = [bounded_int(m, "size", 1, MAX_MATMUL_SIZE) for m in size]
    bandwidth_bytes = [bounded_int(b, "bandwidth_bytes", 1, MAX_BYTES) for b in bandwidth_bytes]
    threads = bounded_int(threads, "threads", 1, os.cpu_count() or 1)  # more than the cores only contend
    _check_outputs(force, out=out, samples_csv=samples_csv)
    torch = require("torch", "calibrate")

    from shardplan.calibrate.compute import bandwidth_entries, fit_efficiency, measure_bandwidth, measure_matmul
    from shardplan.calibrate.overlay import write_calibration
    from shardplan.calibrate.results import write_csv_atomic

    torch.set_num_threads(threads)
    cuda = torch.cuda.is_available()
    sm_count = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count if cuda else None
    samples = measure_matmul(dtypes=tuple(dtype) or None, sizes=tuple(size) or None, iters=iters, warmup=warmup,
                             progress=_progress)
    if samples_csv:  # written before fitting, so a refused fit can still be inspected
        write_csv_atomic(samples_csv, [dict(asdict(s), flops_per_s=s.flops_per_s) for s in samples], force=force)
    dtypes = list(dict.fromkeys(s.dtype for s in samples))
    fits = [fit_efficiency([s for s in samples if s.dtype == d], min_saturation=min_saturation, sm_count=sm_count,
                           peak_flops_per_s=peak_tflops * 1e12 if peak_tflops else None) for d in dtypes]
    bw = measure_bandwidth(sizes_bytes=tuple(bandwidth_bytes) or None, iters=iters, warmup=warmup,
                           progress=_progress) if bandwidth else []
    write_calibration(out, compute=fits, bandwidth=bandwidth_entries(bw), source=_env(), force=force)
    for f in fits:
        typer.echo(f"{f.dtype:14s} {f.device}: F_max {f.f_max_flops_per_s / 1e12:.4f} TFLOP/s, m_half {f.m_half:.0f}, "
                   f"p {f.p:.1f}, max rel err {f.max_rel_err:.3f}")
    for e in bandwidth_entries(bw):
        typer.echo(f"{e['kernel']:5s} {e['dtype']:9s} {e['device']}: {e['bytes_per_s'] / 1e9:.1f} GB/s "
                   f"({e['size_bytes']:,} B operands)")
    typer.echo(f"wrote {out}")


def _check_options(**values) -> None:
    """Numbers and thresholds within limits.INT_RANGES / FLOAT_RANGES before anything runs (a NaN
    threshold would switch its check off; 0 iterations leave nothing to time)."""
    from shardplan.support.limits import INT_RANGES, checked_float, checked_int

    for name, value in values.items():
        for v in (value if isinstance(value, list) else [value]):
            if v is not None:
                (checked_int if name in INT_RANGES else checked_float)(name, v)


def _env() -> dict:
    import datetime as dt
    import platform

    import torch

    env = {"torch": torch.__version__, "python": platform.python_version(),
           "date": dt.date.today().isoformat(), "device": "cpu"}
    try:
        env["cpu"] = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        env["cpu"] = platform.processor()
    from shardplan.calibrate.env import cuda_environment

    env.update(cuda_environment())
    return env
