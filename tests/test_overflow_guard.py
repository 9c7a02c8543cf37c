"""Issue 12, int64 overflow: a result past int64 is an error for one query and an invalid row in a
sweep, never a verdict; numpy warnings never reach the user (docs/errors.md)."""

from tests.helpers import run_cli
from tests.test_bad_values import INT_RANGES, one_line_error

# --- int64 overflow: an error for one query, an invalid row in a sweep, never a verdict -----------------
BIG = ("fit", "llama-3.1-405b on 8xh100-sxm", "--strategy", "full_shard", "--seq-len", "16777216",
       "--micro-batch", "65536")  # in range, but ~2**66 bytes of activations: wrapped to a plausible 1.8e9 GiB before


def test_overflowing_fit_is_an_error_without_numpy_warnings(recwarn):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning reaching the user fails the test
        res = run_cli(*BIG)
    one_line_error(res, "seq_len=16777216", "int64")


def test_overflowing_sweep_rows_are_invalid_with_a_note(tmp_path):
    import warnings

    import pandas as pd

    out = tmp_path / "s.csv"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = run_cli("sweep", "-o", out, "--models", "llama-3.1-405b", "--seq-len", "1024,16777216",
                      "--micro-batch", "1,65536", "--strategies", "full_shard")
    assert res.exit_code == 0, res.output
    assert "beyond int64" in res.stderr
    df = pd.read_csv(out)
    huge = (df["seq_len"] == 16777216) & (df["micro_batch"] == 65536)
    assert not df.loc[huge, "valid"].any() and not df.loc[huge, "fits"].any()
    assert df.loc[~huge & (df["seq_len"] == 1024), "valid"].all()  # ordinary rows keep their answer


def test_no_guarded_result_is_negative_or_past_int64_in_range_extremes():
    """Every in-range extreme either evaluates to non-negative byte counts below INT64_SAFE or is refused."""
    import numpy as np

    from shardplan.formulas.columns import Columns, model_values
    from shardplan.formulas.memory import BREAKDOWN_TERMS, estimate_memory
    from shardplan.formulas.overflow import GUARDED_BYTES, bad_results, quiet_numpy
    from shardplan.inputs.models import get_model
    from shardplan.support.limits import INT64_SAFE
    from tests.helpers import DEFAULT_KNOBS

    for model in ("llama-3.1-405b", "gpt2", "mixtral-8x7b"):
        vals = {**model_values(get_model(model)), **DEFAULT_KNOBS}
        seq = np.array([1, 2**12, 2**18, INT_RANGES["seq_len"][1]])[:, None, None]
        mb = np.array([1, 2**8, INT_RANGES["micro_batch"][1]])[None, :, None]
        attention = np.array([0, 1])[None, None, :]
        c = Columns.build(**{**vals, "seq_len": seq, "micro_batch": mb, "attention": attention})
        with quiet_numpy():
            m = estimate_memory(c)
        ok = ~bad_results(c, m)
        for term in BREAKDOWN_TERMS + GUARDED_BYTES:
            v = np.broadcast_to(m[term], ok.shape)[ok]
            assert (v >= 0).all() and (v <= INT64_SAFE).all(), (model, term)
        assert ok.any() and not ok.all(), model  # the screen neither refuses everything nor nothing


def test_the_input_bound_covers_every_term():
    """overflow.input_scale_bytes's ASSUMPTION: no memory term exceeds it, over every built-in model
    and method and a grid of strategies, AC, attention, precision, offload and sizes (measured worst
    term/bound 0.55; host RAM per node sums a node's GPUs and is left to the result check)."""
    import numpy as np

    from shardplan.formulas.columns import Columns, model_values
    from shardplan.formulas.memory import BREAKDOWN_TERMS, estimate_memory
    from shardplan.formulas.overflow import GUARDED_BYTES, input_scale_bytes, quiet_numpy
    from shardplan.inputs import strategy as st
    from shardplan.inputs.models import model_profiles
    from tests.helpers import DEFAULT_KNOBS

    terms = [t for t in BREAKDOWN_TERMS + GUARDED_BYTES if t != "host_bytes_per_node"]
    worst = 0.0
    for spec in model_profiles():
        g = np.ix_(np.arange(len(st.STRATEGIES)), np.arange(len(st.AC_MODES)), np.arange(len(st.ATTENTIONS)),
                   np.array([1, 64]), np.array([1, 32768]), np.arange(len(st.PRECISIONS)), np.arange(len(st.OFFLOADS)),
                   np.arange(len(st.METHODS)))
        vals = {**model_values(spec, 64), **DEFAULT_KNOBS}
        vals.update(strategy=g[0], ac=g[1], attention=g[2], micro_batch=g[3], seq_len=g[4], precision=g[5],
                    offload=g[6], method=g[7])
        c = Columns.build(**vals)
        with quiet_numpy():
            m = estimate_memory(c)
        bound = input_scale_bytes(c)
        worst = max(worst, max(float(np.max(np.asarray(m[t], dtype=float) / bound)) for t in terms))
    assert worst < 1.0, worst


def test_the_screen_is_a_sixteenth_of_int64_safe():
    """``overflow.SCREEN_BYTES`` = INT64_SAFE / 16 (a peak sums up to ~16 moments' terms, each at
    most the input bound): Llama-3.1-405B at seq_len 2**20 × micro-batch 512 bounds its terms at
    ~0.75 of the screen (between INT64_SAFE/32 and /16), is evaluated and its peak is far below
    int64; twice the micro-batch passes the screen and is refused."""
    import numpy as np

    import shardplan
    from shardplan.formulas.columns import columns_for
    from shardplan.formulas.memory import estimate_memory
    from shardplan.formulas.overflow import bad_results, input_scale_bytes
    from shardplan.support.limits import INT64_SAFE

    spec, cluster = shardplan.resolve_model("llama-3.1-405b").spec, shardplan.parse_gpus("8xh100-sxm")
    rows = {}
    for micro in (512, 1024):
        c = columns_for(spec, cluster, shardplan.TrainingConfig(strategy="full_shard", seq_len=2**20, micro_batch=micro))
        m = estimate_memory(c)
        rows[micro] = (float(input_scale_bytes(c)), bool(np.any(bad_results(c, m))), int(m["peak_allocated_bytes"]))
    assert INT64_SAFE / 32 < rows[512][0] <= INT64_SAFE / 16 and not rows[512][1] and rows[512][2] < INT64_SAFE / 16
    assert rows[1024][0] > INT64_SAFE / 16 and rows[1024][1]
