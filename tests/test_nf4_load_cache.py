"""The replay of the caching allocator over torchao <= 0.1's whole-weight NF4 loads
(``formulas/nf4_load_cache.py``): the allocator's policy as CUDACachingAllocator.cpp states it,
what a load leaves cached as the shapes vary, and what it does to a row's reserved peak."""

from __future__ import annotations

import pytest

from shardplan.formulas.nf4_load_cache import MIB, CachingAllocator, load_cached_bytes, nf4_load_cached_bytes, to_nf4
from shardplan.inputs import strategy as st
from tests.helpers import columns


def test_segments_rounding_and_pools():
    pool = CachingAllocator()
    pool.malloc(1000)                 # small pool: a 2 MiB segment, 1024 B allocated
    assert (pool.reserved, pool.allocated) == (2 * MIB, 1024)
    pool.malloc(5 * MIB)              # 1..10 MiB: a 20 MiB segment
    pool.malloc(11 * MIB)             # the large pool is shared: the 20 MiB segment's free 15 MiB
    assert pool.reserved == 2 * MIB + 20 * MIB
    pool.malloc(16 * MIB + 1)         # nothing holds it: its own segment, rounded up to 2 MiB
    assert pool.reserved == 2 * MIB + 20 * MIB + 18 * MIB


def test_best_fit_reuses_split_and_merged_blocks():
    pool = CachingAllocator()
    a, b = pool.malloc(100 * MIB), pool.malloc(40 * MIB)
    pool.free(a)
    pool.free(b)
    reserved = pool.reserved
    pool.malloc(30 * MIB)             # best fit: the 40 MiB block, split (10 MiB left > 1 MiB)
    pool.malloc(90 * MIB)             # the 100 MiB block still holds it
    assert pool.reserved == reserved
    pool.malloc(11 * MIB)             # 10 + 10 MiB free remain, in two places: a new segment
    assert pool.reserved == reserved + 12 * MIB
    pool2 = CachingAllocator()
    x, y = pool2.malloc(20 * MIB), pool2.malloc(20 * MIB)
    pool2.free(x)
    pool2.free(y)                     # different segments: no merge across them
    pool2.malloc(30 * MIB)
    assert pool2.reserved == 20 * MIB + 20 * MIB + 30 * MIB


def test_one_quantization_peaks_at_the_two_n_by_16_tensors():
    # (value - nf4).abs(): 2 x 32·n bytes alive with the bf16 scaled copy (2·n) beside the weight
    n = 1 << 24
    pool = CachingAllocator()
    weight = pool.malloc(2 * n)
    to_nf4(pool, n)
    pool.free(weight)
    assert pool.allocated == sum(s for s in (n // 2, n // 64))
    assert pool.reserved >= 2 * n + 2 * n + 64 * n


@pytest.mark.parametrize("h", [2048, 4096])
def test_what_a_load_leaves_cached_grows_with_the_largest_weight(h):
    # at least the two n x 16 tensors of the largest (MLP) weight stay reserved; wider MLPs, more
    cached = [load_cached_bytes(h, h, h, ffn, 4, 32000) for ffn in (2 * h, 3 * h, 4 * h)]
    assert cached == sorted(cached) and cached[0] < cached[-1]
    for ffn, c in zip((2 * h, 3 * h, 4 * h), cached):
        assert c >= 64 * h * ffn


def test_the_knob_floors_the_reserved_peak_of_a_one_gpu_qlora_only():
    base = dict(method=st.QLORA, strategy=st.SINGLE, world_size=1, micro_batch=2, seq_len=512)
    on, off = columns("llama-2-7b", nf4_whole_quantize=True, **base), columns("llama-2-7b", **base)
    assert int(nf4_load_cached_bytes(on)) == load_cached_bytes(4096, 4096, 4096, 11008, 32, 32000)
    assert int(nf4_load_cached_bytes(off)) == 0
    assert int(nf4_load_cached_bytes(columns("llama-2-7b", nf4_whole_quantize=True, method=st.LORA))) == 0
