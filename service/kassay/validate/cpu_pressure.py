"""How much of a timed window other work kept the CPUs from the case: Linux pressure stall
information (PSI, `cpu` "some": the time at least one runnable task waited for a CPU).

Why. On the CPU the default clock is the wall clock (what a caller waits). When other processes
compete for the cores, every repetition of a case is slowed alike, so the repetitions agree with
each other and no spread statistic can tell: the same code read x2.3 slower with a tight
interval (99% CI 1.9-2.8) under two busy processes on 2 cores. The paired host calibration does
not cancel it either (a single-threaded workload suffers less than a case on every core). PSI
measures the cause: over a window of W seconds in which tasks waited S seconds, the case waited
at most S, so its wall time was inflated by at most 1 / (1 - S/W). The comparison between jobs
(kassay.validate.compare_reports) widens its interval by that factor, so a busy host reads "not
comparable" rather than "slower" or "same", while a change larger than what the wait can
explain is still called.

The worker's own cgroup (cgroup v2 `cpu.pressure`) is read where there is one, so that work in
other containers of a large host does not count; else the host's `/proc/pressure/cpu`. Absent
(None) where the kernel has no PSI: the comparison then judges as before.
"""

from __future__ import annotations

from pathlib import Path


def _pressure_file() -> Path | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        if line.startswith("0::"):  # cgroup v2: this process's group
            own = Path("/sys/fs/cgroup") / line[3:].lstrip("/") / "cpu.pressure"
            if own.is_file() and _read(own) is not None:
                return own
    host = Path("/proc/pressure/cpu")
    return host if host.is_file() and _read(host) is not None else None


def _read(path: Path) -> int | None:
    """The `some` line's total (microseconds), None when unreadable."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith("some "):
                return int(line.rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class PressureWindow:
    """Read at the start and the end of a timed window: `share()` is the fraction of the window
    (0-1) in which some task waited for a CPU, None where PSI cannot be read."""

    _file: Path | None = None
    _looked = False

    def __init__(self) -> None:
        if not PressureWindow._looked:
            PressureWindow._file = _pressure_file()
            PressureWindow._looked = True
        self._start = _read(self._file) if self._file is not None else None

    def share(self, window_s: float) -> float | None:
        if self._file is None or self._start is None or window_s <= 0:
            return None
        end = _read(self._file)
        if end is None:
            return None
        return min(1.0, max(0.0, (end - self._start) / (window_s * 1e6)))
