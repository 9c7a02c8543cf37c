"""The blocks a whole-weight NF4 quantization leaves in the CUDA caching allocator, replayed.

torchao up to 0.1 (``torchao/dtypes/nf4tensor.py`` at v0.1, 2024-04-04; chunked by "perform in
chunks", 6081796bc, 2024-05-01, released in 0.2.0) quantizes a weight of n elements in one piece:
``NF4Tensor.quantize_tensor_nearest`` computes ``(value.unsqueeze(-1) - nf4).abs()`` over all n
values and the 16 NF4 codes, two n×16 bf16 tensors (64·n bytes) alive at once, then
``diff.min(dim=-1).indices`` (int64, 8·n). torchtune's single-device recipes of 2024 build the
model on the GPU (``with self._device: model = config.instantiate(cfg_model)``: every
``FrozenNF4Linear`` creates its bf16 weight and calls ``to_nf4``) and then ``load_state_dict`` it
(torchtune ``_register_nf4_dispatch_ops.py`` ``inplace_copy``: ``to_nf4(src.to(device))`` for each
NF4 weight), so every block Linear is quantized twice on the GPU. The recipes then reset the peak
statistics (``utils.memory_stats_log`` / ``get_memory_stats``: ``torch.cuda.reset_peak_memory_stats``)
but never empty the cache: ``max_memory_reserved`` during training starts from what loading left
reserved (torchtune recipes/lora_finetune_single_device.py at 412a4ecd7, 20747cd87, 0217d44c2).

What stays reserved is a property of the allocator's policy over that sequence of requests, so it
is replayed here (torch ``c10/cuda/CUDACachingAllocator.cpp``): sizes rounded up to 512 B; requests
up to 1 MiB from 2 MiB segments of the small pool, larger ones from the large pool (a new segment
of 20 MiB for requests under 10 MiB, else the request rounded up to 2 MiB); the best fit is the
smallest free block of the pool that holds the request; a large-pool block is split when more than
1 MiB would remain (a small-pool one when 512 B would); a freed block merges with free neighbours of
its segment; segments are never released (no ``empty_cache``, no OOM retry). ASSUMPTIONS: one
stream; the small n/64-sized scaler tensors are counted with their sizes but not their exact
lifetimes; the model is built in module order (embedding, per block q, k, v, output projection,
w1, w2, w3 with their rank-8 bf16 adapters and two norms, final norm, output) and loaded in the same
order. tests/test_nf4_load_cache.py checks the replay's policy and varies h, ffn and depth.
"""

from __future__ import annotations

import bisect
import itertools
from functools import lru_cache

import numpy as np

from shardplan.inputs import strategy as st

MIB = 1 << 20
NF4_CODES = 16      # quantize_tensor_nearest compares every value with the 16 NF4 codes (bf16)
BLOCK_SIZE = 64     # to_nf4 block_size: one absmax scaler per 64 values
ADAPTER_RANK = 8    # torchtune's 7B QLoRA config (lora_rank: 8), bf16 adapters


class CachingAllocator:
    """The pools of torch's caching allocator, as far as reserved bytes go (module docstring)."""

    def __init__(self):
        self.reserved = self.allocated = 0
        self._free = {True: [], False: []}     # pool (small?) -> sorted [(size, block id)]
        self._blocks: dict[int, list] = {}     # id -> [size, free, prev id, next id, small]
        self._ids = itertools.count()

    def malloc(self, nbytes: int) -> int:
        size = max(512, -(-nbytes // 512) * 512)
        small = size <= MIB
        free = self._free[small]
        at = bisect.bisect_left(free, (size, -1))
        if at == len(free):
            segment = 2 * MIB if small else 20 * MIB if size < 10 * MIB else -(-size // (2 * MIB)) * 2 * MIB
            self.reserved += segment
            block = self._new(segment, small, None, None)
        else:
            block = free.pop(at)[1]
        entry = self._blocks[block]
        rest = entry[0] - size
        if rest >= 512 if small else rest > MIB:
            tail = self._new(rest, small, block, entry[3])
            if entry[3] is not None:
                self._blocks[entry[3]][2] = tail
            entry[0], entry[3] = size, tail
            bisect.insort(free, (rest, tail))
        entry[1] = False
        self.allocated += entry[0]
        return block

    def free(self, block: int) -> None:
        entry = self._blocks[block]
        entry[1] = True
        self.allocated -= entry[0]
        for neighbour in (entry[3], entry[2]):  # next, then previous
            other = self._blocks.get(neighbour) if neighbour is not None else None
            if other is not None and other[1]:
                self._free[entry[4]].remove((other[0], neighbour))
                block, entry = self._merge(block, neighbour)
        bisect.insort(self._free[entry[4]], (entry[0], block))

    def _new(self, size, small, prev, nxt) -> int:
        block = next(self._ids)
        self._blocks[block] = [size, True, prev, nxt, small]
        return block

    def _merge(self, a: int, b: int) -> tuple[int, list]:
        first, second = (a, b) if self._blocks[a][3] == b else (b, a)
        head, tail = self._blocks[first], self._blocks.pop(second)
        head[0] += tail[0]
        head[3] = tail[3]
        if tail[3] is not None:
            self._blocks[tail[3]][2] = first
        return first, head


def to_nf4(pool: CachingAllocator, n: int) -> list[int]:
    """torchao v0.1 ``to_nf4`` of an n-element bf16 weight on the GPU, request by request; returns
    the blocks it keeps (the packed codes, n/2 B, and the int8 block scalers, n/64 B)."""
    pool.free(pool.malloc(2 * n))                              # double_quantize_scalers: absmax's abs()
    scalers = [pool.malloc(2 * n // BLOCK_SIZE) for _ in range(3)]
    kept_scalers = pool.malloc(n // BLOCK_SIZE)
    for block in scalers:
        pool.free(block)
    pool.free(pool.malloc(2 * n))                              # convert_to_norm_float_weight: abs()
    scaled = pool.malloc(2 * n)                                # blocks / scales
    diff = pool.malloc(2 * NF4_CODES * n)                      # value.unsqueeze(-1) - nf4
    absolute = pool.malloc(2 * NF4_CODES * n)                  # .abs()
    pool.free(diff)
    values, indices = pool.malloc(2 * n), pool.malloc(8 * n)   # .min(dim=-1)
    pool.free(absolute)
    pool.free(values)
    shifted = pool.malloc(4 * n)                               # indices[::2] << 4 (int64)
    packed = pool.malloc(4 * n)                                # | indices[1::2]
    pool.free(shifted)
    codes = pool.malloc(n // 2)                                # .to(torch.uint8)
    for block in (packed, indices, scaled):
        pool.free(block)
    return [codes, kept_scalers]


def _block_linears(h: int, q: int, kv: int, ffn: int) -> list[tuple[int, int]]:
    """(in, out) of a Llama block's Linears in module order: q, k, v, output, w1, w2, w3."""
    return [(h, q), (h, kv), (h, kv), (q, h), (h, ffn), (ffn, h), (h, ffn)]


@lru_cache(maxsize=512)
def load_cached_bytes(h: int, q: int, kv: int, ffn: int, layers: int, vocab: int) -> int:
    """Bytes the allocator holds cached (reserved, not allocated) once a torchtune 2024 QLoRA model
    is built and loaded on one GPU with whole-weight quantization (module docstring)."""
    pool = CachingAllocator()
    pool.malloc(2 * vocab * h)                                  # tok_embeddings
    blocks = []
    for _ in range(layers):
        kept = []
        for fan_in, fan_out in _block_linears(h, q, kv, ffn):
            weight = pool.malloc(2 * fan_in * fan_out)          # FrozenNF4Linear's bf16 weight
            kept.append(to_nf4(pool, fan_in * fan_out))
            pool.free(weight)
            pool.malloc(2 * ADAPTER_RANK * fan_in)
            pool.malloc(2 * ADAPTER_RANK * fan_out)
        pool.malloc(2 * h)
        pool.malloc(2 * h)
        blocks.append(kept)
    pool.malloc(2 * h)                                          # final norm
    pool.malloc(2 * vocab * h)                                  # output projection
    for kept in blocks:                                         # load_state_dict: quantized again
        for i, (fan_in, fan_out) in enumerate(_block_linears(h, q, kv, ffn)):
            source = pool.malloc(2 * fan_in * fan_out)          # the checkpoint tensor moved to the GPU
            new = to_nf4(pool, fan_in * fan_out)
            pool.free(source)
            for block in kept[i]:
                pool.free(block)
            kept[i] = new
    return pool.reserved - pool.allocated


def nf4_load_cached_bytes(c):
    """Per row: the cached bytes after loading where ``nf4_whole_quantize`` (one GPU, QLoRA), else 0.
    Replayed once per distinct shape (``load_cached_bytes`` is cached)."""
    on = (np.asarray(c.nf4_whole_quantize, dtype=bool) & (np.asarray(c.method) == st.QLORA)
          & (np.asarray(c.world_size) == 1))
    dims = (c.hidden_size, c.q_width, c.kv_width, c.mlp_width, c.num_layers, c.vocab_size)
    shape = np.broadcast_shapes(np.shape(on), *(np.shape(d) for d in dims))
    flat = [np.broadcast_to(np.asarray(d), shape).ravel() for d in dims]
    out = np.zeros(int(np.prod(shape)), dtype=np.int64)
    for i in np.flatnonzero(np.broadcast_to(on, shape).ravel()):
        out[i] = load_cached_bytes(*(int(d[i]) for d in flat))
    return out.reshape(shape)
