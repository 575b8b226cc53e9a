"""Timing of one impl call: device time with the host kept ahead, wall time beside it.

Two figures per case, both labelled:

- **device** time (the headline: TFLOP/s, GB/s, roofline and speed-up come from it): what the GPU
  spends on one call. The call is captured once in a CUDA graph and replayed (mode `graph`);
  an impl that cannot be captured (a host sync, a data-dependent host branch, ...) is called
  directly (mode `events`). Either way repetitions are enqueued back to back in batches, each
  between two CUDA events with the L2 flush enqueued before it, and the host synchronises only
  after a batch (triton.testing.do_bench's method), so the GPU never idles waiting for Python and
  that idle time is not counted. Per-repetition launches in `events` mode still cost the host
  time; when the host is slower than the kernel the GPU waits between events and the figure
  includes it: `graph` mode is the cure, and the reason a case fell back is recorded.
- **wall** time: one call from the host's point of view (launches + device + a synchronise),
  median of a few calls: `host_overhead_ms` = wall - device shows a slow wrapper as such.

L2: cold (flushed before every repetition, the default) or warm, by `TimingPolicy.flush_l2`.
On the CPU both figures are the same monotonic-clock time and the mode is `cpu`.
Repetitions continue, batch after batch, until the standard error of the median
(1.2533 * std / sqrt(n)) falls under target_rel_sem of the median, with at least min_reps, at
most max_reps, within budget_s. The SM clock and board power are sampled meanwhile (gpu_state).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from kassay.validate.gpu_state import GpuSampler
from kassay.validate.results import TimingStats
from kassay.validate.spec import TimingPolicy

_flush_buffers: dict[torch.device, torch.Tensor] = {}

#: the target length of one batch of enqueued repetitions (the host syncs once per batch)
_BATCH_S = 0.05
#: host + device calls measured for the wall figure
_WALL_REPS = 10


def _flush_buffer(device: torch.device) -> torch.Tensor:
    buf = _flush_buffers.get(device)
    if buf is None:
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)
        buf = _flush_buffers[device] = torch.empty(
            max(2 * l2, 128 << 20) // 4, dtype=torch.int32, device=device
        )
    return buf


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _rel_sem(times_ms: list[float]) -> float:
    if len(times_ms) < 2:
        return math.inf
    med = statistics.median(times_ms)
    sem = 1.2533 * statistics.stdev(times_ms) / math.sqrt(len(times_ms))
    return sem / med if med > 0 else 0.0


def stats(times_ms: list[float], clock: str, flushed: bool, mode: str = "") -> TimingStats:
    med = statistics.median(times_ms)
    std = statistics.stdev(times_ms) if len(times_ms) > 1 else 0.0
    sem = 1.2533 * std / math.sqrt(len(times_ms))
    return TimingStats(
        clock=clock,  # type: ignore[arg-type]
        mode=mode or ("cpu" if clock == "cpu_perf_counter" else "events"),  # type: ignore[arg-type]
        n=len(times_ms),
        median_ms=med,
        mean_ms=statistics.fmean(times_ms),
        std_ms=std,
        p10_ms=_quantile(times_ms, 0.1),
        p90_ms=_quantile(times_ms, 0.9),
        rel_sem=sem / med if med > 0 else 0.0,
        l2_flushed=flushed,
    )


def _enough(times: list[float], policy: TimingPolicy, t_end: float) -> bool:
    if len(times) >= policy.max_reps:
        return True
    if len(times) < policy.min_reps:
        return False
    return _rel_sem(times) <= policy.target_rel_sem or time.perf_counter() > t_end


def _batch_size(estimate_ms: float, policy: TimingPolicy, done: int) -> int:
    """Repetitions for the next batch: about _BATCH_S of device time, at least what min_reps
    still needs, never past max_reps."""
    per = max(estimate_ms, 1e-3) / 1e3
    n = max(1, int(_BATCH_S / per), policy.min_reps - done)
    return max(1, min(n, policy.max_reps - done))


def _capture(fn: Callable[[], object], device: torch.device) -> tuple[Any | None, str | None]:
    """A CUDA graph of one call, or (None, why not). The call has run (warm-up) before, so its
    kernels are compiled and its allocator pools exist."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.stream(stream):
            fn()  # one more eager call on the capture stream (cuBLAS workspaces, lazy init)
        torch.cuda.current_stream(device).wait_stream(stream)
        torch.cuda.synchronize(device)
        with torch.cuda.graph(graph, stream=stream):
            fn()
        torch.cuda.synchronize(device)
    except Exception as exc:
        # A failed capture is ended by torch.cuda.graph; make sure the device is usable again.
        torch.cuda.synchronize(device)
        text = " ".join(str(exc).split())
        return None, f"{type(exc).__name__}: {text[:200]}"
    return graph, None


def _device_times(
    call: Callable[[], object],
    device: torch.device,
    policy: TimingPolicy,
    estimate_ms: float,
) -> list[float]:
    """Per-repetition device times (ms), repetitions enqueued in batches without host syncs."""
    flush = policy.flush_l2
    buf = _flush_buffer(device) if flush else None
    times: list[float] = []
    t_end = time.perf_counter() + policy.budget_s
    while not _enough(times, policy, t_end):
        n = _batch_size(estimate_ms, policy, len(times))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        stops = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            if buf is not None:
                buf.zero_()
            starts[i].record()
            call()
            stops[i].record()
        stops[-1].synchronize()
        times += [s.elapsed_time(e) for s, e in zip(starts, stops, strict=True)]
        estimate_ms = statistics.median(times)
    return times


def _wall_times(
    fn: Callable[[], object], device: torch.device, policy: TimingPolicy, reps: int
) -> list[float]:
    """Host-side time of whole calls (launch + device + synchronise), ms."""
    cuda = device.type == "cuda"
    buf = _flush_buffer(device) if cuda and policy.flush_l2 else None
    out: list[float] = []
    for _ in range(reps):
        if buf is not None:
            buf.zero_()
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize(device)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def time_call(fn: Callable[[], object], device: torch.device, policy: TimingPolicy) -> TimingStats:
    """Time `fn` (which runs one whole case: e.g. forward + backward) per `policy`: device
    time as the headline, wall time and host overhead beside it (see the module docstring)."""
    if device.type != "cuda":
        return _time_cpu(fn, policy)
    for _ in range(policy.warmup):
        fn()
    torch.cuda.synchronize(device)
    wall = _wall_times(fn, device, policy, max(1, min(_WALL_REPS, policy.max_reps)))
    graph: Any = None
    why: str | None = "disabled by the timing policy"
    if policy.cuda_graph:
        graph, why = _capture(fn, device)
    call: Callable[[], object] = graph.replay if graph is not None else fn
    sampler = GpuSampler(device).start()
    try:
        times = _device_times(call, device, policy, statistics.median(wall))
    finally:
        state = sampler.stop()
        del graph
    out = stats(times, "cuda_events", policy.flush_l2, "graph" if call is not fn else "events")
    out.graph_fallback = None if call is not fn else why
    out.wall_median_ms = statistics.median(wall)
    out.host_overhead_ms = max(0.0, out.wall_median_ms - out.median_ms)
    out.sm_clock_mhz = state.sm_clock_mhz
    out.power_w = state.power_w
    out.power_limit_w = state.power_limit_w
    out.throttle_reasons = state.throttle_reasons
    out.power_capped = state.power_capped
    return out


def _time_cpu(fn: Callable[[], object], policy: TimingPolicy) -> TimingStats:
    for _ in range(policy.warmup):
        fn()
    times: list[float] = []
    t_end = time.perf_counter() + policy.budget_s
    while not _enough(times, policy, t_end):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    out = stats(times, "cpu_perf_counter", False, "cpu")
    out.wall_median_ms = out.median_ms
    out.host_overhead_ms = 0.0
    return out


def profiler_device_ms(fn: Callable[[], object], reps: int = 20) -> float:
    """The reference the engine's device time is checked against: the mean per call of the
    summed durations of the device activities (kernels, memcpy, memset) that torch.profiler
    (CUPTI) records while `fn` runs `reps` times. Used by the GPU tests and
    bench/timing_fidelity.py."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    total_us = sum(
        e.time_range.elapsed_us() for e in prof.events() if e.device_type == DeviceType.CUDA
    )
    return total_us / reps / 1e3
