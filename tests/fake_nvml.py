"""A stand-in for NVML (the `pynvml` module) with two cards: the boundary the metrics tests
replace, since this machine has no GPU."""

from __future__ import annotations

from types import SimpleNamespace


class FakeNvml:
    """Two cards as NVML would describe them (index, UUID, readings)."""

    NVML_CLOCK_SM = 1

    def __init__(self) -> None:
        self.cards = {
            0: SimpleNamespace(uuid="GPU-aaaa", util=37, used=3 << 30, total=80 << 30, mw=250_500),
            1: SimpleNamespace(uuid="GPU-bbbb", util=90, used=1 << 30, total=80 << 30, mw=None),
        }

    def nvmlDeviceGetCount(self) -> int:
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if i not in self.cards:
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        return next(i for i, c in self.cards.items() if c.uuid == uuid)

    def nvmlDeviceGetIndex(self, h: int) -> int:
        return h

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.cards[h].uuid

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=self.cards[h].util, memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        c = self.cards[h]
        return SimpleNamespace(used=c.used, total=c.total, free=c.total - c.used)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        if self.cards[h].mw is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return int(self.cards[h].mw)

    def nvmlDeviceGetClockInfo(self, h: int, which: int) -> int:
        assert which == self.NVML_CLOCK_SM
        return 1980
