"""``formulas/buffers.py``'s sizes from their cited defaults: one collective bucket (torch DDP
``bucket_cap_mb=25``; DeepSpeed ``reduce_bucket_size=5e8`` elements, its config docs) and the
bytes per element of the gradient reduction (FSDP ``MixedPrecision(reduce_dtype=...)``; "param"
reduces in the compute dtype)."""

from __future__ import annotations

from shardplan.formulas.buffers import bucket_bytes, reduce_dtype_bytes
from shardplan.inputs import strategy as st

MiB = 2**20


def test_bucket_bytes_are_the_engines_defaults():
    """torch DDP's 25 MiB bucket whatever the dtype (FSDP engines run ``ddp`` through it);
    DeepSpeed's 5e8 elements, so 1e9 bytes of bf16 and 2e9 of fp32."""
    for engine in ("fsdp2", "fsdp1"):
        assert bucket_bytes(st.ENGINES.index(engine), 2) == bucket_bytes(st.ENGINES.index(engine), 4) == 25 * MiB
    deepspeed = st.ENGINES.index("deepspeed")
    assert bucket_bytes(deepspeed, 2) == 500_000_000 * 2 and bucket_bytes(deepspeed, 4) == 500_000_000 * 4


def test_reduce_dtype_bytes():
    """fp32 4, bf16 and fp16 2; "param" the compute dtype's (2 under bf16 mixed precision, 4 under fp32)."""
    names = st.REDUCE_DTYPES
    assert [int(reduce_dtype_bytes(st.BF16_MIXED, names.index(r))) for r in ("fp32", "bf16", "fp16", "param")] == [4, 2, 2, 2]
    assert [int(reduce_dtype_bytes(st.FP32, names.index(r))) for r in ("fp32", "bf16", "fp16", "param")] == [4, 2, 2, 4]
