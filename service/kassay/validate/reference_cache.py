"""A host-memory cache of input groups' inputs and float64 references.

The references of a CI grid are the same on every commit: computing them again costs most of a
repeated job's time (a float64 FLCE reference at N=8192 H=4096 V=128256 takes 0.64 s and 12.8
GiB on an H200). A worker keeps them, keyed by everything that determines them — op, canonical
params, regime, seed, device kind and kassay version — as host copies taken before any impl
touches the inputs (so an impl that scribbles on its inputs cannot poison the cache), least
recently used first out, within `KASSAY_REFERENCE_CACHE_BYTES` (0 turns the cache off). A hit
copies the tensors back to the device.

Eviction: a CI grid is a sequential scan, and a scan larger than the cache gets no hit at all
under plain LRU (every entry is evicted just before its turn comes again). So an entry makes
room only by evicting entries idle for more than IDLE_EVICT_S; when nothing is that old, the
new entry is not kept, and a repeated grid hits on the part that fits.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import torch

from kassay import __version__

Tensors = dict[str, torch.Tensor]

#: an entry unused for this long may be evicted to make room
IDLE_EVICT_S = 600.0


def _nbytes(ts: Tensors) -> int:
    return sum(t.numel() * t.element_size() for t in ts.values())


def _host(ts: Tensors) -> Tensors:
    return {k: t.detach().to("cpu", copy=True) for k, t in ts.items()}


def _device(ts: Tensors, device: torch.device) -> Tensors:
    return {k: t.to(device, copy=True) for k, t in ts.items()}


def device_kind(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return device.type


class ReferenceCache:
    """LRU of (inputs, reference) host copies; thread-safe."""

    def __init__(self, cap_bytes: int) -> None:
        self.cap_bytes = cap_bytes
        self.held_bytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[str, tuple[Tensors, Tensors, int]] = OrderedDict()
        self._used: dict[str, float] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(op: str, params: dict, regime: str, seed: int, device: torch.device) -> str:
        return json.dumps(
            [op, params, regime, seed, device_kind(device), __version__],
            sort_keys=True,
            default=str,
        )

    def get_or_make(
        self,
        key: str,
        device: torch.device,
        make: Callable[[], tuple[Tensors, Tensors]],
    ) -> tuple[Tensors, Tensors, bool]:
        """(inputs, reference, hit): from the cache when present, else made and kept."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self._used[key] = time.monotonic()
                self.hits += 1
        if entry is not None:
            return _device(entry[0], device), _device(entry[1], device), True
        inputs, ref = make()
        with self._lock:
            self.misses += 1
        size = _nbytes(inputs) + _nbytes(ref)
        if 0 < size <= self.cap_bytes:
            with self._lock:
                now = time.monotonic()
                for old in list(self._entries):  # least recently used first
                    if self.held_bytes + size <= self.cap_bytes:
                        break
                    if now - self._used.get(old, 0.0) > IDLE_EVICT_S:
                        self.held_bytes -= self._entries.pop(old)[2]
                        self._used.pop(old, None)
                fits = self.held_bytes + size <= self.cap_bytes and key not in self._entries
            if fits:
                host = (_host(inputs), _host(ref), size)
                with self._lock:
                    if key not in self._entries and self.held_bytes + size <= self.cap_bytes:
                        self._entries[key] = host
                        self._used[key] = time.monotonic()
                        self.held_bytes += size
        return inputs, ref, False


_cache: ReferenceCache | None = None


def shared_cache() -> ReferenceCache:
    """The process's cache, sized by the reference_cache_bytes setting
    (KASSAY_REFERENCE_CACHE_BYTES, default 8 GiB; 0 turns it off)."""
    global _cache
    if _cache is None:
        from kassay.settings import get_settings

        _cache = ReferenceCache(get_settings().reference_cache_bytes)
    return _cache
