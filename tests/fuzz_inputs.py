"""Hostile inputs for the fuzz tests (tests/test_fuzz_cli.py, tests/test_fuzz_api.py), and the guard
that runs one case in-process and says how it ended.

A case is what a hostile user can hand shardplan: command-line words, files (JSON of the wrong
shape, deeply nested, binary, non-UTF-8, truncated, with 5,000-digit numbers or NaN/Infinity
literals; directories, FIFOs, missing paths, over-long names, symlinks), standard input and the
environment (SHARDPLAN_PROFILE_PATH, COLUMNS), mixing valid values with the classes of issue 12:
numbers (2**70, 1e309, inf, nan, 5,000 digits, 0, -1), contradictions and odd names.

``run_cli_case`` runs one through ``shardplan.cli.app.main`` the way the ``shardplan`` script does and
classifies the ending (``Outcome.verdict``): "ok" / "error" (exit 2 with one stderr line) /
"check" (exit 1 of ``fit --check``) are what the promise allows; everything else
("traceback:TYPE", "hang", "memory", "multi-line-stderr", "warning:TYPE", "exit:N",
"wrote-outside", and issue 22's "unsafe-write" (a symlink's target, a read-only file or a file's
mode changed), "temp-left" (a temporary file left in an output folder) and "not-announced" (a
shadowing profile or a forced foreign overlay used without its line)) is a bug. Files are only ever written under the case's own temporary folder:
outputs always point there, and the system paths used as inputs (/dev/zero ...) are only read.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import signal
import stat
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hypothesis import HealthCheck, settings
from hypothesis import strategies as hs

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "shardplan" / "data"

CASE_SECONDS = float(os.environ.get("SHARDPLAN_FUZZ_CASE_SECONDS", "10"))  # a case running longer is a hang
CASE_MEMORY_BYTES = 3 * 2**30  # address space a case may add before it counts as exhausting memory

settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None, print_blob=True,
    max_examples=int(os.environ.get("SHARDPLAN_FUZZ_EXAMPLES", "500")),
    suppress_health_check=list(HealthCheck),
)
FUZZ_SETTINGS = settings.get_profile("ci")


# --- values ----------------------------------------------------------------------------------------

class Raw(str):
    """JSON text put into a file verbatim (numbers json.dumps cannot or will not write)."""


HOSTILE_INT_TEXT = ["0", "-1", "-0", str(2**31), str(2**63), str(2**64 + 1), str(2**70), "9" * 30, "1" * 5000,
                    "1e309", "1e18", "inf", "-inf", "nan", "NaN", "1.5", "0x10", "1_000", " 8", "", "٣", "+5"]
VALID_INT_TEXT = ["1", "2", "4", "8", "16", "64", "1024", "2048"]
HOSTILE_JSON = [Raw("1" * 5000), Raw("-" + "9" * 400), Raw("1e309"), Raw("-1e309"), Raw("NaN"), Raw("Infinity"),
                Raw("-Infinity"), Raw("1e-400"), 2**70, -(2**63), 2**63, -1, 0, 0.5, -0.0, True, False, None, "",
                "x" * 300, "false", "true", "1e309", "nan", [], {}, [1, 2], {"a": {"b": None}}, "\u0000", "\udcff",
                "é" * 10, 10**12, 1e308]
HOSTILE_NAMES = ["", " ", "-", "--", "x" * 300, "é" * 200, "../../../etc/passwd", "/", ".", "\t", "a\nb",
                 "llama-3.1-8b" * 30, "ℌ100", "h100\u0000", "70B" * 100, "1e309B", "infB", "nanB", "-70B", "0B",
                 "99999999999999999999999B", ("9" * 5000) + "B", "😀", "\udcff"]
MODEL_NAMES = ["llama-3.1-8b", "llama-2-7b", "gpt2", "opt-125m", "mixtral-8x7b", "deepseek-v2-lite", "70B", "7b",
               "1.3B", "meta-llama/Llama-3.1-8B", "llama 3 8b", "125M", "qwen2.5-7b"]
GPU_NAMES = ["h100-sxm", "h100", "a100-80gb", "rtx4090", "4090", "mi300x", "t4", "24GB", "80GB", "b200", "l4"]
LINK_NAMES = ["nvlink4", "pcie4", "ib-ndr", "eth-100g", "nvlink-c2c", "bogus-link", "ib-ndr" * 50]
WORDS = ["qlora", "lora", "zero3", "zero2", "ddp", "fsdp1", "deepspeed", "bf16", "fp32", "fp16", "adamw-8bit", "sgd",
         "gc", "ac", "offload", "nf4", "gptq", "torchtune", "torchtitan", "oib", "chunked-ce", "paged", "eager",
         "strategy", "hsdp", "hybrid_shard", "targets", "qv", "all-linear", "reduce", "stack", "load", "meta_init",
         "quant", "seq", "batch", "accum", "rank", "ce-chunks", "group", "offload-activations",
         "checkpoint-wrapper", "selective", "every-k", "bogus", "on", "x", "GB"]
NUMBER_WORDS = ["seq", "batch", "accum", "rank", "ce-chunks", "group"]
FORMATS = ["fsdp2", "fsdp1", "accelerate", "deepspeed", "trainer", "torchrun"]
CHOICES = {
    "strategy": ["ddp", "no_shard", "zero1", "zero2", "zero3", "shard_grad_op", "full_shard", "hybrid_shard",
                 "hybrid_shard_zero2", "hsdp"],
    "engine": ["fsdp2", "fsdp1", "deepspeed"],
    "method": ["full", "lora", "qlora"],
    "precision": ["bf16-mixed", "fp16-mixed", "bf16-pure", "fp32", "bf16", "fp8"],
    "optimizer": ["adamw", "sgd", "adafactor", "adamw-8bit", "lion", "paged-adamw"],
    "ac": ["none", "full", "selective", "every-k"],
    "offload": ["none", "optimizer", "optimizer+params", "all"],
    "attention": ["sdpa", "eager", "flash"],
    "stack": ["hf", "torchtitan", "torchtune", "lightning", "plain"],
    "quant-format": ["nf4", "gptq", "awq"],
    "load-mode": ["full_per_gpu", "rank0_broadcast", "meta_init"],
    "lora-targets": ["qv", "attention", "all-linear", "all-linear+embeddings", "bogus"],
    "reduce-dtype": ["fp32", "bf16", "fp16", "param"],
}


def text_values(valid: list[str], hostile: list[str] = HOSTILE_NAMES) -> hs.SearchStrategy[str]:
    """Mostly valid values (so a case gets past its first check and reaches deeper code), often
    hostile ones, sometimes anything at all."""
    return hs.one_of(hs.sampled_from(valid), hs.sampled_from(valid), hs.sampled_from(valid),
                     hs.sampled_from(hostile), hs.text(max_size=12).filter(lambda t: "\x00" not in t))


def int_texts() -> hs.SearchStrategy[str]:
    return hs.one_of(hs.sampled_from(VALID_INT_TEXT), hs.sampled_from(VALID_INT_TEXT), hs.sampled_from(VALID_INT_TEXT),
                     hs.sampled_from(HOSTILE_INT_TEXT), hs.integers(-(2**80), 2**80).map(str))


def gpu_phrases() -> hs.SearchStrategy[str]:
    count = hs.one_of(hs.sampled_from(["1", "2", "4", "8", "16", "64"]), hs.sampled_from(HOSTILE_INT_TEXT[:14]))
    gpu = text_values(GPU_NAMES)
    return hs.one_of(
        hs.builds(lambda c, g: f"{c}x{g}", count, gpu),
        hs.builds(lambda n, c, g: f"{n}x{c}x{g}", count, count, gpu),
        hs.builds(lambda c, g: f"{c} {g}", count, gpu),
        hs.sampled_from(["99999999999999999999x24GB", "8xh100-sxm", "4x24GB", "2x8xa100-80gb", "0xh100",
                         "1x1e309GB", "8xnanGB", "8x-24GB", "8x0GB", "1000001xh100", "3x8xh100", "x", "8x"]),
    )


# --- files -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FileArg:
    """A path the case hands shardplan; ``materialize`` makes it inside the case's folder."""

    kind: str                  # file, dir, fifo, missing, symlink, dangling, loop, longname, system
    payload: bytes = b""
    name: str = "input.json"
    inner: tuple["FileArg", ...] = ()   # files in a dir, or the symlink's target

    def __repr__(self) -> str:  # a short reproducer in hypothesis' report
        body = self.payload[:80] + (b"..." if len(self.payload) > 80 else b"")
        return f"FileArg({self.kind!r}, {body!r}, name={self.name!r}, inner={self.inner!r})"


@dataclass(frozen=True)
class OutPath:
    """An output path inside the case's folder (never a system path)."""

    name: str
    kind: str = "new"          # new, existing, dir, symlink-to-existing, missing-parent, longname, and
    #                            issue 22's symlink-to-secret, read-only, mode-0600


def _seed(path: Path) -> bytes:
    return path.read_bytes()


def _hf_configs() -> dict[str, dict]:
    models = json.loads((REPO / "tests" / "data" / "hf_configs.json").read_text())["models"]
    out = {}
    for name, entry in models.items():
        kind = entry["config_class"].replace("Config", "").lower()
        out[name] = {"model_type": {"gpt2": "gpt2", "opt": "opt", "falcon": "falcon", "mixtral": "mixtral"}.get(kind, kind),
                     **entry["kwargs"]}
    return out


SEEDS: dict[str, Any] = {}


def seeds() -> dict[str, Any]:
    """Valid inputs of every kind shardplan reads (parsed JSON, or text for tables and JSONL)."""
    if SEEDS:
        return SEEDS
    SEEDS["model"] = json.loads((DATA / "model_profiles" / "llama-3.1-8b.json").read_text())
    SEEDS["moe_model"] = json.loads((DATA / "model_profiles" / "mixtral-8x7b.json").read_text())
    SEEDS["gpu"] = json.loads((DATA / "hardware_profiles" / "gpus" / "h100-sxm.json").read_text())
    SEEDS["link"] = json.loads((DATA / "hardware_profiles" / "links" / "nvlink4.json").read_text())
    SEEDS["stack"] = json.loads((DATA / "stack_profiles" / "hf.json").read_text())
    SEEDS["allocator"] = json.loads((DATA / "allocator.json").read_text())
    SEEDS["bands"] = json.loads((DATA / "accuracy_bands.json").read_text())
    hf = _hf_configs()
    SEEDS["hf"] = hf["Llama-3.1-8B"]
    SEEDS["hf_moe"] = hf["Mixtral-8x7B-v0.1"]
    SEEDS["hf_gpt2"] = hf["GPT-2-124M"]
    SEEDS["overlay"] = {
        "schema": "shardplan.calibration/1", "created": "2026-01-01T00:00:00+00:00", "source": {},
        "links": [{"tier": "intra_node", "op": "all_gather", "world_size": 8, "r2_log": 0.99, "max_rel_err": 0.1,
                   "n_points": 10, "calibrated": True,
                   "segments": [{"min_bytes": 0, "max_bytes": 2**30, "alpha_s": 1e-5, "bandwidth_bytes_per_s": 3e11}]}],
        "compute": [{"dtype": "bfloat16", "device": "NVIDIA H100 80GB HBM3", "f_max_flops_per_s": 7e14, "m_half": 1000.0,
                     "p": 1.0, "max_rel_err": 0.05, "n_points": 8, "calibrated": True}],
        "bandwidth": [], "allocator": None, "accuracy": None}
    SEEDS["samples"] = [{"op": "all_gather", "world_size": 2, "size_bytes": 1024 * 2**k, "time_s": 1e-5 + 1e-9 * 2**k,
                         "tier": "intra_node", "dtype": "float32", "in_place": False} for k in range(12)]
    lines = (REPO / "data" / "calibration" / "grid_cpu.jsonl").read_text().splitlines()
    SEEDS["jsonl"] = "\n".join(lines[:2]) + "\n"
    SEEDS["nccl"] = (REPO / "tests" / "data" / "nccl_tests_sample_all_gather_perf.txt").read_text()
    SEEDS["plan"] = _plan_json()
    return SEEDS


def _plan_json() -> dict:
    from shardplan.cli.app import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["fit", "llama-3.1-8b on 8xh100-sxm", "--strategy", "full_shard", "--json"]) == 0
    return json.loads(out.getvalue())


def dumps(obj: Any) -> bytes:
    """JSON text with ``Raw`` values written verbatim (5,000-digit numbers, NaN, 1e309)."""
    raws: list[str] = []

    def mark(o):
        if isinstance(o, Raw):
            raws.append(str(o))
            return f"\u0001RAW{len(raws) - 1}\u0001"
        if isinstance(o, dict):
            return {str(k): mark(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [mark(v) for v in o]
        if isinstance(o, int) and not isinstance(o, bool) and abs(o) > 10**300:
            raws.append(str(o))
            return f"\u0001RAW{len(raws) - 1}\u0001"
        return o

    text = json.dumps(mark(obj), allow_nan=True, ensure_ascii=False)
    for i, raw in enumerate(raws):
        text = text.replace(json.dumps(f"\u0001RAW{i}\u0001"), raw)
    return text.encode("utf-8", errors="surrogatepass")


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path to a value in a parsed JSON document (the root included)."""
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:4]):
            out += _paths(v, prefix + (i,))
    return out


def _replaced(obj: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(obj, dict):
        return {**obj, head: _replaced(obj[head], rest, value)}
    copy = list(obj)
    copy[head] = _replaced(copy[head], rest, value)
    return copy


@hs.composite
def mutated_json(draw, seed: Any) -> bytes:
    """A valid document with one value replaced, one key dropped or added, or left as is."""
    how = draw(hs.sampled_from(["as-is", "replace", "replace", "replace", "drop", "add", "wrap"]))
    doc = seed
    if how == "replace":
        path = draw(hs.sampled_from(_paths(seed)))
        doc = _replaced(seed, path, draw(hs.sampled_from(HOSTILE_JSON)))
    elif how == "drop" and isinstance(seed, dict) and seed:
        key = draw(hs.sampled_from(sorted(seed)))
        doc = {k: v for k, v in seed.items() if k != key}
    elif how == "add" and isinstance(seed, dict):
        doc = {**seed, draw(hs.sampled_from(["bogus", "", "x" * 300])): draw(hs.sampled_from(HOSTILE_JSON))}
    elif how == "wrap":
        doc = draw(hs.sampled_from([[seed], [seed, seed], {"plans": [seed]}, {"plans": seed}, [], {}]))
    return dumps(doc)


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@hs.composite
def payloads(draw, seed_name: str) -> bytes:
    """Bytes of a file meant to hold ``seed_name``: valid, mutated, or broken in one of many ways."""
    seed = seeds()[seed_name]
    valid = seed.encode() if isinstance(seed, str) else dumps(seed)
    how = draw(hs.sampled_from(["valid"] * 4 + ["mutated", "mutated", "mutated", "truncated", "binary", "non-utf8",
                                "utf16", "bom", "deep", "deep-object", "shape", "empty", "nan-literals", "huge-number",
                                "bigfile", "duplicate-key"]))
    if how == "valid":
        return valid
    if how == "mutated":
        if isinstance(seed, str):  # tables and JSONL: replace a token with a hostile one
            tokens = seed.split(" ")
            i = draw(hs.integers(0, len(tokens) - 1))
            tokens[i] = draw(hs.sampled_from(HOSTILE_INT_TEXT + ["NaN", "{", "]", "\x00"]))
            return " ".join(tokens).encode("utf-8", errors="surrogatepass")
        return draw(mutated_json(seed))
    if how == "truncated":
        return valid[: draw(hs.integers(0, max(0, len(valid) - 1)))]
    if how == "binary":
        return draw(hs.binary(min_size=1, max_size=200))
    if how == "non-utf8":
        cut = draw(hs.integers(0, len(valid)))
        return valid[:cut] + b"\xff\xfe\xc3\x28" + valid[cut:]
    if how == "utf16":
        return valid.decode("utf-8", errors="replace").encode("utf-16")
    if how == "bom":
        return b"\xef\xbb\xbf" + valid
    if how == "deep":
        return _deep(draw(hs.sampled_from([100, 1000, 100_000])))
    if how == "deep-object":
        depth = draw(hs.sampled_from([1000, 50_000]))
        return b'{"a":' * depth + b"1" + b"}" * depth
    if how == "shape":
        return dumps(draw(hs.sampled_from([[], [1], "text", 7, None, True, [[seed]], {"": seed}])))
    if how == "empty":
        return draw(hs.sampled_from([b"", b" ", b"\n\n", b"\x00"]))
    if how == "nan-literals":
        return b'{"name": NaN, "hidden_size": Infinity, "num_layers": -Infinity}'
    if how == "duplicate-key":  # issue 22: a key said twice is refused, never read as its last value
        return duplicate_key(seed) if isinstance(seed, dict) and seed else valid
    if how == "huge-number":
        return b'{"hidden_size": ' + b"9" * draw(hs.sampled_from([400, 5000, 100_000])) + b"}"
    return b" " * (8 << 20) + valid  # 8 MiB of whitespace before the document


def duplicate_key(doc: dict) -> bytes:
    """``doc`` as JSON with its first key said again at the end (with the same value: only the
    repetition is wrong)."""
    key = next(iter(doc))
    return dumps(doc)[:-1] + b", " + dumps({key: doc[key]})[1:]


@hs.composite
def file_args(draw, seed_name: str, name: str = "input.json") -> FileArg:
    """A path given where a file of kind ``seed_name`` goes."""
    kind = draw(hs.sampled_from(["file"] * 8 + ["dir", "fifo", "missing", "symlink", "dangling", "loop", "longname",
                                                "system", "dir-of-files"]))
    if kind in ("file", "longname"):
        return FileArg(kind, draw(payloads(seed_name)), name)
    if kind == "symlink":
        return FileArg(kind, b"", name, (FileArg("file", draw(payloads(seed_name)), "target.json"),))
    if kind == "dir-of-files":
        inner = tuple(FileArg("file", draw(payloads(seed_name)), f"f{i}.json") for i in range(draw(hs.integers(1, 3))))
        return FileArg("dir", b"", name, inner)
    if kind == "system":
        return FileArg(kind, b"", draw(hs.sampled_from(["/dev/null", "/dev/zero", "/proc/self/status", "/"])))
    return FileArg(kind, b"", name)


def materialize_file(arg: FileArg, folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    if arg.kind == "system":
        return arg.name
    if arg.kind == "longname":
        path = folder / (("n" * 300) + ".json")
        return str(path)  # creating it fails (ENAMETOOLONG): shardplan must say so in one line
    path = folder / arg.name
    if arg.kind == "file":
        path.write_bytes(arg.payload)
    elif arg.kind == "dir":
        path.mkdir()
        for inner in arg.inner:
            materialize_file(inner, path)
    elif arg.kind == "fifo":
        os.mkfifo(path)
    elif arg.kind == "symlink":
        target = materialize_file(arg.inner[0], folder / "targets")
        path.symlink_to(target)
    elif arg.kind == "dangling":
        path.symlink_to(folder / "nowhere" / "x.json")
    elif arg.kind == "loop":
        path.symlink_to(path)
    return str(path)


def materialize_out(out: OutPath, folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / out.name
    if out.kind == "existing":
        path.write_text("old content\n")
    elif out.kind == "dir":
        path.mkdir()
    elif out.kind == "symlink-to-existing":
        (folder / "real_target").write_text("old content\n")
        path.symlink_to(folder / "real_target")
    elif out.kind == "symlink-to-secret":  # a link to a private file: must never be written through
        (folder / "secret").write_text(SECRET)
        os.chmod(folder / "secret", 0o600)
        path.symlink_to(folder / "secret")
    elif out.kind in ("read-only", "mode-0600"):
        path.write_text("old content\n")
        os.chmod(path, 0o444 if out.kind == "read-only" else 0o600)
    elif out.kind == "missing-parent":
        path = folder / "no" / "such" / "dir" / out.name
    elif out.kind == "longname":
        path = folder / (("o" * 300) + Path(out.name).suffix)
    return str(path)


SECRET = "private\n"


def out_paths(suffixes: list[str]) -> hs.SearchStrategy[OutPath]:
    return hs.builds(OutPath, hs.sampled_from([f"out{s}" for s in suffixes]),
                     hs.sampled_from(["new"] * 6 + ["existing", "dir", "symlink-to-existing", "missing-parent",
                                                    "longname", "symlink-to-secret", "read-only", "mode-0600"]))


def output_violation(kind: str, path: Path, forced: bool) -> str | None:
    """What a case did to an output of issue 22's kinds that the policy forbids (docs/input-files.md,
    "Files shardplan writes"), or None."""
    folder = path.parent
    if any(p.name.endswith(".tmp") and ".shardplan-" in p.name for p in folder.iterdir()):
        return "temp-left"
    if kind in ("symlink-to-secret", "symlink-to-existing"):
        target = folder / ("secret" if kind == "symlink-to-secret" else "real_target")
        expected = (SECRET if kind == "symlink-to-secret" else "old content\n").encode()
        if not path.is_symlink() or target.read_bytes() != expected or \
                (kind == "symlink-to-secret" and stat.S_IMODE(target.stat().st_mode) != 0o600):
            return "unsafe-write"
    if kind in ("read-only", "mode-0600") and path.is_file() and not path.is_symlink():
        perm = 0o444 if kind == "read-only" else 0o600
        if stat.S_IMODE(path.stat().st_mode) != perm:
            return "unsafe-write"
        if kind == "read-only" and not forced and path.read_bytes() != b"old content\n":
            return "unsafe-write"
    return None


# --- CLI cases -------------------------------------------------------------------------------------

@dataclass
class Case:
    argv: list[Any]                       # str, FileArg or OutPath
    env: dict[str, Any] = field(default_factory=dict)   # values str or FileArg (a folder)
    stdin: bytes = b""
    expect_error: bool = False            # a contradiction: exit 0 is a finding too
    expect_stderr: str = ""               # text stderr must hold when the case exits 0 (issue 22 announcements)

    def files(self) -> list[str]:
        """What each file argument is (the argv shows only its path)."""
        return [repr(a) for a in self.argv if isinstance(a, FileArg)] + \
            [f"{k}={v!r}" for k, v in self.env.items() if isinstance(v, FileArg)]

    @property
    def subcommand(self) -> str:
        words = [a for a in self.argv if isinstance(a, str)]
        if words and words[0] in ("models", "hardware", "profiles", "calibrate") and len(words) > 1 \
                and not words[1].startswith("-"):
            return f"{words[0]} {words[1]}"
        return words[0] if words else ""


def _opt(name: str, values: hs.SearchStrategy) -> hs.SearchStrategy[list]:
    return values.map(lambda v: [name, v])


def _flag(name: str) -> hs.SearchStrategy[list]:
    return hs.just([name])


def _choice(knob: str) -> hs.SearchStrategy[str]:
    return text_values(CHOICES[knob])


def _options(draw, pool: list[hs.SearchStrategy[list]], at_most: int = 6) -> list:
    chosen = draw(hs.lists(hs.sampled_from(range(len(pool))), max_size=at_most, unique=True))
    argv: list = []
    for i in chosen:
        argv += draw(pool[i])
    return argv


def _training_options(with_calibration: bool = True) -> list[hs.SearchStrategy[list]]:
    ints = int_texts()
    pool = [_opt(f"--{k}", _choice(k)) for k in CHOICES]
    pool += [_opt(f"--{k}", ints) for k in ("lora-rank", "seq-len", "micro-batch", "shard-group-size", "ce-chunks")]
    pool += [_flag(f) for f in ("--optimizer-in-backward", "--no-activation-offload", "--activation-offload",
                                "--paged-optimizer", "--checkpoint-wrapper", "--expandable-segments",
                                "--no-fp32-master", "--fp32-master", "--json", "--wide")]
    pool += [_opt("--host-ram", hs.one_of(hs.sampled_from(["512GB", "1TB", "0GB", "-1GB", "1e309GB", "nanGB",
                                                            "99999999999999999999999TB", "abc"]), int_texts())),
             _opt("--intra-link", text_values(LINK_NAMES)), _opt("--inter-link", text_values(LINK_NAMES)),
             _opt("--global-batch-tokens", hs.one_of(hs.sampled_from(["1M", "4M", "15T", "1e309", "0", "-1M", "nan",
                                                                      "2048", "1P", "1e18"]), int_texts()))]
    if with_calibration:
        pool += [_opt("--calibration", file_args("overlay")), _flag("--force")]
    return pool


@hs.composite
def model_args(draw) -> Any:
    """A model as a user types it: a name, a size, a hostile word, or an HF config file/folder."""
    kind = draw(hs.sampled_from(["name"] * 6 + ["hf-file", "hf-dir", "profile-file"]))
    if kind == "name":
        return draw(text_values(MODEL_NAMES))
    if kind == "hf-file":
        return draw(file_args(draw(hs.sampled_from(["hf", "hf_moe", "hf_gpt2"])), "config.json"))
    if kind == "hf-dir":
        return FileArg("dir", b"", "model_dir", (draw(file_args("hf", "config.json")),))
    return draw(file_args("model", "my-model.json"))


@hs.composite
def queries(draw) -> Any:
    model = draw(model_args())
    if isinstance(model, FileArg):  # the query is text: a file model goes through --model
        return model
    words = []
    for _ in range(draw(hs.integers(0, 4))):
        word = draw(hs.sampled_from(WORDS))
        words.append(word)
        if word in NUMBER_WORDS and draw(hs.booleans()):
            words.append(draw(int_texts()))
    return " ".join([model, "on", draw(gpu_phrases()), *words])


# Valid values that contradict each other (issue 12): each must be refused with exit 2, not answered.
# Refused (exit 2). Settings the frameworks run as stated are notes, not contradictions, and are
# tested in tests/test_contradictions.py: qlora + fp32 (bitsandbytes' default compute dtype is
# float32), a LoRA rank above the hidden size (PEFT builds it), hybrid_shard on one node (torch runs
# it as full_shard).
CONTRADICTIONS = [
    ["--strategy", "ddp", "--offload", "optimizer"],
    ["--engine", "deepspeed", "--strategy", "zero2", "--offload", "optimizer+params"],
    ["--strategy", "zero2", "--offload", "optimizer+params"],   # plan: the engine searched, none can
    ["--method", "lora", "--lora-targets", "bogus"],
    ["--method", "full", "--lora-rank", "8"],
    ["--ac", "full", "--ac-every-k", "2"],
    ["--export", "bogus"],
]


@hs.composite
def contradiction_cases(draw) -> Case:
    """A valid query with one contradictory pair of options: the answer must be exit 2."""
    command = draw(hs.sampled_from(["fit", "plan"]))
    pair = draw(hs.sampled_from(CONTRADICTIONS if command == "fit" else CONTRADICTIONS[:-1]))
    query = draw(hs.sampled_from(["llama-3.1-8b on 8xh100-sxm", "llama-2-7b on 1x24GB", "gpt2 on 4xa100-80gb"]))
    return Case([command, query, *pair], expect_error=True)


@hs.composite
def fit_cases(draw) -> Case:
    query = draw(queries())
    argv: list = ["fit"]
    if isinstance(query, FileArg):
        argv += ["--model", query, "--gpus", draw(gpu_phrases())]
    elif draw(hs.integers(0, 5)) == 0:
        argv += ["--model", draw(text_values(MODEL_NAMES)), "--gpus", draw(gpu_phrases())]
    else:
        argv.append(query)
    pool = _training_options() + [_opt("--ac-every-k", int_texts()), _opt("--grad-accum", int_texts()),
                                  _flag("--check"),
                                  _opt("--export", hs.one_of(hs.sampled_from(FORMATS + ["bogus", "", "=x"]),
                                                             hs.builds(lambda f, o: [f, o], hs.sampled_from(FORMATS),
                                                                       out_paths([".py", ".json", ".yaml", ""]))))]
    argv += _options(draw, pool)
    return Case(argv)  # an --export [FORMAT, OutPath] pair is joined as FORMAT=PATH by materialize()


@hs.composite
def plan_cases(draw) -> Case:
    query = draw(queries())
    argv: list = ["plan"]
    if isinstance(query, FileArg):
        argv += [query, "--gpus", draw(gpu_phrases())]
    else:
        argv.append(query)
    pool = _training_options() + [
        _opt("--global-batch", int_texts()), _opt("--top", int_texts()),
        _opt("--train-tokens", hs.sampled_from(["15T", "1e309", "0", "-5", "nan", "1" * 5000, "2T"])),
        _opt("--price-per-gpu-hour", hs.sampled_from(["2.5", "0", "-1", "nan", "inf", "1e309", "abc"])),
        _opt("--gpus", gpu_phrases())]
    argv += _options(draw, pool, at_most=4)
    return Case(argv)


def _list_text(values: hs.SearchStrategy[str]) -> hs.SearchStrategy[str]:
    return hs.lists(values, min_size=1, max_size=3).map(",".join)


@hs.composite
def sweep_cases(draw) -> Case:
    argv: list = ["sweep", "-o", draw(out_paths([".csv", ".csv", ".parquet", ".txt", ""]))]
    ranges = hs.one_of(int_texts(), hs.sampled_from(["1-8", "1-4", "8-1", "1-100000000", "0-3", "-1", "1-",
                                                     "-", "1-2-3", "1,,2", ",", "1-" + "9" * 30]))
    pool = [_opt("--models", _list_text(text_values(MODEL_NAMES))), _opt("--gpus", _list_text(text_values(GPU_NAMES))),
            _opt("--gpu-counts", ranges), _opt("--nodes", ranges),
            _opt("--strategies", _list_text(_choice("strategy"))), _opt("--engines", _list_text(_choice("engine"))),
            _opt("--method", _list_text(_choice("method"))), _opt("--lora-rank", ranges),
            _opt("--precision", _list_text(_choice("precision"))), _opt("--optimizer", _list_text(_choice("optimizer"))),
            _opt("--ac", _list_text(_choice("ac"))), _opt("--offload", _list_text(_choice("offload"))),
            _opt("--micro-batch", ranges), _opt("--seq-len", ranges), _opt("--grad-accum", ranges),
            _opt("--stack", _list_text(_choice("stack"))),
            _opt("--columns", hs.sampled_from(["all", "summary", "model,strategy", "bogus", "", ","])),
            _flag("--valid-only"), _flag("--no-progress"), _flag("--force")]
    argv += _options(draw, pool)
    return Case(argv)


@hs.composite
def export_cases(draw) -> Case:
    plan = draw(hs.one_of(file_args("plan", "plan.json"), hs.just("-")))
    stdin = draw(payloads("plan")) if plan == "-" else b""
    argv: list = ["export", plan, "--to", draw(text_values(FORMATS))]
    pool = [_opt("-o", out_paths([".py", ".json", ".yaml", ".sh", ""])), _opt("--index", int_texts()),
            _opt("--block-class", text_values(["LlamaDecoderLayer", "MixtralDecoderLayer"])), _flag("--force")]
    argv += _options(draw, pool)
    return Case(argv, stdin=stdin)


@hs.composite
def listing_cases(draw) -> Case:
    kind = draw(hs.sampled_from(["models", "models show", "hardware", "hardware show", "profiles validate"]))
    if kind == "models":
        argv = ["models", *draw(hs.sampled_from([[], ["--wide"]]))]
    elif kind == "models show":
        argv = ["models", "show", draw(model_args()), *draw(hs.sampled_from([[], ["--json"], ["--wide"]]))]
    elif kind == "hardware":
        argv = ["hardware", *draw(hs.sampled_from([[], ["--wide"]]))]
    elif kind == "hardware show":
        argv = ["hardware", "show", draw(text_values(GPU_NAMES + LINK_NAMES))]
    else:
        seed = draw(hs.sampled_from(["model", "moe_model", "gpu", "link", "stack", "allocator", "bands", "hf",
                                     "hf_moe"]))
        argv = ["profiles", "validate", draw(file_args(seed, f"{seed}.json"))]
    return Case(argv)


@hs.composite
def calibrate_cases(draw) -> Case:
    which = draw(hs.sampled_from(["fsdp", "collectives", "collectives", "compute", "compare", "compare"]))
    ints = int_texts()
    if which == "fsdp":
        argv = ["calibrate", "fsdp", "--out", draw(out_paths([".jsonl"]))]
        pool = [_opt("--grid", hs.sampled_from(["default", "", "bogus"])), _opt("--config", file_args("jsonl")),
                _opt("--model", text_values(MODEL_NAMES)), _opt("--world-size", ints), _opt("--world-size", ints),
                _opt("--engine", _choice("engine")), _opt("--strategy", _choice("strategy")),
                _opt("--param-dtype", text_values(["bfloat16", "float32", "float16"])),
                _opt("--reduce-dtype", text_values(["bfloat16", "float32"])), _opt("--ac", _choice("ac")),
                _opt("--optimizer", _choice("optimizer")), _opt("--micro-batch", ints), _opt("--seq-len", ints),
                _opt("--launch", text_values(["auto", "fake", "spawn", "torchrun"])),
                _opt("--device", text_values(["cpu", "cuda"])), _flag("--fake-tensors"), _flag("--full-size"),
                _opt("--timeout", hs.sampled_from(["1", "0", "-1", "nan", "inf", "1e309"])),
                _opt("--csv", out_paths([".csv"])), _opt("--json", out_paths([".json"])),
                _flag("--no-isolate"), _flag("--retry-failed"), _flag("--force")]
    elif which == "collectives":
        argv = ["calibrate", "collectives", "--out", draw(out_paths([".json"]))]
        pool = [_opt("--nccl-tests", file_args("nccl", "all_gather_perf.txt")),
                _opt("--nccl-tests", file_args("nccl", "all_reduce_perf.txt")),
                _opt("--samples", file_args("samples", "samples.json")),
                _opt("--op", text_values(["all_gather", "reduce_scatter", "all_reduce", "all-gather"])),
                _opt("--world-size", ints), _opt("--tier", text_values(["intra_node", "inter_node"])),
                _opt("--min-bytes", ints), _opt("--max-bytes", ints), _opt("--factor", ints), _opt("--iters", ints),
                _opt("--warmup", ints), _opt("--dtype", text_values(["float32", "bfloat16"])),
                _opt("--min-r2-log", hs.sampled_from(["0.9", "nan", "inf", "-1", "2", "1e309"])),
                _opt("--max-rel-err", hs.sampled_from(["0.5", "nan", "inf", "-1", "0"])),
                _opt("--samples-csv", out_paths([".csv"])), _opt("--fits-json", out_paths([".json"])), _flag("--force")]
    elif which == "compute":
        small = hs.one_of(hs.sampled_from(["8", "16", "32", "48", "64"]), hs.sampled_from(["1", "0", "-4"]), ints)
        argv = ["calibrate", "compute", "--out", draw(out_paths([".json"])), "--no-bandwidth",
                *[x for _ in range(3) for x in ("--size", draw(small))]]
        pool = [_opt("--dtype", text_values(["float32", "bfloat16", "float16", "tf32", "float8_e4m3fn"])),
                _opt("--size", small),
                _opt("--iters", hs.sampled_from(["1", "2", "0", "-1"])), _opt("--warmup", hs.sampled_from(["0", "1", "-1"])),
                _opt("--min-saturation", hs.sampled_from(["0.9", "0", "nan", "inf", "-1", "2"])),
                _opt("--peak-tflops", hs.sampled_from(["100", "0", "nan", "inf", "-5", "1e309"])),
                _opt("--threads", hs.sampled_from(["1", "0", "-1", "2"])), _opt("--samples-csv", out_paths([".csv"])),
                _flag("--force")]
        if draw(hs.booleans()):
            argv.remove("--no-bandwidth")
            pool.append(_opt("--bandwidth-bytes", hs.sampled_from(["1024", "0", "-1", str(2**70), "4096"])))
    else:
        argv = ["calibrate", "compare", *draw(hs.lists(file_args("jsonl", "records.jsonl"), min_size=1, max_size=2))]
        pool = [_opt("--csv", out_paths([".csv"])), _opt("--json", out_paths([".json"])),
                _opt("--md", out_paths([".md"])), _flag("--force")]
    argv += _options(draw, pool, at_most=5)
    return Case(argv)


@hs.composite
def env_cases(draw) -> Case:
    """Any command with a hostile environment: a profile folder full of bad files, odd $COLUMNS."""
    base = draw(hs.one_of(fit_cases(), listing_cases()))
    env: dict[str, Any] = {}
    if draw(hs.booleans()):
        seed = draw(hs.sampled_from(["model", "gpu", "link", "stack"]))
        env["SHARDPLAN_PROFILE_PATH"] = draw(hs.one_of(
            hs.builds(lambda f: FileArg("dir", b"", "profiles", (f,)), file_args(seed, "user.json")),
            hs.sampled_from(["/nonexistent", "", ":", "/dev/null", "x" * 5000])))
    if draw(hs.booleans()):
        env["COLUMNS"] = draw(hs.sampled_from(["0", "-5", "1", "abc", "99999999999999999999", "1e309", "nan", ""]))
    return Case(base.argv, env=env, stdin=base.stdin)


# --- issue 22: foreign overlays, shadowing profiles, duplicate keys -----------------------------------

def _shadowing_gpu(alias: str) -> bytes:
    """A 1 GiB user GPU profile that takes the built-in alias ``alias``."""
    return dumps({**seeds()["gpu"], "name": "my-card", "aliases": [alias], "generic_aliases": [],
                  "memory_bytes": 2**30, "nominal_memory_gb": 1})


# A toy GPT-NeoX config.json: a model_type no family reader knows, built by transformers on the meta
# device where it is installed (calibrate/module_tree.py); auto_map names code that must never run.
NEOX = {"model_type": "gpt_neox", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 128, "vocab_size": 1000, "auto_map": {"AutoModelForCausalLM": "never_run.Model"}}
# values kept small where size is the point: 10,000 blocks take a minute to build even on the meta device
NEOX_HOSTILE = {"model_type": ["gpt_neox", "made_up_lm", "", "../../x", 5, None, "bert", "t5"],
                "hidden_size": [0, -1, 2**70, "x", 63, 2**20], "num_hidden_layers": [0, -2, 2**64, 1.5, "two"],
                "num_attention_heads": [0, 3, 2**40], "vocab_size": [0, 2**40, -5], "auto_map": [{"x": 1}, "os.system"],
                "intermediate_size": [0, None, "wide"]}


def warm_up() -> None:
    """Import what the module-tree reader imports on first use (torch, transformers, one model
    class), once per run: a one-time import is not a case's hang."""
    try:
        from shardplan.calibrate import install_module_tree_reader
        from shardplan.inputs.hf_config import spec_from_hf_config

        install_module_tree_reader()
        spec_from_hf_config({k: v for k, v in NEOX.items() if k != "auto_map"}, name="warm-up")
    except Exception:  # noqa: BLE001 - without torch/transformers the cases meet the one-line error instead
        pass


@hs.composite
def unknown_type_config(draw) -> bytes:
    config = dict(NEOX)
    for key in draw(hs.lists(hs.sampled_from(sorted(NEOX_HOSTILE)), max_size=2, unique=True)):
        config[key] = draw(hs.sampled_from(NEOX_HOSTILE[key]))
    return dumps(config)


def _invalid_user_gpu(change: dict) -> bytes:
    return dumps({**seeds()["gpu"], "name": "bad-card", "aliases": [], "generic_aliases": [], **change})


@hs.composite
def issue22_cases(draw) -> Case:
    """A calibration of one GPU on another (refused; with --force a warning line), a file with a
    duplicate key (refused), a user profile shadowing a built-in alias (its line on every answer), a
    user profile that fails its schema (skipped with a line naming it), a config.json of a model_type
    no family reader knows (its module tree, or one line; auto_map's module never imported)."""
    gpu = draw(hs.sampled_from(["h100-sxm", "rtx4090", "a100-80gb", "mi300x", "l4", "t4"]))
    kind = draw(hs.sampled_from(["overlay", "overlay", "duplicate", "shadow", "invalid-profile", "unknown-type"]))
    query = f"{draw(hs.sampled_from(['gpt2', 'llama-3.2-1b', 'llama-3.1-8b']))} on {draw(hs.sampled_from(['1', '8']))}x{gpu}"
    extra = draw(hs.sampled_from([[], ["--global-batch-tokens", "1M"], ["--json"]]))
    command = draw(hs.sampled_from(["fit", "plan"])) if kind == "overlay" else "fit"
    if kind == "overlay":
        force = draw(hs.booleans())
        argv = [command, query, "--calibration", FileArg("file", dumps(seeds()["overlay"]), "h100.json"), *extra,
                *(["--force"] if force else [])]
        foreign = gpu != "h100-sxm"
        return Case(argv, expect_error=foreign and not force,
                    expect_stderr="shardplan: warning: --calibration" if foreign and force else "")
    if kind == "duplicate":
        doc = draw(hs.sampled_from([seeds()["overlay"], seeds()["hf"]]))
        if doc is seeds()["hf"]:
            return Case(["fit", "--model", FileArg("file", duplicate_key(doc), "config.json"), "--gpus", f"8x{gpu}"],
                        expect_error=True)
        return Case(["fit", query, "--calibration", FileArg("file", duplicate_key(doc), "cal.json"), "--force"],
                    expect_error=True)
    if kind == "invalid-profile":
        change = draw(hs.sampled_from([{"memory_bytes": 2**70}, {"memory_bytes": "lots"}, {"memroy_gb": 80},
                                       {"peak_flops": {"bf16": -1}}, {"vendor": 5}]))
        profiles = FileArg("dir", b"", "profiles", (FileArg("file", _invalid_user_gpu(change), "bad.json"),))
        return Case(["fit", query, *extra], env={"SHARDPLAN_PROFILE_PATH": profiles},
                    expect_stderr="SHARDPLAN_PROFILE_PATH: skipped")
    if kind == "unknown-type":
        never_run = FileArg("file", b"open('NEVER_RAN_MARKER', 'w').write('ran')\n", "never_run.py")
        folder = FileArg("dir", b"", "model", (FileArg("file", draw(unknown_type_config()), "config.json"), never_run))
        return Case(["fit", "--model", folder, "--gpus", f"1x{gpu}", *extra])
    profiles = FileArg("dir", b"", "profiles", (FileArg("file", _shadowing_gpu(gpu), "mine.json"),))
    return Case(["fit", query, *extra], env={"SHARDPLAN_PROFILE_PATH": profiles},
                expect_stderr="shadows the built-in")


def cli_cases() -> hs.SearchStrategy[Case]:
    return hs.one_of(fit_cases(), plan_cases(), sweep_cases(), export_cases(), listing_cases(), calibrate_cases(),
                     env_cases(), contradiction_cases(), issue22_cases())


# --- running one case ------------------------------------------------------------------------------

# Python's default filters hide these from users (ResourceWarning: unclosed files, shown only
# under -W default or -X dev); every other warning class reaches the terminal.
NOT_SHOWN_BY_DEFAULT = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


class Hang(BaseException):
    """Raised by the alarm: the case ran past CASE_SECONDS (BaseException: no ``except Exception`` eats it)."""


class MeasurementReached(BaseException):
    """A calibrate command got past its argument validation to a real measurement, which the fuzz
    test does not run (it would spawn ranks or time large matmuls)."""


@contextlib.contextmanager
def guarded(seconds: float = CASE_SECONDS, memory_bytes: int = CASE_MEMORY_BYTES):
    """Alarm after ``seconds`` (raises Hang) and cap the address space (MemoryError past it)."""
    def on_alarm(signum, frame):
        raise Hang(f"still running after {seconds:g} s")

    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    try:
        with open("/proc/self/statm") as f:
            in_use = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (in_use + memory_bytes, hard))
    except (OSError, ValueError):
        pass
    # repeating: an alarm that lands in a gc callback is swallowed there ("unraisable"), the next one is not
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@contextlib.contextmanager
def fd_output():
    """Capture what C code writes to file descriptors 1 and 2 (LAPACK's '** On entry to DLASCL ...'
    reaches the user's terminal past Python's sys.stdout/sys.stderr); yields a list that holds
    the text after the block."""
    got: list[str] = []
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as sink:
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            yield got
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            sink.seek(0)
            got.append(sink.read(4096).decode("utf-8", errors="replace"))


def _cheap_matmul(real: Callable) -> Callable:
    def measure(dtypes=None, sizes=None, warmup=5, iters=50, **kw):
        if sizes and all(isinstance(m, int) and m <= 64 for m in sizes) and 0 <= warmup <= 5 and iters <= 50:
            return real(dtypes=dtypes, sizes=sizes, warmup=warmup, iters=iters, **kw)
        raise MeasurementReached("measure_matmul")
    return measure


def _cheap_bandwidth(real: Callable) -> Callable:
    def measure(kernels=("copy", "add"), sizes_bytes=None, dtype="bfloat16", warmup=5, iters=50, **kw):
        if sizes_bytes and all(isinstance(s, int) and s <= 1 << 16 for s in sizes_bytes) and 0 <= warmup <= 5 \
                and iters <= 50:
            return real(kernels=kernels, sizes_bytes=sizes_bytes, dtype=dtype, warmup=warmup, iters=iters, **kw)
        raise MeasurementReached("measure_bandwidth")
    return measure


def _never(name: str) -> Callable:
    def measure(*args, **kw):
        raise MeasurementReached(name)
    return measure


@contextlib.contextmanager
def no_real_measurements():
    """Calibrate runs only what is cheap and local: tiny matmuls; never ranks or FSDP runs."""
    from shardplan.calibrate import collectives, compute, launch

    saved = [(launch, "run_grid"), (collectives, "benchmark_spawn"), (compute, "measure_matmul"),
             (compute, "measure_bandwidth")]
    originals = [getattr(m, n) for m, n in saved]
    launch.run_grid = _never("run_grid")
    collectives.benchmark_spawn = _never("benchmark_spawn")
    compute.measure_matmul = _cheap_matmul(originals[2])
    compute.measure_bandwidth = _cheap_bandwidth(originals[3])
    try:
        import torch
        threads = torch.get_num_threads()
    except ImportError:  # pragma: no cover - the test extra has torch
        torch = None
    try:
        yield
    finally:
        for (m, n), original in zip(saved, originals):
            setattr(m, n, original)
        if torch is not None:
            torch.set_num_threads(threads)


@dataclass
class Outcome:
    argv: list[str]
    verdict: str          # ok, error, check, measurement, or a failure class
    exit_code: int | None
    stderr: str
    stdout_tail: str = ""
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.verdict not in ("ok", "error", "check", "measurement")


def materialize(case: Case, folder: Path, outs: list | None = None) -> tuple[list[str], dict[str, str]]:
    """The case's argv and environment as strings, its files made under ``folder``; ``outs`` gains
    (kind, path) of each output path."""
    argv: list[str] = []
    outs = [] if outs is None else outs
    for i, a in enumerate(case.argv):
        if isinstance(a, FileArg):
            argv.append(materialize_file(a, folder / f"in{i}"))
        elif isinstance(a, OutPath):
            argv.append(materialize_out(a, folder / f"out{i}"))
            outs.append((a.kind, Path(argv[-1])))
        elif isinstance(a, list):  # --export FORMAT=OutPath
            path = materialize_out(a[1], folder / f'out{i}')
            argv.append(f"{a[0]}={path}")
            outs.append((a[1].kind, Path(path)))
        else:
            argv.append(a)
    env = {k: materialize_file(v, folder / f"env{k}") if isinstance(v, FileArg) else v for k, v in case.env.items()}
    return argv, env


def _listing(paths: list[Path]) -> dict[str, frozenset]:
    out = {}
    for p in paths:
        try:
            out[str(p)] = frozenset(os.listdir(p))
        except OSError:
            out[str(p)] = frozenset()
    return out


# where a path resolved against the wrong folder would land (other processes share /tmp and $HOME)
WATCHED = [REPO, REPO / "tests", REPO / "shardplan", REPO / "shardplan" / "data", REPO / "data"]


def _innermost(exc: BaseException) -> str:
    """The deepest shardplan frame of a traceback: where the fix goes."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/shardplan/" in f.filename]
    if not frames:
        return "outside shardplan"
    f = frames[-1]
    return f"{f.filename.split('/shardplan/')[-1]}:{f.lineno} {f.name}"


def run_cli_case(case: Case, folder: Path) -> Outcome:
    """Run one case through ``shardplan.cli.app.main`` in ``folder`` (the cwd) and classify how it ended."""
    from shardplan.cli.app import main

    outs: list[tuple[str, Path]] = []
    argv, env = materialize(case, folder, outs)
    before = _listing(WATCHED + [folder.parent])
    saved_env = {k: os.environ.get(k) for k in env}
    cwd = os.getcwd()
    out, err = io.StringIO(), io.StringIO()
    verdict, code = None, None
    c_output: list[str] = []
    started = time.perf_counter()
    stdin = sys.stdin
    try:
        os.chdir(folder)
        os.environ.update(env)
        sys.stdin = io.TextIOWrapper(io.BytesIO(case.stdin), encoding="utf-8")
        with warnings.catch_warnings(record=True) as caught, no_real_measurements():
            warnings.simplefilter("always")
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), fd_output() as c_output, \
                    guarded():
                try:
                    code = main(argv)
                except SystemExit as exc:  # the script would exit with this code
                    code = exc.code if isinstance(exc.code, int) else 1
        shown = [w for w in caught if not issubclass(w.category, NOT_SHOWN_BY_DEFAULT)]
        if shown:
            verdict = f"warning:{shown[0].category.__name__}"
    except Hang:
        verdict = "hang"
    except MeasurementReached:
        verdict = "measurement"
    except MemoryError:
        verdict = "memory"
    except BaseException as exc:  # noqa: BLE001 - what escapes main is what the user would see as a traceback
        if isinstance(exc, KeyboardInterrupt):
            raise
        verdict = f"traceback:{type(exc).__name__}"
        print(f"{type(exc).__name__}: {str(exc)[:300]} (at {_innermost(exc)})", file=err)
    finally:
        sys.stdin = stdin
        os.chdir(cwd)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    stderr = err.getvalue()
    if verdict is None and "".join(c_output).strip():
        verdict = "c-level-output"
        stderr += "".join(c_output)[:500]
    if verdict is None:
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("shardplan: error:")]
        # the error output: from the first error line on (progress lines and notes before it are fine)
        error_output = lines[lines.index(errors[0]):] if errors else []
        if "Traceback" in out.getvalue() + stderr:
            verdict = "traceback-text"
        elif code == 0 and case.expect_error:
            verdict = "accepted-contradiction"
        elif code == 0:
            verdict = "ok" if not errors else "error-with-exit-0"
        elif code == 2 and case.expect_error and out.getvalue().strip():
            verdict = "error-after-output"  # the whole report printed, then refused
        elif code == 2:
            verdict = "error" if len(error_output) == 1 else "multi-line-stderr"
        elif code == 1 and case.argv[0] == "fit" and "--check" in case.argv:
            verdict = "check"
        else:
            verdict = f"exit:{code}"
    if verdict in ("ok", "error", "check", "measurement"):
        verdict = _issue22_verdict(case, argv, outs, code, stderr) or verdict
    if (folder / "NEVER_RAN_MARKER").exists() or "never_run" in sys.modules:  # a config's auto_map module ran
        verdict = "ran-config-code"
    after = _listing(WATCHED + [folder.parent])
    if verdict in ("ok", "error", "check", "measurement") and after != before:
        new = {k: sorted(after[k] - before[k])[:3] for k in after if after[k] - before.get(k, frozenset())}
        if any(new.values()):
            verdict = "wrote-outside"
            stderr += f"\nnew entries: {new}"
    return Outcome(argv, verdict, code, stderr, out.getvalue()[-500:], time.perf_counter() - started)


def _issue22_verdict(case: Case, argv: list[str], outs: list[tuple[str, Path]], code, stderr: str) -> str | None:
    """Issue 22's promises about what a case wrote and announced ("unsafe-write", "temp-left",
    "not-announced"), or None when it kept them."""
    for kind, path in outs:
        try:
            if path.parent.is_dir() and (found := output_violation(kind, path, "--force" in argv)):
                return found
        except OSError:
            continue
    if code == 0 and case.expect_stderr and case.expect_stderr not in stderr:
        return "not-announced"
    return None


def shown_argv(argv: list[str]) -> str:
    """The argv as a short shell-ish line for reports."""
    parts = []
    for a in argv:
        a = a if len(a) <= 60 else f"{a[:40]}…({len(a)} chars)"
        parts.append(a if a and all(c.isalnum() or c in "-_./=:,+" for c in a) else repr(a))
    return "shardplan " + " ".join(parts)
