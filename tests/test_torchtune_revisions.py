"""torchtune's 2024 README rows read with the code of the revision that measured them
(``runs.TORCHTUNE_REVISION_DATES``, ``runs.TORCHTUNE_WRITTEN_AT``): the commit that wrote a number
dates it (``runs._dating``); torch.optim.SGD without momentum keeps no state (``sgd-plain``,
what the 12.01 GB row's commit a95c6b931 configured)."""

from __future__ import annotations

import pytest

from shardplan.formulas.model_states import optimizer_bytes_per_element
from shardplan.inputs import strategy as st
from shardplan.validation import runs
from shardplan.validation.runs import read_runs

ROWS = {r.row_id: r for r in read_runs("tests/data/published_runs/runs.csv")}


@pytest.mark.parametrize("row_id,date", [("TTN002", "2024-03-21"), ("TTN001", "2024-03-22"), ("TTN004", "2024-03-28"),
                                         ("TTN006", "2024-04-16"), ("TTN009", "2024-04-18"), ("TTN013", "2024-05-09"),
                                         ("TTN017", "2024-09-24"), ("TTN019", "2024-09-24")])
def test_rows_are_dated_by_the_commit_that_wrote_their_number(row_id, date):
    assert runs._dating(ROWS[row_id].row, "torchtune").revision == date


@pytest.mark.parametrize("stack,commit,revision", [
    ("torchtitan", "git b5bcd76c; torch 38410cf9 (2025-06-14)", None),      # a page date dates no torchtitan revision
    ("torchtitan", "torchtitan 9dec370 (2025-06-14)", "2024-12-26"),        # a named commit does
    ("torchtune", "README @ 0217d44c2 (2025-06-14)", "2024-05-09"),         # the named README revision's date
    ("torchtune", "README @ abc (2025-06-14)", "2025-06-14"),               # none named: the stated date
    ("hf", "wiki revision of 2025-06-14", "2025-06-14"),
])
def test_one_reading_dates_a_row_twice(stack, commit, revision):
    # the stated date (the run was on or before it) is the same for every stack; the revision date
    # is the code's, which only a named commit gives a torchtitan row
    dated = runs._dating({"source": "", "source_locator": "", "source_commit_or_url": commit}, stack)
    assert dated.stated == "2025-06-14" and dated.revision == revision


@pytest.mark.parametrize("precision", [st.BF16_PURE, st.FP32])
def test_sgd_without_momentum_keeps_no_state(precision):
    # torch optim/sgd.py keeps a momentum_buffer only when momentum != 0
    plain, momentum = (float(optimizer_bytes_per_element(o, precision, 4096)) for o in (st.SGD_PLAIN, st.SGD))
    assert plain == 0 and momentum == (2 if precision == st.BF16_PURE else 4)


# --- reading the rows with the mechanisms (branch s4-ttold-rows: held back, docs/accuracy.md) --------

def test_the_12_gb_row_is_read_with_the_sgd_of_its_commit():
    # a95c6b931's recipes/configs/full_finetune_distributed.yaml: torch.optim.SGD, lr only
    assert ROWS["TTN005"].config.optimizer == "sgd-plain"
    assert ROWS["TTN008"].config.optimizer == "adamw"  # fef3ed10d wrote 22.9 GB with 7B_full.yaml's AdamW
    assert any("a95c6b931" in a for a in ROWS["TTN005"].assumed)


@pytest.mark.parametrize("row_id,on", [("TTN001", True), ("TTN009", True), ("TTN010", True), ("TTN003", True),
                                       ("TTN021", None), ("TTN034", None)])
def test_nf4_whole_quantize_before_the_torchao_03_pin(row_id, on):
    # the knob is set on every torchtune row dated before 2024-06-26; it acts on one-GPU QLoRA only
    assert ROWS[row_id].config.nf4_whole_quantize is on


@pytest.mark.parametrize("row_id", ["TTN001", "TTN002", "TTN005", "TTN006", "TTN010", "TTN014", "TTN016"])
def test_rows_before_the_chunked_loss_run_the_whole_loss_and_keep_the_logits(row_id):
    config = ROWS[row_id].config
    assert config.ce_chunks == 0 and config.loop_keeps_logits is True


@pytest.mark.parametrize("row_id", ["TTN017", "TTN019", "TTN021", "TTN025", "TTN033"])
def test_rows_after_it_are_left_to_the_stack(row_id):
    # (the flags table's rows state their loss in the notes: ``runs.LOSS_PATTERNS``)
    config = ROWS[row_id].config
    assert config.loop_keeps_logits is None and config.ce_chunks == runs._loss(ROWS[row_id].row).get("ce_chunks")


@pytest.mark.parametrize("row_id,targets", [("TTN019", "qv"), ("TTN021", "all-linear"), ("TTN017", None)])
def test_the_llama31_table_is_read_with_the_configs_of_the_commit_that_wrote_it(row_id, targets):
    # 30b8519e8 (#1664) wrote the table the rows read at 9bafd16fc; its 8B_lora_single_device.yaml
    # adapted q_proj, v_proj only, its 8B_qlora_single_device.yaml q, k, v, output_proj + MLP
    row = ROWS[row_id]
    assert runs._dating(row.row, "torchtune").written[0] == "30b8519e8"
    assert row.config.lora_targets == targets or (targets is None and row.config.method == "full")


def test_the_8b_lora_row_reads_fewer_adapters_than_its_later_config():
    # the row's own text (q_proj, v_proj, output_proj + MLP, the configs from e137afeba on) reads
    # all-linear; the config that measured it adapts two projections, so fewer trainable parameters
    row = ROWS["TTN019"]
    later = runs._lora(row.row["precision"])["lora_targets"]
    assert later == "all-linear" and row.config.lora_targets == "qv"
    assert any("30b8519e8" in a and "qv" in a for a in row.assumed)


def test_the_70b_lora_row_would_read_its_attention_adapters():
    # 70B_lora.yaml at 30b8519e8: q, k, v without the MLP; the row is unexpressible for its A100
    # capacity, so the reading is checked on the raw row
    assert runs._torchtune_written_at(ROWS["TTN023"].row)[2] == {"lora_targets": "attention"}


def test_del_logits_dates_differ_by_recipe():
    # a lora_finetune_distributed run dated between #1046 and #1235 already dropped its logits; a
    # single-device one did not
    row = dict(ROWS["TTN002"].row, source_commit_or_url="", notes="", source_locator="rev x, 2024-06-20")
    dated = runs._dating(row, "torchtune")
    distributed = runs._torchtune_loss(row, "torchtune", dated)
    single = runs._torchtune_loss(dict(row, framework="torchtune single-device recipe"), "torchtune", dated)
    assert distributed == {"ce_chunks": 0} and single == {"ce_chunks": 0, "loop_keeps_logits": True}
