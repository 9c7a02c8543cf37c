"""Memory outside the tensors a model owns: NCCL buffers, the CUDA context, host RAM.

The caching allocator's own slack (reserved − allocated) and the measured CUDA context are in
``allocator.py`` (H100 measurements, data/calibration/gpu/). The defaults here are stated
assumptions, each cited:

* NCCL communicator buffers: per channel and per ring neighbour (2), one buffer per protocol —
  Simple ``NCCL_BUFFSIZE`` = 4 MiB, LL128 ≈ 4.5 MiB, LL 256 KiB (NCCL environment-variable docs)
  ≈ 8.75 MiB; channels depend on the fabric: the link profile's ``nccl_channels`` (ASSUMPTION,
  NCCL's usual choice: 2–4 over PCIe, 16 over NVLink3, 32 over NVLink4/5; cited in each JSON).
  0 on a single GPU.
* Host RAM per rank for the Python process, torch and CUDA libraries: ~3 GiB RSS.
"""

from __future__ import annotations

import numpy as np

from shardplan.inputs.units import GiB, KiB, MiB

NCCL_BYTES_PER_CHANNEL = 2 * (4 * MiB + 4608 * KiB + 256 * KiB)


def nccl_bytes_for_link(link) -> int:
    """NCCL buffer bytes for the intra-node fabric a communicator rings over: the link profile's
    ``nccl_channels`` × ``NCCL_BYTES_PER_CHANNEL``. ``link`` is a ``LinkProfile`` or a link name
    (resolved with ``hardware.get_link``)."""
    if isinstance(link, str):
        from shardplan.inputs.hardware import get_link

        link = get_link(link)
    return link.nccl_channels * NCCL_BYTES_PER_CHANNEL


HOST_PROCESS_BYTES = 3 * GiB


def non_torch_device_bytes(nccl_buffer_bytes, cuda_context_bytes):
    """Device memory the caching allocator does not see: CUDA context (cuBLAS handles, lazily
    loaded kernels; ``allocator.json``) and NCCL buffers."""
    return cuda_context_bytes + np.asarray(nccl_buffer_bytes)
