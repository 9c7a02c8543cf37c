"""``formulas/overheads.py``: NCCL's communicator buffers from NCCL's documented defaults (per
channel and ring neighbour, one buffer per protocol: Simple ``NCCL_BUFFSIZE`` 4 MiB, LL128
4.5 MiB, LL 256 KiB) and a link profile's channel count."""

from __future__ import annotations

from shardplan.formulas.overheads import HOST_PROCESS_BYTES, NCCL_BYTES_PER_CHANNEL, nccl_bytes_for_link
from shardplan.inputs.hardware import get_link

KiB, MiB = 2**10, 2**20


def test_nccl_buffers_per_channel_and_per_link():
    assert NCCL_BYTES_PER_CHANNEL == 2 * (4 * MiB + 4608 * KiB + 256 * KiB) == 18_350_080
    channels = get_link("nvlink4").nccl_channels
    assert channels == 32  # NVLink4's usual NCCL channel count, as nvlink4.json cites it
    assert nccl_bytes_for_link("nvlink4") == 32 * 18_350_080 == 560 * MiB


def test_host_process_bytes():
    assert HOST_PROCESS_BYTES == 3 * 2**30
