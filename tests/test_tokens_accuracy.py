"""Tokens/s against the development set's published runs (``shardplan.validation.tokens``): the
time half of docs/accuracy.md. Fails when the numbers get worse than committed.

Committed (this tree): 297 runs, median |error| 7.4 %, p90 22.7 %; compute-bound 7.0 % / 22.5 %,
communication-bound 13.4 % / 22.5 % (17 runs: an llm-foundry row whose Triton attention made its
compute longer left the regime; the per-stack AdamW kernel, ``optimizer_impl``, lowered the last two;
QLoRA's fp32 stream after ``prepare_model_for_kbit_training``, ``kbit_prep``, lowered the first two;
NCCL 2.26's LL cap across nodes, 39 GB/s at 2 nodes, ``comm.nccl_time_s``, slowed MF016's
collectives into the regime and lowered both, raising compute-bound's p90 22.9 → 23.0 % by its
leaving; Transformers' eager MoE expert loop, ``moe_dispatch_bytes_per_token``, lowered the
Mixtral rows: p90 23.4 → 22.7 %, compute-bound 23.0 → 22.5 %; the hf stack's eager host time lowered
them to 7.3 % / 22.2 %, compute-bound 22.0 %). Since every stated quantile is nearest rank
(``shardplan.support.quantiles``; numpy's linear interpolation before), the p90s are 22.5 % (all),
22.0 % (compute-bound) and 31.1 % (communication-bound: 17 runs, whose 16th-largest error is the
nearest-rank p90, where interpolation had stated 22.5 %). Session 4: rows whose rate needs more
than the GPU's peak left (``rate_above_peak``), the power limit and torchtitan's foreach AdamW
lowered them to 7.3 % / 21.8 %; then the fp32 stream of a prepared QLoRA was taken off the 2-GPU
FSDP rows, where TRL never prepares (``activations.kbit_fp32_stream``): truer and worse, 7.5 % /
22.0 % (compute-bound 7.1 % / 22.0 %), the cast had been hiding optimism in those rows. Session 5:
the RTX 4090's measured GEMM efficiency (its MAMF maximum, capped at 1) and the migration of paged
optimizer states the device cannot hold (``throughput.paged_migration_s``) moved TTN013 and TTN017
into a new offload-bound regime (2 runs): whole set unchanged (7.4 % / 21.9 % on its base), compute-bound
7.0 % / 21.9 → 21.8 %. Then element-wise bytes counted as each stack's code moves them (torch.compile's fusion, llm-foundry's
16-bit LayerNorm) and op-level SAC recomputing no attention made every FSDP source 10-20 %
optimistic; with the calibrated window factor, each source predicted at the
factor fitted on the other sources (``validation/window_factor.py``): 6.2 % / 19.8 %,
compute-bound 6.1 % / 19.6 %, communication-bound (15 runs) 8.8 % / 16.8 %. The
guard is those values plus 0.2 percentage points (float noise across numpy builds, not a
tolerance on the model): any change that makes a regime or the whole set worse fails here, and a
change that improves it should lower the constants. Session 7: FSDP1's rate limiter under PEFT's
per-adapter units (``formulas/fsdp1_limiter.py``, its price measured on an H100 fake-process-group
pair) prices the fms-acceleration 2-GPU rows: whole set 3.83 / 12.64 → 3.70 / 11.49 %,
compute-bound 3.48 / 12.38 → 3.50 / 11.38 %; communication-bound 6.27 / 10.33 → 6.88 / 10.98 %,
worse, and not through the term (none of its 15 rows is an FSDP1 hf run): the window factor fitted
for their sources (MF, TT) fell 1.189 → 1.181 once the FMA rows' priced exposure lowered their own
factors, and each of these optimistic rows gained 0.6 points (FMS's three did not move). Session 8:
the RTX 4090's measured GEMM efficiency without the schema's cap at 1 (1.080, its MAMF maximum:
``hardware.MAX_GEMM_EFFICIENCY``): whole set 3.70 / 11.49 → 3.63 / 11.38 %, compute-bound
3.50 / 11.38 → 3.48 / 11.17 %; communication-bound unchanged. Then the A100/H100 SXM profiles' MAMF
from the stas00/ml-engineering v2 table, which superseded the v1 rows they cited (A100 SXM 0.859 →
0.869, A100 PCIe 0.822 → 0.811, H100 SXM 0.801 → 0.803; tests/test_profile_mamf.py): the window
factor fitted mostly on A100 rows rose 1.181 → 1.189 (1.172 → 1.179), so every other GPU's rows got
slower: whole set 3.63 / 11.38 → 3.30 / 11.57 %, compute-bound 3.48 / 11.17 → 3.22 / 11.22 %,
communication-bound 6.88 / 10.98 → 6.21 / 10.27 %; the rtx4090 qlora class −9.7 → −10.2 %. The
default for unmeasured cards (the v2 table's median, 0.822 → 0.781) and the 4090's row at the
table's newer revision (1.080 → 1.082) move none of these numbers beyond rounding. torchtune's QLoRA priced
at torchao's NF4 dequantization (``nf4_torchao``; compiled: one fused kernel, no backward dequantization)
moves only the three torchtune QLoRA rows, none of these numbers at the fourth decimal. The issue's median (≤ 8 %) and p90 (≤ 25 %)
targets are met; "no class with |signed median| > 10 %" is NOT: the doc section lists the classes that miss it.
"""

from pathlib import Path

import pytest

from shardplan.validation import tokens

ROWS = tokens.dev_set_rows()
SLACK = 0.002
# The report's numbers at the commit that last moved them (session 8, the MAMF v2 rows of the A100 and
# H100 SXM profiles: module docstring): all 0.0330 / 0.1157, compute-bound 0.0322 / 0.1122,
# communication-bound 0.0621 / 0.1027 (median / p90), rounded up to the third decimal.
COMMITTED = {"all": (0.034, 0.116), "compute-bound": (0.033, 0.113), "communication-bound": (0.063, 0.103)}
DOC = Path(__file__).resolve().parents[1] / "docs" / "accuracy.md"


def test_whole_set_not_worse_than_committed():
    s = tokens.stats(r.error for r in ROWS)
    median, p90 = COMMITTED["all"]
    assert s["n"] >= 290
    assert s["median_abs"] <= median + SLACK and s["p90_abs"] <= p90 + SLACK


@pytest.mark.parametrize("regime", ["compute-bound", "communication-bound"])
def test_regime_not_worse_than_committed(regime):
    s = tokens.grouped(ROWS, lambda r: r.regime)[regime]
    median, p90 = COMMITTED[regime]
    assert s["median_abs"] <= median + SLACK and s["p90_abs"] <= p90 + SLACK


def test_doc_section_is_the_report():
    """docs/accuracy.md holds the report as generated: python -m shardplan.validation.tokens docs/accuracy.md"""
    text = DOC.read_text()
    section = text[text.index(tokens.BEGIN):text.index(tokens.END) + len(tokens.END)]
    assert section == tokens.report_markdown(ROWS)


def test_every_row_has_a_class_and_regime():
    assert {r.regime for r in ROWS} <= {"compute-bound", "communication-bound", "offload-bound"}
    assert all(r.klass.count(" × ") == 4 and r.published > 0 and r.predicted > 0 for r in ROWS)


def test_the_module_command_refuses_bad_input_in_one_line(tmp_path, capsys):
    # `python -m shardplan.validation.tokens [DOC]`: an option, two paths, a missing file or a file
    # without the markers is one line on stderr and exit 2; the file is left as it was
    no_markers = tmp_path / "plain.md"
    no_markers.write_text("no section here\n")
    for argv in (["--help"], ["a.md", "b.md"], [str(tmp_path / "missing.md")], [str(no_markers)]):
        assert tokens.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err and "\n" not in err and "Traceback" not in err
    assert no_markers.read_text() == "no section here\n"
