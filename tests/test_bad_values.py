"""Issue 12, values: every number entering from an option, a query word or the Python API is
range-checked once (shardplan/support/limits.py) and refused in one line with exit 2; no contradiction
passes silently; a result that overflows int64 is an error, never a verdict (docs/errors.md)."""

import re
from pathlib import Path

import pytest

from shardplan.inputs.config import TrainingConfig
from shardplan.support.errors import ShardplanError
from shardplan.support.limits import INT_RANGES
from tests.helpers import one_line_error, run_cli

Q = "llama-3.1-8b on 8xh100-sxm"
HUGE = "9" * 5000  # past Python's 4300-digit int() limit


# --- numbers out of range: options, query words, sweep lists ----------------------------------------
@pytest.mark.parametrize("argv, field", [
    (("fit", Q, "--strategy", "full_shard", "--seq-len", "1099511627776"), "seq_len"),  # 2**40: wrapped to FITS
    (("fit", Q, "--strategy", "full_shard", "--seq-len", str(2**70)), "seq_len"),      # OverflowError before
    (("fit", Q, "--strategy", "full_shard", "--seq-len", HUGE), "--seq-len"),  # click's own one line
    (("fit", Q + " batch 99999999999999999999999"), "micro_batch"),
    (("fit", Q + " seq " + HUGE), "seq_len"),
    (("fit", Q, "--strategy", "full_shard", "--grad-accum", "99999999999999999"), "grad_accum"),
    (("fit", Q, "--strategy", "full_shard", "--ce-chunks", "99999999999999"), "ce_chunks"),
    (("fit", Q, "--strategy", "full_shard", "--method", "lora", "--lora-rank", "99999999999"), "lora_rank"),
    (("fit", Q, "--strategy", "full_shard", "--micro-batch", "-3"), "micro_batch"),
    (("fit", Q, "--strategy", "full_shard", "--host-ram", "99999999999999999999999999TB"), "host_ram"),
    (("fit", Q, "--strategy", "full_shard", "--host-ram", HUGE + "GB"), "host_ram"),
    (("fit", Q, "--strategy", "full_shard", "--global-batch-tokens", "99999999999999999999999999T"),
     "global_batch_tokens"),
    (("plan", "llama-3.1-8b", "--gpus", "8xh100-sxm", "--top", "99999999999999999999999"), "top"),
    (("plan", "llama-3.1-8b", "--gpus", "8xh100-sxm", "--price-per-gpu-hour", "nan"), "price_per_gpu_hour"),
    (("plan", "llama-3.1-8b", "--gpus", "8xh100-sxm", "--price-per-gpu-hour", "inf"), "price_per_gpu_hour"),
    (("plan", "llama-3.1-8b", "--gpus", "8xh100-sxm", "--price-per-gpu-hour", "-1"), "price_per_gpu_hour"),
    (("plan", "llama-3.1-8b", "--gpus", "8xh100-sxm", "--global-batch", "99999999999999999999999"), "global_batch"),
    (("plan", "llama-3.1-8b", "--gpus", "8xh100-sxm", "--train-tokens", "99999999999999999999999T"), "train_tokens"),
    (("plan", "llama-3.1-8b", "--gpus", "8xh100-sxm", "--seq-len", "1099511627776"), "seq_len"),
])
def test_out_of_range_numbers_are_one_line_errors(argv, field):
    one_line_error(run_cli(*argv), field if field.startswith("--") else field + "=")


@pytest.mark.parametrize("option, value", [
    ("--seq-len", "1099511627776"), ("--micro-batch", "99999999999999999999999"), ("--lora-rank", "0"),
    ("--gpu-counts", HUGE), ("--seq-len", "1-99999999999"), ("--grad-accum", "1.5"),
])
def test_sweep_lists_are_range_checked(tmp_path, option, value):
    out = tmp_path / "s.csv"
    one_line_error(run_cli("sweep", "-o", out, option, value), option[2:].replace("-", "_"))
    assert not out.exists()


def test_sweep_range_longer_than_the_list_bound_is_refused(tmp_path):
    one_line_error(run_cli("sweep", "-o", tmp_path / "s.csv", "--seq-len", "1-16777216"), "seq_len",
                   "a sweep axis holds at most")


@pytest.mark.parametrize("field, value", [("seq_len", 2**48), ("micro_batch", 10**30), ("lora_rank", float("nan")),
                                          ("grad_accum", 1.5), ("ce_chunks", -1), ("ac_every_k", True)])
def test_python_api_refuses_out_of_range_with_the_one_error_type(field, value):
    with pytest.raises(ShardplanError, match=re.escape(field + "=")):
        TrainingConfig(**{field: value})


def test_ranges_in_range_still_accepted():
    lo_hi = {name: INT_RANGES[name] for name in ("seq_len", "micro_batch", "grad_accum", "lora_rank", "ce_chunks")}
    assert TrainingConfig(**{k: hi for k, (lo, hi) in lo_hi.items()}).seq_len == INT_RANGES["seq_len"][1]
    assert TrainingConfig(seq_len="2048").seq_len == 2048  # digit strings, as pydantic accepted before


def test_docs_errors_lists_every_range_as_limits_states_it():
    """docs/errors.md's range tables agree with limits.INT_RANGES / FLOAT_RANGES, row by row."""
    from shardplan.support.limits import FLOAT_RANGES

    text = (Path(__file__).parent.parent / "docs" / "errors.md").read_text()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| [^|]+ \| ([^|]+) \|$", text, re.M)}
    assert set(INT_RANGES) | set(FLOAT_RANGES) <= set(rows), sorted(set(INT_RANGES) | set(FLOAT_RANGES) - set(rows))

    def number(text):
        text = text.strip().replace(",", "")
        powers = re.fullmatch(r"(\d+)\^(\d+)", text)
        return int(powers.group(1)) ** int(powers.group(2)) if powers else float(text)

    for name, (lo, hi) in {**INT_RANGES, **FLOAT_RANGES}.items():
        lo_text, hi_text = re.match(r"\s*(\S+) – (\S+)", rows[name]).groups()
        assert (number(lo_text), number(hi_text)) == (lo, hi), (name, rows[name])


def test_docs_errors_lists_every_contradiction_rule():
    from shardplan.inputs.contradictions import RULES

    text = (Path(__file__).parent.parent / "docs" / "errors.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("| `") and ("| error |" in line or "| note |" in line)]
    # the offload rule's three cases are three rows; every (field, kind) of the table is a rule and back
    assert {(line.split("`")[1], line.split("|")[2].strip()) for line in table} == {(r.field, r.kind) for r in RULES}


@pytest.mark.parametrize("kwargs, field", [(dict(host_ram=2**80), "host_ram"), (dict(chunk_size=float("nan")), "chunk_size"),
                                           (dict(seq_len=[2**70]), "seq_len"), (dict(ce_chunks=[-1]), "ce_chunks"),
                                           (dict(host_ram="0.0000000001GB"), "host_ram")])
def test_python_sweep_refuses_out_of_range_with_the_one_error_type(kwargs, field):
    import shardplan

    with pytest.raises(ShardplanError, match=re.escape(field + "=")):
        shardplan.sweep(**kwargs)


@pytest.mark.parametrize("argv, named", [
    (("fit", Q, *("--strategy", "full_shard", "--seq-len", "1", "--global-batch-tokens", "10000000000")),
     ("global_batch_tokens=", "accumulation steps")),  # grad_accum=1,250,000,000 named a field the user never gave
    (("plan", Q, "--seq-len", "1", "--global-batch-tokens", "1000000000000000000"), ("global_batch_tokens=", "per GPU")),
])
def test_a_batch_no_accumulation_can_reach_is_refused_by_its_own_name(argv, named):
    one_line_error(run_cli(*argv), *named)


def test_query_numbers_take_their_fields_range():
    from shardplan.inputs.query import parse_query

    assert parse_query("8B on 8xh100-sxm ce-chunks 0").options["ce_chunks"] == 0  # 0 = off, as --ce-chunks 0
    with pytest.raises(ShardplanError, match="seq_len='0'"):
        parse_query("8B on 8xh100-sxm seq 0")
    with pytest.raises(ShardplanError, match=re.escape("out of range [1, 65,536]")):
        parse_query("8B on 8xh100-sxm rank 100k")
