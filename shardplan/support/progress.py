"""The sweep's progress, drawn on stderr: `sweep(progress=True)`'s bar and the `--progress` flag's."""

from __future__ import annotations

import sys
import time

# A sweep shows the bar by default when it is at least this many rows (two of its default chunks)
# and stderr is a terminal.
DEFAULT_BAR_ROWS = 2 * (1 << 20)


class StderrBar:
    """``progress(done, total)`` as a one-line stderr bar, redrawn at most ten times a second.

    ``when``: True draws it; None draws it only when stderr is a terminal and the sweep has at
    least ``DEFAULT_BAR_ROWS`` rows (decided at the first call, when the total is known)."""

    def __init__(self, when: bool | None = True):
        self.when = when
        self.enabled: bool | None = None
        self.t0 = time.perf_counter()
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        if self.enabled is None:
            self.enabled = bool(self.when) if self.when is not None else (
                sys.stderr.isatty() and total >= DEFAULT_BAR_ROWS)
        if not self.enabled:
            return
        now = time.perf_counter()
        if done < total and now - self.last < 0.1:
            return
        self.last = now
        frac = done / max(total, 1)
        rate = done / max(now - self.t0, 1e-9)
        bar = "#" * int(30 * frac)
        sys.stderr.write(f"\rsweep [{bar:<30}] {frac:6.1%} {done:,}/{total:,} rows, {rate / 1e6:.2f} M rows/s")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def progress_bar(flag: bool | None) -> StderrBar | bool:
    """The ``--progress/--no-progress`` flag as ``sweep``'s ``progress`` (False: no bar)."""
    return False if flag is False else StderrBar(flag)
