"""Calibration harness: real torch FSDP runs, collective and matmul benchmarks, fitted overlays.

Nothing here imports torch at package import time; the submodules that need torch import it
themselves (install the ``calibrate`` extra). Submodules:

* ``tiny_model``  — small HF-faithful decoders built from a ModelSpec
* ``config``      — one calibration configuration (RunConfig) and grids of them
* ``runner``      — FSDP2 / FSDP1 training steps with per-category memory tracking
* ``launch``      — torchrun, spawned ranks, fake process group; isolation, timeouts, resume
* ``results``     — atomic JSONL/CSV/JSON writing
* ``collectives`` — collective benchmarks, nccl-tests parser, α-β fits
* ``compute``     — GEMM throughput per dtype, element-wise bandwidth, efficiency-curve fit
* ``overlay``     — calibrated hardware-profile overlay (write/load)
* ``env``         — GPU / driver / CUDA / NCCL / torch versions recorded with every measurement
* ``cli``         — the typer app mounted as ``shardplan calibrate``
* ``module_tree`` — a config of a model_type no family reader knows, built on the meta device
"""


def install_module_tree_reader() -> None:
    """Let ``inputs/hf_config.py`` read a config whose model_type no family reader knows from its
    module tree (``module_tree.py``, imported on first use: installing costs no import). The CLI
    (``cli.app.main``) and the public API (``shardplan.__getattr__``) call this."""
    from shardplan.support.extras import install_reader

    install_reader("module_tree", _read_module_tree)


def _read_module_tree(*args, **kwargs):
    from shardplan.calibrate.module_tree import spec_from_module_tree

    return spec_from_module_tree(*args, **kwargs)
