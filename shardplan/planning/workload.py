"""The workload a time estimate needs: the global batch as sequences per GPU (micro-batch ×
gradient accumulation), shared by ``plan`` (the search) and ``fit --global-batch-tokens``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from shardplan.support.errors import ShardplanError


class Workload(BaseModel):
    model_config = ConfigDict(frozen=True)

    seq_len: int
    global_batch_tokens: int
    global_batch_sequences: int
    sequences_per_gpu: int
    requested_tokens: int
    notes: list[str] = []

    def accumulation(self, micro_batch: int) -> int:
        """Gradient accumulation steps for ``micro_batch`` sequences per step: the sequences per GPU
        divided by it, or a one-line error when it does not divide them."""
        if self.sequences_per_gpu % micro_batch:
            raise ShardplanError("micro_batch", micro_batch,
                                 f"must divide the {self.sequences_per_gpu} sequences per GPU of the global batch")
        return self.sequences_per_gpu // micro_batch


def resolve_workload(seq_len: int, world_size: int, global_batch_tokens: int | None = None,
                     global_batch_sequences: int | None = None, context: int | None = None) -> Workload:
    """Global batch = micro-batch × grad accumulation × data-parallel degree × seq_len. A batch that
    is not a whole number of sequences per GPU is rounded to the nearest one (at least one), and
    the adjustment is explained; non-positive inputs are one-line errors."""
    from shardplan.support.limits import MAX_GPUS, MAX_POSITIONS, bounded_int, checked_int

    world_size = bounded_int(world_size, "gpus", 1, MAX_GPUS)
    seq_len = checked_int("seq_len", seq_len)
    global_batch_tokens = None if global_batch_tokens is None else checked_int("global_batch_tokens", global_batch_tokens)
    global_batch_sequences = (None if global_batch_sequences is None
                              else checked_int("global_batch", global_batch_sequences))
    context = None if context is None else bounded_int(context, "context", 1, MAX_POSITIONS)
    notes: list[str] = []
    if context is not None and seq_len > context:
        notes.append(f"seq_len {seq_len} exceeds the model's context of {context}: planned as asked "
                     f"(needs RoPE scaling or continued pre-training at that length)")
    if global_batch_tokens is None and global_batch_sequences is None:
        global_batch_sequences = world_size
        notes.append(f"no global batch given: one sequence per GPU ({world_size} × {seq_len} tokens)")
    if global_batch_sequences is not None:
        if global_batch_sequences < 1:
            raise ShardplanError("global_batch", global_batch_sequences, "must be at least 1 sequence")
        requested = global_batch_sequences * seq_len
    else:
        if global_batch_tokens < 1:
            raise ShardplanError("global_batch_tokens", global_batch_tokens, "must be positive")
        requested = global_batch_tokens
    per_gpu_exact = requested / (seq_len * world_size)
    per_gpu = max(1, int(round(per_gpu_exact)))
    from shardplan.support.limits import MAX_GRAD_ACCUM, MAX_MICRO_BATCH
    if per_gpu > MAX_MICRO_BATCH * MAX_GRAD_ACCUM:  # no micro-batch x accumulation within their ranges makes it
        field = "global_batch" if global_batch_sequences is not None else "global_batch_tokens"
        raise ShardplanError(field, global_batch_sequences if global_batch_sequences is not None else requested,
                             f"{per_gpu:,} sequences per GPU of {seq_len:,} tokens; at most "
                             f"{MAX_MICRO_BATCH * MAX_GRAD_ACCUM:,} (micro-batch {MAX_MICRO_BATCH:,} x "
                             f"{MAX_GRAD_ACCUM:,} accumulation steps)")
    tokens = per_gpu * world_size * seq_len
    if tokens != requested:
        notes.append(f"global batch adjusted from {requested:,} to {tokens:,} tokens = {per_gpu} sequence(s) per GPU "
                     f"× {world_size} GPUs × {seq_len} tokens ({requested:,} / ({world_size} × {seq_len}) = "
                     f"{per_gpu_exact:.3g} is not a whole number; micro-batch × grad accumulation must equal it)")
    return Workload(seq_len=seq_len, global_batch_tokens=tokens, global_batch_sequences=per_gpu * world_size,
                    sequences_per_gpu=per_gpu, requested_tokens=requested, notes=notes)
