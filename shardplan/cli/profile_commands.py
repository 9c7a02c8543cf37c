"""``shardplan models``, ``hardware`` and ``profiles``: list, show and validate profile files."""

from __future__ import annotations

from pathlib import Path

import typer
from tabulate import tabulate

from shardplan.cli.layout import output_width, table
from shardplan.cli.options import WIDE_HELP
from shardplan.formulas.accuracy_bands import load_bands
from shardplan.inputs.hardware import GPUProfile, LinkProfile, get_hardware, gpu_profiles, link_profiles
from shardplan.inputs.model import ModelSpec
from shardplan.inputs.models import model_profiles, resolve_model
from shardplan.inputs.profiles import load_profile, read_json
from shardplan.inputs.units import GiB
from shardplan.support.errors import ShardplanError
from shardplan.support.input_files import path_kind

models_app = typer.Typer(add_completion=False, invoke_without_command=True, help="List or show model profiles.")
hardware_app = typer.Typer(add_completion=False, invoke_without_command=True, help="List or show GPU and link profiles.")
profiles_app = typer.Typer(add_completion=False, invoke_without_command=True, help="Validate profile files.")


@profiles_app.callback()
def _profiles(ctx: typer.Context):
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())


@models_app.callback()
def models_list(ctx: typer.Context, wide: bool = typer.Option(False, "--wide", help=WIDE_HELP)):
    """List the built-in (and user) model profiles."""
    if ctx.invoked_subcommand:
        return
    rows = [[m.name, m.family, f"{m.total_params / 1e9:.2f}B", m.num_layers, m.hidden_size, m.vocab_size,
             ", ".join(m.aliases[:2])] for m in model_profiles()]
    headers = ["name", "family", "params", "layers", "hidden", "vocab", "aliases"]
    typer.echo(tabulate(rows, headers=headers) if wide else table(rows, headers, output_width(), wrap_columns=(6,), numparse=True))


@models_app.command("show")
def models_show(name: str, as_json: bool = typer.Option(False, "--json"),
                wide: bool = typer.Option(False, "--wide", help=WIDE_HELP)):
    """Show one model's dimensions and derived counts."""
    spec = resolve_model(name).spec
    derived = {"total_params": spec.total_params, "non_embedding_params": spec.non_embedding_params,
               "embedding_params": spec.embedding_params, "root_params": spec.root_params,
               "largest_block_params": spec.largest_block_params, "largest_module_params": spec.largest_module_params,
               "active_params_per_token": spec.active_params_per_token,
               "train_flops_per_token_at_4096": spec.train_flops_per_token(4096)}
    if as_json:
        import json
        typer.echo(json.dumps({**spec.model_dump(mode="json"), "derived": derived}, indent=2))
        return
    rows = [[k, v] for k, v in spec.model_dump(mode="json", exclude_none=True).items()] + [[k, f"{v:,}"] for k, v in derived.items()]
    typer.echo(tabulate(rows, headers=["field", "value"]) if wide
               else table(rows, ["field", "value"], output_width(), wrap_columns=(1,), numparse=True))


@hardware_app.callback()
def hardware_list(ctx: typer.Context, wide: bool = typer.Option(False, "--wide", help=WIDE_HELP)):
    """List GPU and link profiles."""
    if ctx.invoked_subcommand:
        return
    gpus = [[g.name, g.display_name, f"{g.memory_bytes / GiB:.1f}", _half_rate(g),
             f"{g.memory_bandwidth_bytes_per_s / 1e12:.2f}", g.default_intra_link] for g in gpu_profiles()]
    gpu_headers = ["gpu", "name", "GiB", "16-bit TFLOP/s", "memory TB/s", "intra link"]
    typer.echo(tabulate(gpus, headers=gpu_headers) if wide else table(gpus, gpu_headers, output_width(), wrap_columns=(1,), numparse=True))
    typer.echo("")
    links = [[l.name, l.kind, l.scope, f"{l.bandwidth_bytes_per_s / 1e9:.1f}", f"{l.latency_s * 1e6:.1f}", l.efficiency]
             for l in link_profiles()]
    link_headers = ["link", "kind", "scope", "GB/s per dir", "alpha us", "efficiency"]
    typer.echo(tabulate(links, headers=link_headers) if wide else table(links, link_headers, output_width(), numparse=True))


def _half_rate(gpu: GPUProfile) -> str:
    """The dense 16-bit tensor rate: bf16, else fp16 said as such (T4, V100 have no bf16)."""
    if "bf16" in gpu.peak_flops:
        return f"{gpu.peak_flops['bf16'] / 1e12:.0f}"
    return f"{gpu.peak_flops['fp16'] / 1e12:.0f} (fp16)"


def _shown(field: str, value) -> str:
    """One profile field for the table: bytes also in GiB, FLOP/s in TFLOP/s, rates in GB/s."""
    if field == "peak_flops":
        return ", ".join(f"{dtype} {rate / 1e12:,.1f}" for dtype, rate in value.items()) + " TFLOP/s (dense)"
    if field.endswith("_bytes") and isinstance(value, (int, float)):
        return f"{value:,} ({value / GiB:,.2f} GiB)"
    if field.endswith("_bytes_per_s") and isinstance(value, (int, float)):
        return f"{value / 1e9:,.1f} GB/s"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)


@hardware_app.command("show")
def hardware_show(name: str, as_json: bool = typer.Option(False, "--json", help="print the profile as JSON"),
                  wide: bool = typer.Option(False, "--wide", help=WIDE_HELP)):
    """Show one GPU or link profile as a table, each number with its source (--json: the profile)."""
    profile = get_hardware(name)
    if as_json:
        typer.echo(profile.model_dump_json(indent=2))
        return
    data = profile.model_dump(mode="json")
    sources = data.pop("sources", {})
    rows = [[field, _shown(field, value), sources.get(field, "")] for field, value in data.items()
            if value not in (None, "", [], ())]
    headers = ["field", "value", "source"]
    typer.echo(tabulate(rows, headers=headers) if wide else table(rows, headers, output_width(), wrap_columns=(1, 2)))


def _validate_one(path: Path) -> str:
    data = read_json(path)
    if "model_type" in data:
        from shardplan.inputs.hf_config import spec_from_hf_config_file
        spec = spec_from_hf_config_file(path)
        return f"{path}: ok (Hugging Face config, {spec.total_params:,} params)"
    from shardplan.inputs import profile_index
    if set(data) & set(profile_index.KINDS):  # the catalogues' index (inputs/profile_index.py)
        count = sum(len(e) for e in profile_index.parse_index(data, path).values())
        stale = ", ".join(profile_index.stale_kinds(data))
        stale = f"; {stale} not of the files on disk: python -m shardplan.inputs.profile_index" if stale else ""
        return f"{path}: ok (profile index, {count} profiles{stale})"
    if "defaults" in data and "display_name" in data:  # a training stack profile
        from shardplan.inputs.stacks import StackProfile, _check
        profile = _check(load_profile(path, StackProfile), Path(path))
        return f"{path}: ok (StackProfile {profile.name})"
    if "bytes_per_element" in data and "strategies" in data:  # an engine declaration (inputs/engines.py)
        from shardplan.inputs.engines import EngineProfile
        return f"{path}: ok (EngineProfile {load_profile(path, EngineProfile).name})"
    if "fragmentation_per_transient" in data:  # the caching-allocator model (allocator.py)
        from shardplan.inputs.allocator_profile import AllocatorModel
        load_profile(path, AllocatorModel)
        return f"{path}: ok (AllocatorModel)"
    if "window_factor" in data:  # the calibrated window factor (inputs/time_calibration.py)
        from shardplan.inputs.time_calibration import load
        return f"{path}: ok (window factor {load(path).value:.4f}, calibrated)"
    if data.get("schema") == "shardplan.accuracy/1":
        bands = load_bands(path)
        return f"{path}: ok (accuracy bands, {len(type(bands.classes).model_fields)} term classes)"
    schema = GPUProfile if "vendor" in data else LinkProfile if "scope" in data else ModelSpec
    profile = load_profile(path, schema)
    return f"{path}: ok ({schema.__name__} {profile.name})"


def _json_files(folder: Path) -> list[Path]:
    """The *.json files under ``folder``, walking at most ``MAX_VALIDATE_ENTRIES`` entries: a profile
    folder holds tens of files, and `profiles validate /` must not walk the whole file system."""
    import os

    from shardplan.support.limits import MAX_VALIDATE_ENTRIES

    found, seen = [], 0
    for root, dirs, files in os.walk(folder):  # symlinked folders are not followed (no loops)
        seen += len(dirs) + len(files)
        if seen > MAX_VALIDATE_ENTRIES:
            raise ShardplanError("path", str(folder), f"holds more than {MAX_VALIDATE_ENTRIES:,} entries; give the "
                                                      "folder that holds the profiles")
        found += [Path(root) / f for f in files if f.endswith(".json")]
    return sorted(found)


@profiles_app.command("validate")
def profiles_validate(path: Path):
    """Validate a profile file (model, GPU, link, or HF config.json) or every JSON file in a folder."""
    paths = _json_files(path) if path_kind(path) == "dir" else [path]
    if not paths:
        raise ShardplanError("path", str(path), "no JSON files found")
    for p in paths:
        typer.echo(_validate_one(p))
