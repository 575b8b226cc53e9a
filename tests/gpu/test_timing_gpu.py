"""Timing on CUDA: the engine's device time agrees with the profiler's kernel durations, a
capturable call is timed as a CUDA graph, a call that syncs falls back to events with the reason
recorded, and host overhead is reported beside (not inside) device time."""

from __future__ import annotations

import time

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

DEV = torch.device("cuda")


def _profiler_ms(fn, reps: int = 20) -> float:
    """Mean per-call sum of device activity (kernels, memcpy, memset) recorded by CUPTI."""
    from kassay.validate.timing import profiler_device_ms

    return profiler_device_ms(fn, reps)


def test_device_time_of_a_copy_matches_the_profiler() -> None:
    from kassay.contract.spec import TimingPolicy
    from kassay.validate.timing import time_call

    src = torch.randn(1 << 28, device=DEV)  # 1 GiB
    dst = torch.empty_like(src)

    def copy() -> None:
        dst.copy_(src)

    t = time_call(copy, DEV, TimingPolicy(warmup=2, min_reps=10, max_reps=200, budget_s=2.0))
    prof = _profiler_ms(copy)
    # The host keeps ahead of a 1 GiB copy: direct calls (a graph would put the copy on a copy
    # engine, which is slower).
    assert t.mode == "events" and t.graph_fallback, t
    assert abs(t.median_ms - prof) / prof < 0.03, (t.median_ms, prof)
    assert t.wall_median_ms is not None and t.wall_median_ms >= t.median_ms * 0.97


def test_device_time_of_a_short_kernel_matches_the_profiler() -> None:
    from kassay.contract.spec import TimingPolicy
    from kassay.validate.timing import time_call

    x = torch.randn(1 << 20, device=DEV)

    def wrapped() -> None:
        deadline = time.perf_counter() + 1e-4  # a Python wrapper slower than its kernel
        while time.perf_counter() < deadline:
            pass
        x.mul_(1.0)

    t = time_call(wrapped, DEV, TimingPolicy(min_reps=20, max_reps=500))
    prof = _profiler_ms(wrapped)
    assert t.mode == "graph", t
    assert abs(t.median_ms - prof) < 0.005, (t.median_ms, prof)


def test_host_overhead_is_reported_beside_device_time() -> None:
    from kassay.contract.spec import TimingPolicy
    from kassay.validate.timing import time_call

    x = torch.randn(1 << 20, device=DEV)

    def slow_wrapper() -> None:
        deadline = time.perf_counter() + 0.002  # 2 ms of Python before a tiny kernel
        while time.perf_counter() < deadline:
            pass
        x.mul_(1.0)

    t = time_call(slow_wrapper, DEV, TimingPolicy(warmup=1, min_reps=10, max_reps=50))
    assert t.mode == "graph"
    assert t.median_ms < 0.2, t.median_ms  # the kernel, not the wrapper
    assert t.host_overhead_ms is not None and t.host_overhead_ms > 1.5


def test_a_call_that_syncs_falls_back_to_events() -> None:
    from kassay.contract.spec import TimingPolicy
    from kassay.validate.timing import time_call

    x = torch.randn(1 << 22, device=DEV)

    def syncing() -> None:
        float(x.sum().item())  # a host sync: cannot be captured

    t = time_call(syncing, DEV, TimingPolicy(warmup=1, min_reps=5, max_reps=20))
    assert t.mode == "events" and "synchronises" in (t.graph_fallback or "")
    assert t.median_ms > 0


def test_a_failed_capture_leaves_the_device_and_its_generator_usable() -> None:
    from kassay.validate.timing import _capture

    x = torch.randn(1 << 10, device=DEV)

    def explicit_sync() -> None:
        x.mul_(1.0)
        torch.cuda.current_stream().synchronize()

    graph, why = _capture(explicit_sync, DEV, reps=1, flush=None)
    assert graph is None and why
    assert torch.randn(4, device=DEV).shape == (4,)  # the default generator is not stuck
    assert torch.ones(4, device=DEV).sum().item() == 4.0


def test_warm_l2_is_faster_than_cold_for_a_small_read() -> None:
    from kassay.contract.spec import TimingPolicy
    from kassay.validate.timing import time_call

    # a quarter of the L2 (12.5 MiB on the H200): fits warm, and read cold it takes long enough
    # over a warm read to stand out of the timing noise (8 MiB failed once in ~4 runs, 2026-12-04)
    l2 = torch.cuda.get_device_properties(DEV).L2_cache_size
    x = torch.randn(max(l2 // 16, 1 << 21), device=DEV)
    out = torch.empty((), device=DEV)

    def read() -> None:
        torch.sum(x, 0, out=out)

    cold = time_call(read, DEV, TimingPolicy(min_reps=20, max_reps=200, flush_l2=True))
    warm = time_call(read, DEV, TimingPolicy(min_reps=20, max_reps=200, flush_l2=False))
    assert cold.l2_flushed and not warm.l2_flushed
    assert warm.median_ms < cold.median_ms


def test_gpu_state_is_sampled() -> None:
    # nvidia-ml-py (pynvml) is part of every CUDA image kassay runs on: a missing binding must
    # fail here, not skip, or the throttle flags would silently disappear from reports.
    import pynvml  # noqa: F401

    from kassay.contract.spec import TimingPolicy
    from kassay.validate.timing import time_call

    a = torch.randn(4096, 4096, device=DEV, dtype=torch.bfloat16)
    t = time_call(lambda: a @ a, DEV, TimingPolicy(min_reps=20, budget_s=0.5))
    assert t.sm_clock_mhz is not None and t.sm_clock_mhz > 100
    assert t.power_w is not None and t.power_w > 10


def test_timing_many_cases_leaves_no_memory_behind() -> None:
    """Each case's tensors are freed when it ends: timing it (CUDA-graph captures included) must
    not leave memory the caching allocator cannot give back. Before the fix an executor's
    reserved memory grew by GiBs a group over a CI grid, until groups ran out of memory."""
    grown = _reserved_growth((16384, 32768, 8192, 65536, 16384, 32768))
    assert grown < 256 << 20, f"{grown / 2**20:.0f} MiB still reserved after the cases ended"


def _reserved_growth(sizes: tuple[int, ...]) -> int:
    """Bytes still reserved (after empty_cache) once bf16 forward+backward cases of these row
    counts were timed, over what the first case (workspaces, flush buffer, capture stream)
    left."""
    from kassay.contract.spec import TimingPolicy
    from kassay.validate.timing import time_call

    policy = TimingPolicy(warmup=1, min_reps=3, max_reps=20, budget_s=0.2)

    def case(n: int) -> None:
        a = torch.randn(n, 4096, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(4096, 4096, device=DEV, dtype=torch.bfloat16, requires_grad=True)

        def fwd_bwd() -> None:
            (a @ w).float().square().mean().backward()

        time_call(fwd_bwd, DEV, policy)

    case(8192)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved()
    for n in sizes:
        case(n)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved() - base


def test_a_failed_capture_is_not_tried_again_for_the_same_impl() -> None:
    """A call that waits on an event inside (torch's sync debug mode does not see it) fails its
    capture; with a capture key, the next case of the same impl is timed as events without a
    second failed capture (each kept a memory pool reserved, torch <= 2.11)."""
    from kassay.contract.spec import TimingPolicy
    from kassay.validate.timing import time_call

    x = torch.randn(1 << 16, device=DEV)

    def waits() -> None:
        x.mul_(1.0)
        ev = torch.cuda.Event()
        ev.record()
        ev.synchronize()

    policy = TimingPolicy(warmup=1, min_reps=3, max_reps=10)
    first = time_call(waits, DEV, policy, capture_key="test/waits")
    assert first.mode == "events" and first.graph_fallback, first
    second = time_call(waits, DEV, policy, capture_key="test/waits")
    assert "failed earlier" in (second.graph_fallback or ""), second.graph_fallback
    other = time_call(waits, DEV, policy, capture_key="test/other")
    assert "failed earlier" not in (other.graph_fallback or "")


def test_a_long_call_is_timed_directly_and_matches_the_profiler() -> None:
    """A call of tens of ms that the host enqueues at once: no graph is tried, two wall calls,
    and the device time still agrees with the profiler's."""
    from kassay.contract.spec import TimingPolicy
    from kassay.validate.timing import time_call

    a = torch.randn(8192, 8192, device=DEV)
    b = torch.randn(8192, 8192, device=DEV)
    c = torch.empty_like(a)
    calls = 0

    def two_matmuls() -> None:  # float32, no TF32: ~45 ms on an H200
        nonlocal calls
        calls += 1
        torch.mm(a, b, out=c)
        torch.mm(c, b, out=c)

    t = time_call(two_matmuls, DEV, TimingPolicy(warmup=2, min_reps=5))
    assert t.mode == "events" and "long call" in (t.graph_fallback or ""), t
    # one warm-up, two wall calls, the repetitions
    assert calls <= 1 + 2 + t.n, (calls, t.n)
    prof = _profiler_ms(two_matmuls, reps=5)
    assert abs(t.median_ms - prof) / prof < 0.03, (t.median_ms, prof)


def test_a_failed_capture_leaves_no_memory_behind() -> None:
    """A capture that fails (an explicit synchronise inside) hands its pool back: the cases
    timed after it give their memory back as before (without that, the default pool grew by
    GiBs over these cases and empty_cache could not free it)."""
    from kassay.validate import timing

    x = torch.randn(1 << 10, device=DEV)

    def explicit_sync() -> None:
        x.mul_(1.0)
        torch.cuda.current_stream().synchronize()

    ended = timing.pools_ended
    graph, why = timing._capture(explicit_sync, DEV, reps=1, flush=None)
    assert graph is None and why, why
    assert timing.pools_ended == ended + 1
    grown = _reserved_growth((16384, 32768, 65536))
    assert grown < 256 << 20, f"{grown / 2**20:.0f} MiB still reserved after the cases ended"
