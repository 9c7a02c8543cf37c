"""Issue 12, contradictions: settings the frameworks refuse (or would silently ignore) are one-line
errors; settings they run with a consequence get a note (shardplan/inputs/contradictions.py, docs/errors.md)."""

import pytest

from shardplan.inputs.contradictions import RULES
from tests.helpers import run_cli
from tests.test_bad_values import Q, one_line_error

FS = ("--strategy", "full_shard")


@pytest.mark.parametrize("argv, named", [
    (("fit", Q, "--strategy", "ddp", "--offload", "all"), ("offload=", "DistributedDataParallel")),
    (("fit", Q, "--strategy", "zero2", "--engine", "deepspeed", "--offload", "all"), ("offload=", "stage 3")),
    (("fit", Q, *FS, "--offload", "optimizer"), ("offload=", "CPUOffloadPolicy")),
    (("fit", Q, *FS, "--lora-rank", "64"), ("lora_rank=64", "method full")),
    (("fit", Q + " rank 64", *FS), ("lora_rank=64",)),
    (("fit", Q, *FS, "--lora-targets", "qv"), ("lora_targets=",)),
    (("fit", Q, *FS, "--ac-every-k", "3"), ("ac_every_k=3", "--ac every-k")),
    (("fit", Q, *FS, "--shard-group-size", "4"), ("shard_group_size=4", "hybrid_shard")),
    (("fit", Q, *FS, "--quant-format", "gptq"), ("quant_format=", "qlora")),
    (("plan", "llama-3.1-8b", "--gpus", "8xh100-sxm", "--method", "full", "--lora-rank", "64"), ("lora_rank=64",)),
    (("fit", "llama-3.1-8b on 1xh100-sxm", "--stack", "torchtune", "--grad-accum", "4"),  # its single-GPU default
     ("optimizer_in_backward=True", "Gradient accumulation is not supported")),
    (("fit", Q, *FS, "--optimizer-in-backward", "--offload", "all"), ("optimizer_in_backward=True", "offload")),
])
def test_contradictions_are_one_line_errors(argv, named):
    one_line_error(run_cli(*argv), *named)


@pytest.mark.parametrize("argv, note", [
    (("fit", Q, "--strategy", "hybrid_shard"), "torch runs it as full_shard"),
    (("fit", Q, *FS, "--method", "lora", "--lora-rank", "8192"), "above the hidden size 4096"),
])
def test_framework_consequences_are_notes(argv, note):
    res = run_cli(*argv)
    assert res.exit_code == 0, res.output
    assert note in " ".join(res.output.split()), res.output


@pytest.mark.parametrize("argv", [
    ("fit", Q, *FS, "--method", "qlora", "--precision", "fp32"),  # bnb_4bit_compute_dtype=float32: bitsandbytes' default
    ("fit", Q, "--offload", "all"),                              # fit over every strategy: ddp's row is shown invalid
    ("fit", Q, *FS, "--ac", "every-k", "--ac-every-k", "3"),
    ("fit", Q + " nf4", *FS),                                     # nf4 implies qlora
    ("fit", "llama-3.1-8b on 1xh100-sxm", "--stack", "torchtune", "--grad-accum", "4", "--no-optimizer-in-backward"),
    ("plan", "llama-3.1-8b", "--gpus", "8xh100-sxm", "--lora-rank", "64"),  # methods searched: the rank is for LoRA rows
])
def test_consistent_settings_still_run(argv):
    res = run_cli(*argv)
    assert res.exit_code == 0, res.output


def test_every_rule_has_a_reason_and_a_kind():
    assert {r.kind for r in RULES} == {"error", "note"}
    assert all(r.field for r in RULES)
