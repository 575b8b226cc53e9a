"""How fast does a cached float64 reference come back to the device? (#15: in the repeated CI
grid on the H200, 2026-12-04, copying the cached references from host memory took ~4 s of the
21.4 s: four flce groups of ~4.5 GB each, pageable memory.)

For one flce-sized reference (128256 x 4096 float64, 4.2 GB) times: the copy to the host and
back from pageable memory (what the cache does), the same after torch's pin_memory() (the
caching host allocator), and after registering the pageable tensor's pages with
cudaHostRegister (page-locked in place); with the time each way of pinning costs and the
process's resident memory after each (the caching host allocator rounds sizes up).

    PYTHONPATH=service python3 research/host_copy_probe.py
"""

from __future__ import annotations

import json
import resource
import time

import torch

DEV = torch.device("cuda")


def rss_gib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**30


def timed(fn) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def main() -> None:
    ref = torch.randn(128256, 4096, dtype=torch.float64, device=DEV)
    gib = ref.numel() * 8 / 2**30
    res: dict[str, float] = {"gib": gib, "rss_start_gib": rss_gib()}
    t, host = timed(lambda: ref.to("cpu", copy=True))
    res["d2h_pageable_s"] = t
    res["rss_after_host_copy_gib"] = rss_gib()
    for i in range(2):
        t, _ = timed(lambda: host.to(DEV, copy=True))
        res[f"h2d_pageable_s_{i}"] = t
    t, pinned = timed(lambda: host.pin_memory())
    res["pin_memory_s"] = t
    res["rss_after_pin_memory_gib"] = rss_gib()
    for i in range(2):
        t, _ = timed(lambda p=pinned: p.to(DEV, copy=True, non_blocking=True))
        res[f"h2d_pin_memory_s_{i}"] = t
    del pinned
    cudart = torch.cuda.cudart()
    t0 = time.perf_counter()
    rc = cudart.cudaHostRegister(host.data_ptr(), host.numel() * host.element_size(), 0)
    res["host_register_s"] = time.perf_counter() - t0
    res["host_register_rc"] = int(rc)
    for i in range(2):
        t, _ = timed(lambda: host.to(DEV, copy=True, non_blocking=True))
        res[f"h2d_registered_s_{i}"] = t
    t0 = time.perf_counter()
    cudart.cudaHostUnregister(host.data_ptr())
    res["host_unregister_s"] = time.perf_counter() - t0
    res["rss_end_gib"] = rss_gib()
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
