"""Shared test helpers: build Columns from a model name and knob overrides."""

from shardplan import strategy as st
from shardplan.config import Columns, model_values
from shardplan.models import get_model
from shardplan.units import GiB

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
