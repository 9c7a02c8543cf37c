"""Against `accelerate estimate-memory` (tests/data/accelerate_estimates.csv, accelerate 1.15.0).

accelerate counts parameters + buffers and reports the largest layer; its "training with Adam"
is the maximum of its components, not their sum (tests/data/README.md). shardplan agrees on the
sizes and differs, by design, on training: it sums the states a mixed-precision step holds.
"""

import csv
from pathlib import Path

import pytest

from shardplan.formulas.memory import estimate_memory
from shardplan.inputs import strategy as st
from shardplan.inputs.models import get_model
from tests.helpers import columns
from tools.make_model_profiles import NAMES

DATA = Path(__file__).parent / "data"
COUNTS = {row["model"]: row for row in csv.DictReader(open(DATA / "hf_model_counts.csv"))}
ROWS = [row for row in csv.DictReader(open(DATA / "accelerate_estimates.csv"))
        if row["construction"] == "AutoModelForCausalLM_meta" and row["dtype"] == "float32"]


@pytest.mark.parametrize("row", ROWS, ids=[r["model"] for r in ROWS])
def test_total_and_largest_layer_sizes_agree(row):
    spec = get_model(NAMES[row["model"]][0])
    buffers = int(COUNTS[row["model"]]["buffer_bytes"] or 0)
    assert int(float(row["total_size_bytes"])) == 4 * spec.total_params + buffers
    # accelerate's "largest layer" is the largest FSDP-wrappable unit: a decoder block or a
    # vocabulary-sized embedding / lm_head.
    # (Gemma-2's embedding also owns a one-element fp32 scale buffer: 4 bytes more.)
    largest = 4 * max(spec.largest_block_params, spec.embedding_params)
    assert 0 <= int(float(row["largest_layer_bytes"])) - largest <= 4


def test_mixed_precision_adam_needs_twice_accelerates_16_bit_figure():
    # accelerate's float16 "training with Adam" for Llama-2-7B is 8 bytes/param (the max of its
    # components); a bf16-mixed AdamW step on one GPU holds 16 bytes/param of model state.
    row = next(r for r in csv.DictReader(open(DATA / "accelerate_estimates.csv"))
               if r["model"] == "Llama-2-7B" and r["construction"] == "AutoModelForCausalLM_meta" and r["dtype"] == "float16")
    m = estimate_memory(columns("llama-2-7b", strategy=st.NO_SHARD, world_size=1, gpus_per_node=1, shard_group_size=1))
    assert int(float(row["training_using_adam_bytes"])) == pytest.approx(8 * 6_738_415_616, rel=1e-6)
    assert int(m["model_state_bytes"]) == pytest.approx(16 * 6_738_415_616, rel=1e-3)
