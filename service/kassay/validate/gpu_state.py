"""The GPU's state while a case is timed: SM clock, board power and why the clocks are held
down, sampled through NVML (the nvidia-ml-py binding, `pynvml`) on a background thread.

A timing taken while the card throttles (thermal, hardware slowdown) or sits at its power limit
measures the machine as much as the kernel; reports flag such cases. Without NVML (no driver,
no binding, the CPU) every figure is None and nothing is flagged.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
from dataclasses import dataclass, field
from typing import Any

# NVML clock-event reason bits (nvml.h, nvmlClocksEventReason*): the ones that mean the
# measurement ran slower than the card's nominal clocks for reasons outside the kernel.
_THROTTLE_BITS = {
    0x0000000000000008: "hw_slowdown",
    0x0000000000000020: "sw_thermal",
    0x0000000000000040: "hw_thermal",
    0x0000000000000080: "hw_power_brake",
}
_POWER_CAP_BIT = 0x0000000000000004  # sw_power_cap: at the board's power limit


@dataclass
class GpuState:
    """What the samples taken during the repetitions say."""

    sm_clock_mhz: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    throttle_reasons: list[str] = field(default_factory=list)
    power_capped: bool = False
    samples: int = 0

    @property
    def throttled(self) -> bool:
        return bool(self.throttle_reasons)


def _nvml() -> Any | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    return pynvml


def _handle(nvml: Any, device: Any) -> Any | None:
    """NVML's handle of a torch CUDA device, found by PCI bus id (CUDA_VISIBLE_DEVICES may
    renumber devices), else by index."""
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    with contextlib.suppress(Exception):
        p: Any = torch.cuda.get_device_properties(index)
        bus = f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
        return nvml.nvmlDeviceGetHandleByPciBusId(bus.encode())
    with contextlib.suppress(Exception):
        return nvml.nvmlDeviceGetHandleByIndex(index)
    return None


class GpuSampler:
    """Samples the GPU every `period_s` between start() and stop(); a no-op off CUDA."""

    def __init__(self, device: Any, period_s: float = 0.01) -> None:
        self.period_s = period_s
        self._nvml: Any = _nvml() if getattr(device, "type", "") == "cuda" else None
        self._h = _handle(self._nvml, device) if self._nvml is not None else None
        self._clocks: list[float] = []
        self._power: list[float] = []
        self._reasons = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self._h is not None

    def _sample(self) -> None:
        nv, h = self._nvml, self._h
        with contextlib.suppress(Exception):
            self._clocks.append(float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)))
        with contextlib.suppress(Exception):
            self._power.append(nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
        getter = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        if getter is not None:
            with contextlib.suppress(Exception):
                self._reasons |= int(getter(h))

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def start(self) -> GpuSampler:
        if self.available:
            self._sample()
            self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> GpuState:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=1.0)
            self._sample()
        if not self.available:
            return GpuState()
        limit = None
        with contextlib.suppress(Exception):
            limit = self._nvml.nvmlDeviceGetEnforcedPowerLimit(self._h) / 1000.0
        return GpuState(
            sm_clock_mhz=statistics.median(self._clocks) if self._clocks else None,
            power_w=statistics.median(self._power) if self._power else None,
            power_limit_w=limit,
            throttle_reasons=[n for bit, n in _THROTTLE_BITS.items() if self._reasons & bit],
            power_capped=bool(self._reasons & _POWER_CAP_BIT),
            samples=len(self._clocks),
        )
