"""A timed fit answer (``fit --global-batch-tokens``, ``fit(..., time=True)``) prices its step from
the memory columns it reports: one memory estimate per answer, and the paged optimizer's spill the
time pays for (``throughput.paged_migration_s``) is the one the answer's memory shows."""

from __future__ import annotations

import pytest

from shardplan.formulas import throughput as tp
from shardplan.inputs.allocator_profile import default_allocator
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.models import resolve_model
from shardplan.planning import evaluate as evaluator
from shardplan.planning.fit import fit, step_timings
from tests.helpers import run_cli

FIT_8B = "llama-3.1-8b on 8xh100-sxm seq 8192 ac full full_shard"  # issue 23's timed answer: it fits
# a full fine-tune with bitsandbytes' paged 8-bit AdamW on one 96 GB card: the shipped allocator
# leaves its 15 GiB of states room on the device, a CUDA context 8 GiB larger (an overlay's) does not
PAGED = TrainingConfig(strategy="single", method="full", optimizer="adamw8bit", paged_optimizer=True, ac="full", seq_len=1024)


@pytest.fixture
def memory_estimates(monkeypatch):
    """How many times the evaluator estimated memory (``formulas.memory.estimate_memory``)."""
    calls = []
    real = evaluator.estimate_memory
    monkeypatch.setattr(evaluator, "estimate_memory", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_a_timed_fit_answer_estimates_memory_once(memory_estimates):
    res = run_cli("fit", FIT_8B, "--global-batch-tokens", "4M", "--json")
    assert res.exit_code == 0, res.output
    assert '"step_time_s"' in res.stdout  # timed
    assert len(memory_estimates) == 1
    memory_estimates.clear()
    assert run_cli("fit", FIT_8B, "--json").exit_code == 0
    assert len(memory_estimates) == 1  # the time costs no memory estimate of its own


def test_fit_times_equal_step_timings_of_the_same_configurations():
    spec, cluster = resolve_model("llama-3.1-8b").spec, parse_gpus("8xh100-sxm")
    config = TrainingConfig(seq_len=8192, ac="full", grad_accum=64)
    results = fit(spec, cluster, config, time=True)
    assert len(results) > 2 and all(r.time is not None for r in results)
    apart = step_timings(spec, cluster, [TrainingConfig(**r.config) for r in results])
    assert [r.time for r in results] == apart
    assert all(r.time is None for r in fit(spec, cluster, config))


def _with_context(extra_bytes: int):
    base = default_allocator()
    return base.model_copy(update={"cuda_context_bytes": base.cuda_context_bytes + extra_bytes, "calibrated": True})


def test_the_time_prices_the_spill_of_the_answers_own_allocator():
    spec, cluster = resolve_model("8b").spec, parse_gpus("1x96GB")
    link = float(tp.compute_rates(cluster).host_link_bytes_per_s)
    spilled = []
    for allocator in (None, _with_context(8 * 2**30)):
        memory = evaluator.evaluate_query(spec, cluster, PAGED, allocator=allocator)
        (result,) = fit(spec, cluster, PAGED, allocator=allocator, time=True)
        spill, paged = memory["paged_spill_bytes"], memory["paged_state_bytes"]
        assert paged > 0
        # the step moves 2 x the paged bytes over the host link exactly when this allocator spills
        expected = 2 * paged / link if spill > 0 else 0.0
        assert result.time["offload_transfer_s"] == pytest.approx(expected, rel=1e-12)
        spilled.append(spill > 0)
    assert spilled == [False, True]  # the two allocators disagree on this card: the test tells them apart
