"""The AdamW implementation knob (``optimizer_impl``: fused / foreach / for_loop), time and memory.

Step time: fused moves 28 B per fp32 parameter (read param, grad, exp_avg, exp_avg_sq; write three),
foreach and for-loop 20 passes = 80 B (``model_states.UNFUSED_ADAMW_PASSES``). Temporaries: fused
none, foreach one sqrt(v) copy of the shard (4 B/param fp32), for-loop two copies of the largest tensor.
"""

import numpy as np
import pytest

from shardplan.calibrate import gpu_split
from shardplan.calibrate.gpu_heldout import compare
from shardplan.formulas.buffers import optimizer_step_temporaries
from shardplan.formulas.model_states import UNFUSED_ADAMW_PASSES
from shardplan.formulas.throughput import compute_rates, optimizer_step_s
from shardplan.inputs import strategy as st
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.stacks import resolve_stack
from tests.helpers import columns, run_cli

STEP_BYTES = {st.OPT_FUSED: 28.0, st.OPT_FOREACH: 80.0, st.OPT_FOR_LOOP: 80.0}
TEMP_BYTES = {st.OPT_FUSED: 0.0, st.OPT_FOREACH: 4.0}
RATES = compute_rates(parse_gpus("8xh100-sxm"))


def test_unfused_pass_count_is_twenty():
    assert UNFUSED_ADAMW_PASSES == 20


@pytest.mark.parametrize("impl", sorted(STEP_BYTES))
@pytest.mark.parametrize("model", ["llama-3.2-1b", "llama-2-7b", "llama-3.1-8b", "llama-2-70b"])
def test_step_time_scales_by_the_impls_bytes_per_param(impl, model):
    c = columns(model, optimizer_impl=impl)
    shard = float(c.total_params) / 8
    per_param = float(optimizer_step_s(c, RATES)) * RATES.hbm_bytes_per_s / shard
    assert per_param == pytest.approx(STEP_BYTES[impl], rel=1e-12)


@pytest.mark.parametrize("impl", sorted(TEMP_BYTES))
def test_temporaries_scale_by_the_impls_bytes_per_param(impl):
    sizes = ["llama-3.2-1b", "llama-2-7b", "llama-2-70b"]
    for model in sizes:
        c = columns(model, optimizer_impl=impl)
        temps = float(optimizer_step_temporaries(c, 8))
        assert temps == pytest.approx(TEMP_BYTES[impl] * float(c.total_params) / 8, abs=1.0)


def test_for_loop_temporaries_follow_the_largest_tensor_not_the_count():
    small, large = (columns(m, optimizer_impl=st.OPT_FOR_LOOP) for m in ("llama-3.2-1b", "llama-2-70b"))
    for c in (small, large):
        temps = float(optimizer_step_temporaries(c, 8))
        assert temps == pytest.approx(4 * 2 * np.ceil(float(c.largest_module_params) / 8), rel=1e-9)


def test_fused_and_foreach_differ_by_52_bytes_and_the_sqrt_copy():
    fused, foreach = (columns("llama-3.1-8b", optimizer_impl=i) for i in (st.OPT_FUSED, st.OPT_FOREACH))
    shard = float(fused.total_params) / 8
    gap = float(optimizer_step_s(foreach, RATES) - optimizer_step_s(fused, RATES))
    assert gap == pytest.approx(shard * 52 / RATES.hbm_bytes_per_s, rel=1e-12)
    assert float(optimizer_step_temporaries(foreach, 8)) - float(optimizer_step_temporaries(fused, 8)) \
        == pytest.approx(4 * shard, abs=1.0)


def test_other_optimizers_ignore_the_knob():
    for opt in (st.SGD, st.LION, st.ADAMW_8BIT):
        times = {float(optimizer_step_s(columns(optimizer=opt, optimizer_impl=i), RATES)) for i in STEP_BYTES}
        assert len(times) == 1


@pytest.mark.parametrize("stack, impl", [("hf", "fused"), ("torchtitan", "fused"), ("torchtune", "fused"),
                                         ("lightning", "foreach"), ("plain", "foreach")])
def test_each_stack_defaults_to_what_its_entry_point_builds(stack, impl):
    assert resolve_stack(TrainingConfig(stack=stack), 8).optimizer_impl == impl
    assert resolve_stack(TrainingConfig(stack=stack, optimizer_impl="for-loop"), 8).optimizer_impl == "for_loop"


def test_cli_option_and_query_word():
    base = ["fit", "llama-3.1-8b on 8xh100-sxm", "--json"]
    fused = run_cli(*base)
    foreach = run_cli(*base, "--optimizer-impl", "foreach")
    word = run_cli("fit", "llama-3.1-8b on 8xh100-sxm optim_impl foreach", "--json")
    assert fused.exit_code == foreach.exit_code == word.exit_code == 0, fused.output + foreach.output + word.output
    assert foreach.stdout == word.stdout and foreach.stdout != fused.stdout
    bad = run_cli(*base, "--optimizer-impl", "turbo")
    assert bad.exit_code == 2 and "optimizer_impl" in bad.stderr and "turbo" in bad.stderr
    assert "Traceback" not in bad.output


def test_train_split_optimizer_phase_is_closer_with_the_stacks_fused_default(monkeypatch):
    """Trainer's full fine-tunes (train split only; optim = adamw_torch_fused in every record): the
    optimizer phase's median |error| with the hf stack's fused default is below the foreach
    prediction's."""
    import shardplan.calibrate.gpu_heldout as gh

    records = [r for r in gpu_split.read(gpu_split.FOLDER / "train.jsonl")
               if r.get("status") == "ok" and r["config"]["script"] != "titan"  # torchtitan's loop: fused=True itself
               and r["config"]["method"] == "full"]  # LoRA's states are MiBs: the knob moves its phase by < 2 %
    assert records and all("FUSED" in str(r.get("optim", "")).upper() for r in records)
    original = gh.user_training_config

    def median_error(impl):
        monkeypatch.setattr(gh, "user_training_config",
                            lambda cfg: original(cfg).model_copy(update={"optimizer_impl": impl}))
        return float(np.median([abs(compare(r)["optimizer_error"]) for r in records]))

    assert median_error("fused") < median_error("foreach") - 0.10


def test_published_torchtitan_rows_read_their_revisions_adamw():
    """torchtitan built AdamW with foreach=not fused, fused off, until 6e4988550 (#881, 2025-02-24):
    the 9dec370 (2024-12-26) and 1d5815c4 (2024-10-30) rows step foreach, the 2c8b5947 (2025-08) one
    the stack's (fused) default; the foreach rows' optimizer phase costs 80/28 of the fused one's."""
    from shardplan.validation import tokens
    from shardplan.validation.runs import RunQuery, read_runs

    queries = {r.row_id: r for r in read_runs(tokens.RUNS) if isinstance(r, RunQuery)}
    assert queries["TT001"].config.optimizer_impl == "foreach"
    assert queries["TT033"].config.optimizer_impl == "foreach"
    assert queries["AO004"].config.optimizer_impl is None  # the stack's default: fused
    assert any("#881" in a for a in queries["TT001"].assumed)
    tt = queries["TT001"]
    fused = tt.config.model_copy(update={"optimizer_impl": "fused"})
    from shardplan.planning.fit import step_timings
    slow, quick = (step_timings(tt.spec, tt.cluster, [c])[0]["optimizer_s"] for c in (tt.config, fused))
    assert slow == pytest.approx(quick * 80 / 28, rel=1e-6)
