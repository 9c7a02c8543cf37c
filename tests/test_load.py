"""``formulas/load.py``: the load-time peak of Llama-3.1-8B, derived by hand from its config.json
(meta-llama/Llama-3.1-8B: vocab 128,256, hidden 4,096, 32 layers, MLP 14,336, 8 KV heads of 128,
untied embeddings) and the module's cited load paths, not from the package's own parameter count."""

from __future__ import annotations

import math

import pytest

import shardplan
from shardplan.formulas.columns import columns_for
from shardplan.formulas.load import load_peak_allocated_bytes

HIDDEN, VOCAB, LAYERS, MLP, KV = 4096, 128_256, 32, 14_336, 8 * 128
BLOCK = 2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV + 3 * HIDDEN * MLP + 2 * HIDDEN  # q, o, k, v, gate/up/down, two RMSNorms
ROOT = 2 * VOCAB * HIDDEN + HIDDEN  # embedding, lm_head, final norm
TOTAL = LAYERS * BLOCK + ROOT       # 8,030,261,248: the model card's count


def _load_peak(load_mode: str, gpus: int, precision: str = "bf16-mixed") -> int:
    spec = shardplan.resolve_model("llama-3.1-8b").spec
    config = shardplan.TrainingConfig(strategy="full_shard" if gpus > 1 else "single", load_mode=load_mode, precision=precision)
    return int(load_peak_allocated_bytes(columns_for(spec, shardplan.parse_gpus(f"{gpus}xh100-sxm"), config), gpus))


@pytest.mark.parametrize("precision, element_bytes", [("bf16-mixed", 2), ("fp32", 4)])
def test_llama_8b_load_peaks_per_load_mode(precision, element_bytes):
    """full_per_gpu: the whole model in its load dtype plus the largest unit being flattened;
    rank0_broadcast: the rank's shard plus one unit unsharded; meta_init: the shard only.
    On one GPU nothing is sharded: every mode holds the whole model."""
    whole, unit = element_bytes * TOTAL, element_bytes * max(ROOT, BLOCK)
    assert TOTAL == 8_030_261_248
    assert _load_peak("full_per_gpu", 8, precision) == whole + unit
    assert _load_peak("rank0_broadcast", 8, precision) == math.ceil(whole / 8) + unit
    assert _load_peak("meta_init", 8, precision) == math.ceil(whole / 8)
    assert {_load_peak(mode, 1, precision) for mode in ("full_per_gpu", "rank0_broadcast", "meta_init")} == {whole}
