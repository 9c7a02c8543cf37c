"""GPU clocks, power, temperature and NVML's throttle reasons sampled in a background thread while a
measurement runs (``benchmarks/gpu_sustained.py``, ``gpu_campaign.py``'s ``sample_clocks`` runs).

Why: a published tokens/s is an average over minutes of training; the campaign's step times are the
fastest warm step of three. Whether the GPU holds its clocks over minutes (power cap, temperature) is
a measurement, not an assumption, so every sustained record carries the clocks it ran at.

NVML through ``pynvml`` (nvidia-ml-py); without it, or without a GPU, the sampler records nothing
and says why in ``error``. The throttle mask's bits are named where records are read
(``shardplan.calibrate.sustained.THROTTLE_BITS``).
"""

from __future__ import annotations

import threading
import time


class ClockSampler:
    """``with ClockSampler(0.25) as s: ...``; ``s.samples`` is a list of
    ``[t_s, sm_mhz, mem_mhz, power_w, temp_c, throttle_mask]`` (t from entering)."""

    def __init__(self, period_s: float = 0.25, device: int = 0):
        self.period_s, self.device = period_s, device
        self.samples: list[list[float]] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "ClockSampler":
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml, self._h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(self.device)
        except Exception as exc:  # no NVML here: the record says so instead of holding guesses
            self.error = f"{type(exc).__name__}: {exc}"[:200]
            return self
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> list[float]:
        n, h = self._nvml, self._h
        throttle = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or n.nvmlDeviceGetCurrentClocksThrottleReasons
        return [round(time.perf_counter() - self._t0, 3), n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
                n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM), n.nvmlDeviceGetPowerUsage(h) / 1000.0,
                n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU), int(throttle(h))]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self._read())
            except Exception as exc:
                self.error = f"{type(exc).__name__}: {exc}"[:200]
                return
            self._stop.wait(self.period_s)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def record(self) -> dict:
        """What a measurement record stores: the samples, the column names, any error, and the
        power limit NVML reports (the cap the sustained clocks are held under)."""
        out: dict = {"clock_columns": ["t_s", "sm_mhz", "mem_mhz", "power_w", "temp_c", "throttle_mask"],
                     "clock_samples": self.samples}
        if self.error:
            out["clock_error"] = self.error
        try:
            out["power_limit_w"] = self._nvml.nvmlDeviceGetEnforcedPowerLimit(self._h) / 1000.0
            out["max_sm_mhz"] = self._nvml.nvmlDeviceGetMaxClockInfo(self._h, self._nvml.NVML_CLOCK_SM)
        except Exception:
            pass
        return out
