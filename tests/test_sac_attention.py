"""Op-level SAC recomputes no attention when it saves the SDPA kernel's output
(``sac_saves_attention``: torchtitan's ``_save_list`` holds flash and efficient attention), as the
memory side already keeps O and LSE; block-level checkpointing recomputes it; torchtitan's sm100
revisions that ran cuDNN attention before it joined the list recompute it."""

from __future__ import annotations

import pytest

from shardplan.formulas import throughput as tp
from shardplan.inputs import strategy as st
from shardplan.validation.runs import read_runs
from tests.helpers import columns


@pytest.mark.parametrize("seq", [2048, 8192])
def test_saved_attention_is_not_recomputed_and_its_cost_scales_with_the_sequence(seq):
    saved, recomputed = (tp.flops_per_token(columns("llama-3.1-8b", seq_len=seq, ac=st.AC_SELECTIVE_OP,
                                                    sac_saves_attention=on)) for on in (True, False))
    attn = float(tp.attention_forward_flops_per_token(columns("llama-3.1-8b", seq_len=seq)))
    assert float(recomputed["bwd_attention"] - saved["bwd_attention"]) == pytest.approx(attn)
    assert float(saved["recompute"]) == pytest.approx(float(recomputed["recompute"]) - attn)
    assert float(saved["bwd_matmul"]) == float(recomputed["bwd_matmul"])  # the even matmuls still re-run


@pytest.mark.parametrize("ac", [st.AC_FULL, st.AC_SELECTIVE])
def test_block_checkpointing_recomputes_attention_whatever_the_knob(ac):
    on, off = (tp.flops_per_token(columns("llama-3.1-8b", ac=ac, sac_saves_attention=v)) for v in (True, False))
    assert float(on["bwd_attention"]) == float(off["bwd_attention"]) > float(
        tp.flops_per_token(columns("llama-3.1-8b"))["bwd_attention"])


def test_rows_recompute_only_where_the_kernel_was_not_saved():
    rows = {r.row_id: r for r in read_runs("tests/data/published_runs/runs.csv")}
    assert rows["AO008"].config.sac_saves_attention is False  # torchtitan 6fc499f6 on B200: cuDNN first
    assert rows["TT002"].config.sac_saves_attention is None   # 9dec370 on H100: flash, saved
    assert rows["AO004"].config.sac_saves_attention is None   # MI300X: AOTriton flash, saved
