"""Atomic result files: JSONL (one record per configuration, resumable), CSV and JSON.

Every write goes through ``shardplan.support.atomic_write`` (temporary file in the destination folder,
fsync, ``os.replace``, the user's umask), so a reader (or an interrupted calibration) sees either
the old file or the new one, never a torn line. No torch import here.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Iterable

from shardplan.support.atomic_write import write_text_atomic
from shardplan.support.errors import ShardplanError
from shardplan.support.input_files import parse_json, path_kind, read_text
from shardplan.support.limits import MAX_RECORDS_FILE_BYTES


def write_json_atomic(path, data, force: bool = False) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n", force=force)


def _split_records(path: Path, text: str) -> tuple[list[dict], list[str]]:
    """(records, their lines) of a JSONL text. A last line without its newline that is not JSON is
    a torn append (a writer killed mid-line: an older shardplan, ``benchmarks/gpu_campaign.py``, a
    copy cut short): it is dropped, the records before it kept. Any other bad line is an error."""
    lines = text.splitlines()
    torn = bool(lines) and not text.endswith(("\n", "\r"))
    records, kept = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = parse_json(line, "records", f"{path}:{number}")
        except ShardplanError as err:
            if torn and number == len(lines):
                break
            raise ShardplanError("records", f"{path}:{number}", f"not a JSON record: {err.reason}") from None
        if not isinstance(record, dict):
            raise ShardplanError("records", f"{path}:{number}", "not a JSON record (expected an object per line)")
        records.append(record)
        kept.append(line.strip())
    return records, kept


def read_jsonl(path) -> list[dict]:
    """Every record of a JSONL results file ([] when it does not exist), read through the bounded
    reader (input_files.py, MAX_RECORDS_FILE_BYTES); each line must be one JSON object, else a
    one-line error naming the file and the line. A torn last line is dropped (``_split_records``),
    so a resumed calibration keeps every earlier record and measures that one again."""
    path = Path(path)
    if path_kind(path) is None and not os.path.islink(path):  # islink: False, never OSError, on a too-long name
        return []
    return _split_records(path, read_text(path, "records", MAX_RECORDS_FILE_BYTES))[0]


def append_jsonl(path, record: dict, force: bool = False) -> Path:
    """Append one record atomically (rewrite-and-replace: the file is always whole). The file is
    rewritten from its whole records, so a torn last line left by another writer is removed, not
    buried in the middle of the file. ``force``: a read-only file is replaced (and stays read-only)."""
    path = Path(path)
    kept = _split_records(path, read_text(path, "out", MAX_RECORDS_FILE_BYTES))[1] if path_kind(path) is not None else []
    return write_text_atomic(path, "".join(line + "\n" for line in kept) + json.dumps(record, sort_keys=True) + "\n",
                             force=force)


def done_keys(path, retry_failed: bool = False) -> set[str]:
    keys = set()
    for rec in read_jsonl(path):
        if retry_failed and rec.get("status") != "ok":
            continue
        keys.add(rec.get("key"))
    return keys


def write_csv_atomic(path, rows: Iterable[dict], columns: list[str] | None = None, force: bool = False) -> Path:
    rows = list(rows)
    if columns is None:
        columns = []
        for row in rows:
            for k in row:
                if k not in columns:
                    columns.append(k)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(row)
    return write_text_atomic(path, buf.getvalue(), force=force)


CONFIG_COLUMNS = ["key", "status", "engine", "strategy", "world_size", "shard_size", "param_dtype", "reduce_dtype",
                  "ac", "optimizer", "cpu_offload", "micro_batch", "seq_len", "launch", "fake_tensors", "model"]
SPEC_COLUMNS = ["hidden_size", "num_layers", "num_heads", "num_kv_heads", "resolved_head_dim", "intermediate_size",
                "vocab_size", "mlp", "norm", "tie_word_embeddings", "total_params"]


def flatten(record: dict) -> dict:
    """One configuration record -> one flat row (config, spec dims, measured bytes, peaks, time)."""
    cfg = record.get("config", {})
    row = {"key": record.get("key"), "status": record.get("status")}
    for c in CONFIG_COLUMNS[2:]:
        row[c] = cfg.get(c)
    if row.get("shard_size") is None and cfg:
        row["shard_size"] = record.get("shard_size")
    for c in SPEC_COLUMNS:
        row[c] = record.get("spec", {}).get(c)
    for k, v in sorted(record.get("measured", {}).items()):
        row[k] = v
    for k in ("forward_peak_bytes", "backward_peak_bytes", "total_peak_bytes", "step_time_s",
              "cuda_max_allocated_bytes", "cuda_max_reserved_bytes", "cuda_active_peak_bytes", "error"):
        if k in record:
            row[k] = record[k]
    for op, c in sorted(record.get("collectives", {}).items()):
        row[f"{op}_count"] = c["count"]
        row[f"{op}_bytes"] = c["bytes"]
    env = record.get("env", {})
    row["torch"] = env.get("torch")
    row["device"] = env.get("gpu") or env.get("cpu")
    row["backend"] = env.get("backend")
    return row
