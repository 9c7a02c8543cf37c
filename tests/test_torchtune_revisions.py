"""torchtune's 2024 README rows read with the code of the revision that measured them
(``runs.TORCHTUNE_REVISION_DATES``, ``runs.TORCHTUNE_WRITTEN_AT``): the commit that wrote a number
dates it (``runs._revision_date``); torch.optim.SGD without momentum keeps no state (``sgd-plain``,
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
                                         ("TTN017", "2024-11-14")])
def test_rows_are_dated_by_the_commit_that_wrote_their_number(row_id, date):
    assert runs._revision_date(ROWS[row_id].row, "torchtune") == date


@pytest.mark.parametrize("precision", [st.BF16_PURE, st.FP32])
def test_sgd_without_momentum_keeps_no_state(precision):
    # torch optim/sgd.py keeps a momentum_buffer only when momentum != 0
    plain, momentum = (float(optimizer_bytes_per_element(o, precision, 4096)) for o in (st.SGD_PLAIN, st.SGD))
    assert plain == 0 and momentum == (2 if precision == st.BF16_PURE else 4)
