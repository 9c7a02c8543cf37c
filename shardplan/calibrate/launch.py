"""Three ways to run a configuration's ranks, all with torch's own machinery, plus the grid driver.

* ``run_fake(cfg)``: one process, ``FakeStore`` + backend ``"fake"`` at any world size (up to
  thousands); ``cfg.fake_tensors`` adds ``FakeTensorMode`` for 7B-70B shapes; ``cfg.device ==
  "cuda"`` puts the model on one real GPU (rank 0 of any world size). Only rank 0 exists,
  so the record is rank 0's (FSDP pads shards so every rank allocates the same bytes).
* ``run_spawn(cfg)``: ``torch.multiprocessing`` starts ``world_size`` ranks (gloo on CPU, nccl on
  GPUs with one GPU per rank: more ranks than visible GPUs are refused up front,
  ``check_world_size``), rendezvous at 127.0.0.1 on a free port; each rank measures, records come
  back per rank.
* torchrun: ``torchrun --nproc-per-node N -m shardplan.calibrate.launch --config cfg.json
  --out results.jsonl`` (multi-node: torchrun's ``--rdzv-backend c10d --rdzv-endpoint``); rank 0
  gathers all ranks' records and appends one line.

``run_grid`` runs a list of configurations, isolating each in child processes (unless told not
to) with a timeout, records OOM / timeout / lost rank / error as the configuration's status and
goes on, appends each record atomically, and skips configurations already in the file.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

from shardplan.calibrate.config import RunConfig
from shardplan.calibrate.results import append_jsonl, done_keys
from shardplan.support.atomic_write import write_text_atomic

MERGE_MAX = ("measured",)
# The CUDA caching allocator's own peaks, per rank (``torch.cuda.max_memory_allocated`` /
# ``max_memory_reserved`` / ``memory_stats()["active_bytes.all.peak"]``): kept per rank and as the max.
CUDA_PEAK_FIELDS = ("cuda_max_allocated_bytes", "cuda_max_reserved_bytes", "cuda_active_peak_bytes")
RANK_FIELDS = ("rank", "measured", "total_peak_bytes", "forward_peak_bytes", "backward_peak_bytes", "step_time_s",
               *CUDA_PEAK_FIELDS)


def _one_thread():
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def merge_ranks(records: list[dict]) -> dict:
    """One record per configuration: rank 0's fields, ``measured``, the phase peaks and the CUDA
    allocator peaks as the max over ranks, and every rank's own values kept under ``ranks``."""
    records = sorted(records, key=lambda r: r.get("rank", 0))
    out = dict(records[0])
    out.pop("rank", None)
    if len(records) > 1:
        keys = set().union(*(r.get("measured", {}).keys() for r in records))
        out["measured"] = {k: max(r.get("measured", {}).get(k, 0) for r in records) for k in sorted(keys)}
        for k in ("total_peak_bytes", "forward_peak_bytes", "backward_peak_bytes"):
            out[k] = max(r.get(k, 0) for r in records)
        times = [r["step_time_s"] for r in records if r.get("step_time_s") is not None]
        out["step_time_s"] = max(times) if times else None
        for k in CUDA_PEAK_FIELDS:
            vals = [r[k] for r in records if r.get(k) is not None]
            if vals:
                out[k] = max(vals)
    out["ranks"] = [{k: r.get(k) for k in RANK_FIELDS} for r in records]
    out["num_ranks_measured"] = len(records)
    return out


def check_world_size(cfg: RunConfig) -> None:
    """Refuse, before anything starts, a configuration that cannot run here: real ranks on CUDA
    need one GPU each (``world_size`` <= visible devices; two ranks on one GPU hang or fail inside
    NCCL), ``device="cuda"`` needs a GPU, and real ranks on the CPU are at most
    ``limits.MAX_LOCAL_CPU_RANKS`` processes. Raises ShardplanError (one line)."""
    import torch

    from shardplan.support.errors import ShardplanError
    from shardplan.support.limits import MAX_LOCAL_CPU_RANKS

    cuda = torch.cuda.is_available()
    if cfg.device == "cuda" and not cuda:
        raise ShardplanError("device", "cuda", "no CUDA device is visible")
    if cfg.launch != "fake" and cfg.device != "cpu" and cuda:
        visible = torch.cuda.device_count()
        if cfg.world_size > visible:
            raise ShardplanError("world_size", cfg.world_size,
                                 f"exceeds the {visible} visible CUDA device(s) of this machine ({cfg.label()}); "
                                 f"run one rank per GPU, or --launch fake --device cuda for larger world sizes")
    elif cfg.launch != "fake" and cfg.world_size > MAX_LOCAL_CPU_RANKS:  # gloo: one process per rank
        raise ShardplanError("world_size", cfg.world_size,
                             f"above the {MAX_LOCAL_CPU_RANKS} local CPU ranks shardplan starts (each is a process "
                             f"importing torch); --launch fake measures larger world sizes in one process")


def resolve_launch(launch: str) -> str:
    """``auto``: real ranks (``spawn``) when CUDA GPUs are visible, else the fake process group."""
    if launch != "auto":
        return launch
    import torch

    return "spawn" if torch.cuda.is_available() and torch.cuda.device_count() > 0 else "fake"


def classify_error(exc: BaseException | str) -> str:
    text = str(exc).lower()
    if "out of memory" in text or "outofmemory" in text or isinstance(exc, MemoryError):
        return "oom"
    return "error"


# --- fake process group ---------------------------------------------------------------------
def run_fake(cfg: RunConfig) -> dict:
    _one_thread()
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from shardplan.calibrate.runner import measure

    if dist.is_initialized():
        dist.destroy_process_group()
    check_world_size(cfg)
    if cfg.device == "cuda":
        import torch

        torch.cuda.set_device(0)  # one GPU holds rank 0 of any world size
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=cfg.world_size)
    try:
        rec = measure(cfg)
    finally:
        dist.destroy_process_group()
    return merge_ranks([rec])


# --- spawned ranks --------------------------------------------------------------------------
def _spawn_worker(rank: int, cfg_json: str, port: int, outdir: str, backend: str) -> None:
    _one_thread()
    import torch
    import torch.distributed as dist

    from shardplan.calibrate.runner import measure

    cfg = RunConfig.model_validate_json(cfg_json)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(cfg.world_size), LOCAL_RANK=str(rank))
    if cfg.launch == "fake":  # an isolated fake-PG run: one child process
        rec = run_fake(cfg)
        write_text_atomic(Path(outdir, "rank0.json"), json.dumps(rec))
        return
    kwargs = {}
    if backend == "nccl":  # one GPU per rank (``check_world_size`` refused more ranks than GPUs)
        torch.cuda.set_device(rank)
        kwargs["device_id"] = torch.device("cuda", rank)
    dist.init_process_group(backend, rank=rank, world_size=cfg.world_size, **kwargs)
    try:
        rec = measure(cfg)
        write_text_atomic(Path(outdir, f"rank{rank}.json"), json.dumps(rec))
    except BaseException as exc:  # recorded, then re-raised so the parent sees the failure
        write_text_atomic(Path(outdir, f"rank{rank}.err"), f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        raise
    finally:
        dist.destroy_process_group()


def _default_backend(cfg: RunConfig | None = None) -> str:
    import torch

    if cfg is not None and cfg.device == "cpu":
        return "gloo"
    return "nccl" if torch.cuda.is_available() else "gloo"


def run_spawn(cfg: RunConfig, timeout_s: float = 300.0, backend: str | None = None) -> dict:
    """Run the configuration's ranks as child processes; ``cfg.launch == "fake"`` runs one child
    with the fake process group (isolation from OOM/hangs). Raises RuntimeError/TimeoutError."""
    import torch.multiprocessing as mp

    check_world_size(cfg)
    backend = backend or _default_backend(cfg)
    nprocs = 1 if cfg.launch == "fake" else cfg.world_size
    with tempfile.TemporaryDirectory(prefix="shardplan-cal-") as outdir:
        ctx = mp.start_processes(_spawn_worker, args=(cfg.model_dump_json(), free_port(), outdir, backend),
                                 nprocs=nprocs, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=0.5):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"configuration did not finish within {timeout_s:.0f} s")
        except mp.ProcessExitedException as exc:
            errs = sorted(Path(outdir).glob("*.err"))
            detail = errs[0].read_text().splitlines()[0] if errs else str(exc)
            raise RankLost(f"rank {exc.error_index} exited with code {exc.exit_code}: {detail}") from None
        except mp.ProcessRaisedException as exc:
            raise RuntimeError(str(exc).strip().splitlines()[-1]) from None
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
                    p.join(5)
                    if p.is_alive():
                        p.kill()
        recs = [json.loads(p.read_text()) for p in sorted(Path(outdir).glob("rank*.json"))]
    if cfg.launch == "fake":
        return recs[0]
    if len(recs) != nprocs:
        raise RankLost(f"{nprocs - len(recs)} of {nprocs} ranks returned no record")
    return merge_ranks(recs)


class RankLost(RuntimeError):
    pass


# --- grid driver ----------------------------------------------------------------------------
def run_one(cfg: RunConfig, isolate: bool = True, timeout_s: float = 300.0) -> dict:
    """Run one configuration and always return a record (status ok / oom / timeout / rank_lost / error)."""
    t0 = time.monotonic()
    try:
        if cfg.launch == "fake" and not isolate:
            rec = run_fake(cfg)
        else:
            rec = run_spawn(cfg, timeout_s=timeout_s)
    except TimeoutError as exc:
        rec = _failed(cfg, "timeout", exc)
    except RankLost as exc:
        rec = _failed(cfg, "oom" if classify_error(exc) == "oom" else "rank_lost", exc)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded status
        rec = _failed(cfg, classify_error(exc), exc)
    rec["wall_s"] = round(time.monotonic() - t0, 3)
    return rec


def _failed(cfg: RunConfig, status: str, exc: BaseException) -> dict:
    return {"key": cfg.key(), "status": status, "config": cfg.model_dump(mode="json"),
            "error": f"{type(exc).__name__}: {exc}"[:2000]}


def run_grid(configs: list[RunConfig], out_path, isolate: bool = True, timeout_s: float = 300.0,
             resume: bool = True, retry_failed: bool = False,
             progress: Callable[[str], None] | None = print, force: bool = False) -> list[dict]:
    """Measure every configuration not yet in ``out_path``; append each record as soon as it exists
    (``force``: into a read-only file too, which stays read-only)."""
    done = done_keys(out_path, retry_failed=retry_failed) if resume else set()
    todo = [c for c in configs if c.key() not in done]
    if progress and len(todo) < len(configs):
        progress(f"resuming: {len(configs) - len(todo)} of {len(configs)} configurations already in {out_path}")
    records, t_start = [], time.monotonic()
    for i, cfg in enumerate(todo, 1):
        rec = run_one(cfg, isolate=isolate, timeout_s=timeout_s)
        append_jsonl(out_path, rec, force=force)
        records.append(rec)
        if progress:
            elapsed = time.monotonic() - t_start
            eta = elapsed / i * (len(todo) - i)
            peak = rec.get("total_peak_bytes")
            extra = f"peak {peak / 2**20:.2f} MiB" if peak else rec.get("error", "")[:80]
            progress(f"[{i}/{len(todo)}] {cfg.label()} {cfg.launch}: {rec['status']} "
                     f"({rec['wall_s']:.1f} s, {extra}; ETA {eta:.0f} s)")
    return records


# --- torchrun entry point -------------------------------------------------------------------
def torchrun_main(argv: list[str] | None = None) -> int:
    """Entry point under torchrun: every rank measures; rank 0 appends the merged record."""
    parser = argparse.ArgumentParser(prog="python -m shardplan.calibrate.launch")
    parser.add_argument("--config", required=True, help="RunConfig as a JSON file or JSON text")
    parser.add_argument("--out", required=True, help="results JSONL to append to")
    args = parser.parse_args(argv)
    _one_thread()
    import torch
    import torch.distributed as dist

    from shardplan.calibrate.runner import measure

    text = Path(args.config).read_text() if os.path.exists(args.config) else args.config
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cfg = RunConfig.model_validate({**json.loads(text), "world_size": world, "launch": "torchrun"})
    backend = _default_backend(cfg)
    kwargs = {}
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        kwargs["device_id"] = torch.device("cuda", local)
    dist.init_process_group(backend, **kwargs)
    try:
        try:
            rec = measure(cfg)
        except Exception as exc:  # noqa: BLE001
            rec = {**_failed(cfg, classify_error(exc), exc), "rank": dist.get_rank()}
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, rec)
        if dist.get_rank() == 0:
            bad = [r for r in gathered if r.get("status") != "ok"]
            append_jsonl(args.out, bad[0] if bad else merge_ranks(gathered))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(torchrun_main())
