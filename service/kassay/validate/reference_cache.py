"""A host-memory cache of input groups' float64 references.

The references of a CI grid are the same on every commit: computing them again costs most of a
repeated job's time (a float64 FLCE reference at N=8192 H=4096 V=128256 takes 0.64 s and 12.8
GiB on an H200). A worker keeps them, keyed by everything that determines them — op, canonical
params, regime, seed, device kind and kassay version — as host copies taken before any impl
runs, least recently used first out, within `KASSAY_REFERENCE_CACHE_BYTES` (0 turns the cache
off). The inputs are not kept: the op's seeded generator makes them again on the device in
milliseconds, and copying them to and from host memory is not free (the 56-case CI grid of
bench/ci_latency.py held ~68 GB of inputs and references; keeping references only took its
first run on the H200 from 87.9 to 77.3 s, its repeated run unchanged within noise), and the
cache holds more groups in the same bytes. A fingerprint of the inputs (each tensor's shape,
dtype, sum and norm) is kept with the reference, and a hit needs the regenerated inputs to match
it: inputs that came out different (a generator that is not deterministic on this device) make
the reference again.

On CUDA the host copies are page-locked where they lie (cudaHostRegister, undone when the copy
is freed): a pageable 3.9 GiB reference took 0.50 s back to the H200 and 3.1 s to the host, a
page-locked one 0.08 s back (research/NOTES-probes.md (host_copy_probe)). A refused registration leaves its
error as the CUDA runtime's last error, which the next kernel launch's check in torch raises
(research/NOTES-probes.md (cudart_error_probe)), and torch binds no cudaGetLastError: kassay calls it in the
runtime torch loaded, and locks nothing where it cannot find it.
`KASSAY_REFERENCE_CACHE_PINNED=false` never locks any (locked memory cannot be swapped out).

Eviction: a CI grid is a sequential scan, and a scan larger than the cache gets no hit at all
under plain LRU (every entry is evicted just before its turn comes again). So an entry makes
room only by evicting entries idle for more than IDLE_EVICT_S; when nothing is that old, the
new entry is not kept, and a repeated grid hits on the part that fits.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable

import torch

from kassay import __version__

Tensors = dict[str, torch.Tensor]

#: an entry unused for this long may be evicted to make room
IDLE_EVICT_S = 600.0


def _nbytes(ts: Tensors) -> int:
    return sum(t.numel() * t.element_size() for t in ts.values())


@functools.cache
def _cuda_last_error() -> Callable[[], int] | None:
    """cudaGetLastError (returns and clears the calling thread's last CUDA runtime error) of the
    runtime library torch loaded, or None: found among the process's mapped files and opened
    with RTLD_NOLOAD, so it is that same instance and its error state, never a second copy."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcudart.so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
        except OSError:
            continue
        fn = getattr(lib, "cudaGetLastError", None)
        if fn is not None:
            fn.restype = ctypes.c_int
            return fn  # type: ignore[no-any-return]
    return None


def _unregister(ptr: int) -> None:
    if int(torch.cuda.cudart().cudaHostUnregister(ptr)) != 0:
        clear = _cuda_last_error()
        if clear is not None:
            clear()


def _page_lock(t: torch.Tensor) -> bool:
    """Page-lock a host tensor's memory where it lies (cudaHostRegister), unlocked again when
    the tensor is freed; False when it cannot be (the tensor stays pageable). torch's pinned
    allocator is no use here: it rounds a block up to a power of two (a 4.2 GB reference would
    lock 8 GiB) and keeps freed blocks for itself."""
    nbytes = t.numel() * t.element_size()
    clear = _cuda_last_error()
    if nbytes == 0 or clear is None:
        return False
    ptr = t.data_ptr()
    if int(torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0)) != 0:
        clear()  # else the next kernel launch anywhere in the process raises this error
        return False
    done = weakref.finalize(t, _unregister, ptr)
    done.atexit = False  # at exit the CUDA context may be gone; the process frees it anyway
    return True


def _host(ts: Tensors, *, page_lock: bool) -> Tensors:
    out = {}
    for k, t in ts.items():
        host = torch.empty(t.shape, dtype=t.dtype, device="cpu")
        if page_lock and t.is_cuda:
            _page_lock(host)
        host.copy_(t.detach())
        out[k] = host
    return out


def _device(ts: Tensors, device: torch.device) -> Tensors:
    return {k: t.to(device, copy=True) for k, t in ts.items()}


def device_kind(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return device.type


def fingerprint(ts: Tensors) -> str:
    """Per tensor (by name): shape, dtype, sum and 2-norm of the values (NaN and Inf included
    as they are), as one string; one host read. Float32 reductions (deterministic for the same
    tensor on the same device) over the tensor itself or, for 16-bit and integer inputs, its
    float32 copy: no float64 copy of a multi-GB input and no squared temporary."""
    names = sorted(ts)
    if not names:
        return "[]"
    vals = []
    for k in names:
        x = ts[k].detach().float()  # no copy for float32
        vals.append(torch.stack([x.sum(), torch.linalg.vector_norm(x)]))
    sums = torch.stack(vals).tolist()
    return json.dumps(
        [[k, list(ts[k].shape), str(ts[k].dtype), *v] for k, v in zip(names, sums, strict=True)]
    )  # NaN is written as NaN: equal strings for equal values


class ReferenceCache:
    """LRU of float64 references (host copies) with their inputs' fingerprints; thread-safe."""

    def __init__(self, cap_bytes: int, *, page_lock: bool = True) -> None:
        self.cap_bytes = cap_bytes
        self.page_lock = page_lock
        self.held_bytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[str, tuple[str, Tensors, int]] = OrderedDict()
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
        make_inputs: Callable[[], Tensors],
        make_ref: Callable[[Tensors], Tensors],
    ) -> tuple[Tensors, Tensors, bool]:
        """(inputs, reference, hit): the inputs made afresh, the reference from the cache when
        it holds one for inputs like these, else made (from pristine inputs) and kept."""
        inputs = make_inputs()
        with self._lock:
            entry = self._entries.get(key)
        fp = fingerprint(inputs) if entry is not None or self.cap_bytes > 0 else ""
        if entry is not None and entry[0] == fp:
            with self._lock:
                if key in self._entries:
                    self._entries.move_to_end(key)
                self._used[key] = time.monotonic()
                self.hits += 1
            return inputs, _device(entry[1], device), True
        ref = make_ref(inputs)
        with self._lock:
            self.misses += 1
        size = _nbytes(ref)
        if 0 < size <= self.cap_bytes:
            with self._lock:
                now = time.monotonic()
                if key in self._entries:  # a stale entry (inputs changed): replaced
                    self.held_bytes -= self._entries.pop(key)[2]
                for old in list(self._entries):  # least recently used first
                    if self.held_bytes + size <= self.cap_bytes:
                        break
                    if now - self._used.get(old, 0.0) > IDLE_EVICT_S:
                        self.held_bytes -= self._entries.pop(old)[2]
                        self._used.pop(old, None)
                fits = self.held_bytes + size <= self.cap_bytes
            if fits:
                host = (fp, _host(ref, page_lock=self.page_lock), size)
                with self._lock:
                    if key not in self._entries and self.held_bytes + size <= self.cap_bytes:
                        self._entries[key] = host
                        self._used[key] = time.monotonic()
                        self.held_bytes += size
        return inputs, ref, False


_cache: ReferenceCache | None = None


def shared_cache() -> ReferenceCache:
    """The process's cache, sized by the reference_cache_bytes setting
    (KASSAY_REFERENCE_CACHE_BYTES, default 8 GiB; 0 turns it off), page-locked unless
    KASSAY_REFERENCE_CACHE_PINNED is false."""
    global _cache
    if _cache is None:
        from kassay.settings import get_settings

        settings = get_settings()
        _cache = ReferenceCache(
            settings.reference_cache_bytes, page_lock=settings.reference_cache_pinned
        )
    return _cache
