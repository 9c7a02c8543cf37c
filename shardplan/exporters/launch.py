"""torchrun launch lines (single node, multi node with c10d rendezvous) and a SLURM batch script.

Flags as ``torch.distributed.run`` spells them (``--nnodes``, ``--nproc-per-node``,
``--rdzv-backend c10d``, ``--rdzv-endpoint HOST:PORT``, ``--rdzv-id``); one ``srun`` task per
node runs torchrun, which starts the per-GPU workers (torchrun docs, "Launching on SLURM").
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from shardplan.exporters.spec import PlanSpec

PORT = 29500


def launcher_prefix(spec: PlanSpec) -> str:
    """The torchrun part of a launch line for this plan (single-node standalone or multi-node)."""
    if spec.nodes == 1:
        return f"torchrun --standalone --nproc-per-node {spec.gpus_per_node}"
    return (f"torchrun --nnodes {spec.nodes} --nproc-per-node {spec.gpus_per_node} --rdzv-backend c10d "
            f"--rdzv-endpoint $MASTER_ADDR:{PORT} --rdzv-id $JOB_ID")


def torchrun_lines(spec: PlanSpec) -> str:
    header = spec.comment_header()
    env = ""
    if spec.nodes > 1:
        env = ("# run on every node; MASTER_ADDR = node 0's address, JOB_ID = any id shared by the nodes\n")
    torchrun = launcher_prefix(spec) + " train.py"
    slurm = "\n".join([
        "#!/bin/bash",
        "#SBATCH --job-name=shardplan",
        f"#SBATCH --nodes={spec.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={spec.gpus_per_node}",
        "#SBATCH --exclusive",
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"srun torchrun --nnodes {spec.nodes} --nproc-per-node {spec.gpus_per_node} --rdzv-backend c10d "
        f"--rdzv-endpoint $MASTER_ADDR:{PORT} --rdzv-id $SLURM_JOB_ID train.py",
    ])
    slurm_block = "\n".join("# " + line if line else "#" for line in slurm.splitlines())
    return (f"{header}\n{env}{torchrun}\n\n# SLURM (sbatch this; one torchrun per node, {spec.gpus_per_node} "
            f"workers each):\n{slurm_block}\n")


def torchrun_argv(line: str) -> list[str]:
    """torchrun's own arguments from a launch line (after ``torchrun``/``srun torchrun``)."""
    tokens = shlex.split(line)
    return tokens[tokens.index("torchrun") + 1:]


def read_back(text: str) -> dict[str, Any]:
    """nodes, GPUs per node and world size from the torchrun line and the SLURM script."""
    line = next(l for l in text.splitlines() if l.startswith("torchrun "))
    argv = torchrun_argv(line)
    value = dict(zip(argv, argv[1:]))
    nodes = int(value.get("--nnodes", 1))
    per_node = int(value["--nproc-per-node"])
    slurm_nodes = int(re.search(r"#SBATCH --nodes=(\d+)", text).group(1))
    slurm_gpus = int(re.search(r"#SBATCH --gpus-per-node=(\d+)", text).group(1))
    return {"nodes": nodes, "gpus_per_node": per_node, "world_size": nodes * per_node,
            "slurm_nodes": slurm_nodes, "slurm_gpus_per_node": slurm_gpus}
