"""Training metrics on the logits (``metric_ce``): composer v0.16.3 updates llm-foundry's two train
metrics (``LanguageCrossEntropy``, ``LanguagePerplexity``) after every micro-batch with an eager
float32 cross-entropy forward each, on top of the loss (fused or not). The cost scales with the
vocabulary per token, not with the model's width, which is why small MPT models feel it most."""

from __future__ import annotations

import pytest

from shardplan.formulas import throughput as tp
from shardplan.formulas.activations import stream_dtype_bytes
from shardplan.validation.runs import read_runs
from tests.helpers import columns


@pytest.mark.parametrize("vocab", [32000, 50368, 128256])
@pytest.mark.parametrize("fused", [False, True])
def test_metric_forwards_add_bytes_per_vocabulary_entry_whatever_the_loss(vocab, fused):
    off, on = (columns("llama-3.1-8b", vocab_size=vocab, fused_ce=fused, metric_ce=m) for m in (False, True))
    added = float(tp.elementwise_bytes_per_token(on) - tp.elementwise_bytes_per_token(off))
    a = float(stream_dtype_bytes(off))
    expected = tp.METRIC_CE_FORWARDS * tp.METRIC_CE_FORWARD_BYTES_PER_VOCAB * a / 2 * vocab
    assert added == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("narrow,wide", [("gpt2", "gpt2-xl"), ("opt-125m", "opt-1.3b")])
def test_metric_forwards_weigh_more_on_a_narrow_model(narrow, wide):
    """The same vocabulary (hidden 768 against 1600 / 2048) costs a larger share of the narrow
    model's element-wise bytes per token, and the same bytes."""
    def added_and_share(model):
        on, off = (float(tp.elementwise_bytes_per_token(columns(model, metric_ce=m))) for m in (True, False))
        return on - off, (on - off) / on
    (added_n, share_n), (added_w, share_w) = added_and_share(narrow), added_and_share(wide)
    assert added_n == pytest.approx(added_w)
    assert share_n > 1.5 * share_w > 0


def test_only_composer_runs_compute_training_metrics():
    rows = {r.row_id: r for r in read_runs("tests/data/published_runs/runs.csv")}
    assert rows["MF216"].config.metric_ce is True   # llm-foundry MPT-125m on composer
    assert rows["MF016"].config.metric_ce is True
    assert rows["TT002"].config.metric_ce is None    # torchtitan: the stack default (off)
    assert tp.METRIC_CE_FORWARDS == 2                # LanguageCrossEntropy + LanguagePerplexity
