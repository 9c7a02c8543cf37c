"""Does a formula change that moves a number fail a focused test (not only a README snapshot)?

For each module of ``shardplan/formulas/`` (and the accuracy band's data file), one constant a
formula derives from its cited source is doubled in a throwaway copy of the tree (``git archive
HEAD``), and that module's focused test file runs against the copy (``pytest -x``). A mutation the
tests do not catch is a gap. The last run's table is in docs/formulas.md ("Which test pins which
module"); the suite does not run this (one pytest per module, minutes on the development machine).

    python tools/formula_mutations.py                 # every module
    python tools/formula_mutations.py load overheads  # some modules
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
F = "shardplan/formulas/"
# module: (file, text, the text with its constant doubled, focused test files)
MUTATIONS = {
    "accuracy_bands": ("shardplan/data/accuracy_bands.json", '"relative_error": 0.00069', '"relative_error": 0.00138',
                       ["tests/test_accuracy_bands.py"]),
    "activations": (F + "activations.py", "RMSNORM_STATS_BYTES = 4 ", "RMSNORM_STATS_BYTES = 8 ", ["tests/test_activations.py"]),
    "allocator": (F + "allocator.py", "np.ceil(4 * c.micro_batch", "np.ceil(8 * c.micro_batch", ["tests/test_allocator.py"]),
    "buffers": (F + "buffers.py", "[4, 2, 2], compute_dtype_bytes", "[8, 2, 2], compute_dtype_bytes", ["tests/test_buffers.py"]),
    "columns": (F + "columns.py", "spec.moe.shared_experts) * spec.moe.intermediate_size",
                "spec.moe.shared_experts) * 2 * spec.moe.intermediate_size", ["tests/test_columns.py"]),
    "comm": (F + "comm.py", "np.where(n > 1, 2 * (n - 1)", "np.where(n > 1, 4 * (n - 1)", ["tests/test_comm.py"]),
    "efficiencies": (F + "efficiencies.py", '"value": round(float(value), 4)', '"value": round(2 * float(value), 4)',
                     ["tests/test_efficiencies.py"]),
    "load": (F + "load.py", "b = np.where(c.precision == st.FP32, 4, 2)\n    return", "b = np.where(c.precision == st.FP32, 4, 4)\n    return",
             ["tests/test_load.py"]),
    "memory": (F + "memory.py", "p * 18 * per_node * buffer_factor", "p * 36 * per_node * buffer_factor",
               ["tests/test_model_states.py::test_deepspeed_host_ram_reproduced_exactly"]),
    "model_states": (F + "model_states.py", "GPTQ_GROUP_SIZE = 128", "GPTQ_GROUP_SIZE = 256",
                     ["tests/test_model_states.py::test_gptq_and_awq_bytes_from_their_packed_tensors"]),
    "overflow": (F + "overflow.py", "SCREEN_BYTES = INT64_SAFE // 16", "SCREEN_BYTES = INT64_SAFE // 32",
                 ["tests/test_overflow_guard.py::test_the_screen_is_a_sixteenth_of_int64_safe"]),
    "overheads": (F + "overheads.py", "NCCL_BYTES_PER_CHANNEL = 2 * (", "NCCL_BYTES_PER_CHANNEL = 4 * (", ["tests/test_overheads.py"]),
    "throughput": (F + "throughput.py", "CROSS_ENTROPY_BYTES_PER_VOCAB = 42.0", "CROSS_ENTROPY_BYTES_PER_VOCAB = 84.0",
                   ["tests/test_throughput.py"]),
    "verdict": (F + "verdict.py", "total = total + coefficient * bases[base]", "total = total + 2 * coefficient * bases[base]",
                ["tests/test_verdict.py::test_band_is_each_class_error_times_its_base_summed"]),
}


def _copy_of_head(into: Path) -> None:
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)


def _pytest(tree: Path, tests: list[str]) -> tuple[int, list[str], str]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                          cwd=tree, env=env, capture_output=True, text=True)
    return proc.returncode, [line for line in proc.stdout.splitlines() if line.startswith("FAILED")], proc.stdout[-300:]


def mutate_and_test(tree: Path, module: str) -> tuple[bool, str, float]:
    """(caught, the first failing test or why not, seconds) for one module's mutation. The tests
    must pass on the unmutated tree first (else a failure would be no catch)."""
    path, old, new, tests = MUTATIONS[module]
    target = tree / path
    text = target.read_text()
    if text.count(old) != 1:
        return False, f"the constant's text is not in {path} exactly once (tool out of date)", 0.0
    t0 = time.perf_counter()
    code, failed, tail = _pytest(tree, tests)
    if code != 0:
        return False, f"the focused tests fail without the mutation: {failed[:1] or tail}", time.perf_counter() - t0
    target.write_text(text.replace(old, new))
    try:
        code, failed, tail = _pytest(tree, tests)
        # exit 1 = tests failed; anything else (collection error, no tests) is not a catch
        return code == 1 and bool(failed), (failed[0] if failed else tail), time.perf_counter() - t0
    finally:
        target.write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modules", nargs="*", help=f"some of: {', '.join(sorted(MUTATIONS))} (default: all)")
    args = ap.parse_args()
    modules = args.modules or sorted(MUTATIONS)
    unknown = sorted(set(modules) - set(MUTATIONS))
    if unknown:
        ap.error(f"no mutation for {', '.join(unknown)}")
    missed = 0
    with tempfile.TemporaryDirectory(prefix="formula-mutations-") as tmp:
        tree = Path(tmp)
        _copy_of_head(tree)
        for module in modules:
            caught, detail, seconds = mutate_and_test(tree, module)
            missed += not caught
            _, old, new, tests = MUTATIONS[module]
            print(f"{module:15s} {'caught' if caught else 'MISSED'} ({seconds:.0f} s) {old!r} -> {new!r} by {' '.join(tests)}: {detail}",
                  flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
