"""Shared test helpers: build Columns from a model name and knob overrides."""

from shardplan.formulas.columns import Columns, model_values
from shardplan.inputs import strategy as st
from shardplan.inputs.models import get_model
from shardplan.inputs.units import GiB

DEFAULT_KNOBS = dict(
    world_size=8, gpus_per_node=8, gpu_memory_bytes=80 * GiB, host_ram_bytes_per_node=2048 * GiB,
    nccl_buffer_bytes=0, strategy=st.FULL_SHARD, engine=st.FSDP2, precision=st.BF16_MIXED, optimizer=st.ADAMW,
    ac=st.AC_NONE, ac_every_k=2, offload=st.OFFLOAD_NONE, method=st.FULL, micro_batch=1, seq_len=2048,
    grad_accum=1, shard_group_size=8, attention=st.SDPA, dropout=False,
    reduce_dtype=None,  # None: st.default_reduce_dtype(precision, engine), resolved by Columns.build
)


def columns(model="llama-2-7b", **overrides):
    values = {**model_values(get_model(model)), **DEFAULT_KNOBS}
    values.update(overrides)
    return Columns.build(**values)


class CliResult:
    """What ``shardplan ARGS`` did: exit code, stdout, stderr, and both together (``output``)."""

    def __init__(self, exit_code: int, stdout: str, stderr: str):
        self.exit_code, self.stdout, self.stderr = exit_code, stdout, stderr
        self.output = stdout + stderr


def run_cli(*argv: str) -> CliResult:
    """Run ``shardplan.cli.app.main`` in this process the way the ``shardplan`` script does (errors become
    one stderr line and exit code 2), capturing what it prints."""
    import contextlib
    import io

    from shardplan.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return CliResult(code, out.getvalue(), err.getvalue())


def one_line_error(res: CliResult, *named: str) -> str:
    """Exit 2, no traceback, exactly one 'shardplan: error:' line on stderr naming each of ``named``;
    the line."""
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("shardplan: error: "), res.stderr
    for text in named:
        assert text in lines[0], (text, lines[0])
    return lines[0]


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped (a killed writer's temp file names it)."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid
