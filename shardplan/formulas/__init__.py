"""The quantities: one pure, numpy-broadcastable function per quantity (model states,
activations, buffers, overheads, allocator, load peak, memory total, communication, throughput,
verdict). No I/O, printing or torch here; each docstring cites its source (docs/formulas.md)."""
