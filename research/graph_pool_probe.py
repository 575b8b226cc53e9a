"""Where does timing's reserved memory stay? (tests/gpu/test_timing_gpu.py's
test_timing_many_cases_leaves_no_memory_behind failed on the H200, 2026-12-03: 5960 MiB still
reserved after the cases ended.)

Times the test's cases (a bf16 forward+backward of growing size) with kassay's time_call and,
after each, prints how the timing went (mode, why not a graph), the memory reserved after
empty_cache, after gc.collect() + empty_cache, and the reserved bytes by allocator pool (a CUDA
graph's private pool has its own id; the default pool is (0, 0)).

    PYTHONPATH=service python3 research/graph_pool_probe.py [backward|forward|fail-first]

Found on the H200 (2026-12-03, torch 2.11): alone, none of the three variants without
`fail-first` keeps memory (reserved stays at the flush buffer's 200-450 MiB, cases timed as
events because direct calls keep the device busy); the test fails only after
test_a_failed_capture_leaves_the_device_and_its_generator_usable ran in the same process.
Suspect: torch <= 2.11 keeps a failed capture's private pool alive (pytorch/pytorch#190348,
#190308), and kassay's own flce fails every capture (its target check waits on an event:
"operation failed due to a previous error during capture" in every kassay case of
examples/flce-liger-parity.yaml), so an executor leaks a pool per kassay flce case.
`fail-first` runs one failed capture before the cases: the next H200 session's first run.

Found (2026-12-04, fail-first): after the failed capture the *default* pool grew 2004 -> 3784 ->
7124 MiB with 192 MiB allocated, gc and empty_cache giving nothing back. torch's capture_end
calls cudaStreamEndCapture before endAllocateToPool, so an invalidated capture stays registered
as underway, and while one is the allocator defers freeing every block with stream uses.
kassay.validate.timing now captures into its own pool handle and ends + releases that pool when
a capture fails (`pools_ended` counts it); the next run of this probe shows whether it holds.
"""

from __future__ import annotations

import gc
import json
import sys
from collections import Counter

import torch

from kassay.validate.spec import TimingPolicy
from kassay.validate.timing import time_call

DEV = torch.device("cuda")
MiB = 2**20


def pools() -> dict[str, int]:
    by: Counter[str] = Counter()
    for seg in torch.cuda.memory._snapshot()["segments"]:
        by[str(tuple(seg.get("segment_pool_id", (0, 0))))] += seg["total_size"]
    return {k: v // MiB for k, v in by.items()}


def case(n: int, backward: bool) -> object:
    a = torch.randn(n, 4096, device=DEV, dtype=torch.bfloat16, requires_grad=backward)
    w = torch.randn(4096, 4096, device=DEV, dtype=torch.bfloat16, requires_grad=backward)

    def call() -> None:
        y = (a @ w).float().square().mean()
        if backward:
            y.backward()

    policy = TimingPolicy(warmup=1, min_reps=3, max_reps=20, budget_s=0.2)
    return time_call(call, DEV, policy)


def main() -> None:
    variant = sys.argv[1] if len(sys.argv) > 1 else "backward"
    backward = variant in ("backward", "fail-first")
    if variant == "fail-first":
        from kassay.validate.timing import _capture

        x = torch.randn(1 << 10, device=DEV)

        def explicit_sync() -> None:
            x.mul_(1.0)
            torch.cuda.current_stream().synchronize()

        from kassay.validate import timing

        _graph, why = _capture(explicit_sync, DEV, reps=1, flush=None)
        row = {"failed_capture": why, "pools_ended": timing.pools_ended, "pools": pools()}
        print(json.dumps(row), flush=True)
    case(8192, backward)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved() // MiB
    print(json.dumps({"variant": variant, "base_mib": base, "pools": pools()}), flush=True)
    for n in (16384, 32768, 8192, 65536):
        st = case(n, backward)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        r1 = torch.cuda.memory_reserved() // MiB
        gc.collect()
        torch.cuda.empty_cache()
        r2 = torch.cuda.memory_reserved() // MiB
        row = {
            "n": n,
            "mode": getattr(st, "mode", None),
            "graph_fallback": getattr(st, "graph_fallback", None),
            "reserved_mib": r1,
            "after_gc_mib": r2,
            "allocated_mib": torch.cuda.memory_allocated() // MiB,
            "pools": pools(),
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
