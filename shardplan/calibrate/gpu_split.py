"""The held-out third of the GPU runs of the scripts users launch (issue 25), decided by a rule fixed
before any of them ran (data/calibration/gpu/userscripts/README.md):

    digest = sha256(json.dumps(config, sort_keys=True, separators=(",", ":")))   # the run's configuration
    held out  <=>  int(digest, 16) % 3 == 0

The configuration is the ``config`` object a run's record carries (benchmarks/gpu_userscripts.py's
grid), so the rule depends on what was asked, never on what was measured. Held-out records live in
their own file; nothing that fits a coefficient may read it (tests/test_gpu_heldout.py).
torch-free.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

MODULUS = 3
FOLDER = Path(__file__).resolve().parents[2] / "data" / "calibration" / "gpu" / "userscripts"
TRAIN_NAME = "train.jsonl"
HELDOUT_NAME = "heldout.jsonl"


def config_digest(config: dict) -> str:
    """sha256 of the canonical JSON of a run's configuration."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def is_held_out(config: dict) -> bool:
    return int(config_digest(config), 16) % MODULUS == 0


def split(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """(train, held out) by the rule, each in the order given."""
    held = [r for r in records if is_held_out(r["config"])]
    return [r for r in records if not is_held_out(r["config"])], held


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
