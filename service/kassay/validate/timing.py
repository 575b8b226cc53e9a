"""Timing of one impl call: warm-up, L2 flush, adaptive repetitions, robust statistics.

On CUDA each repetition is bracketed by CUDA events, after a write of a buffer twice the L2
size so every repetition starts from a cold cache. On the CPU the same loop runs on
time.perf_counter and the result is labelled `cpu_perf_counter` (or, with the policy's
cpu_clock `process`, on time.process_time, labelled `cpu_process_time`). Every repetition's
time is kept in the result (`samples_ms`) for comparisons between jobs.
Repetitions continue until the standard error of the median (1.2533 * std / sqrt(n)) falls
under target_rel_sem of the median, with at least min_reps, at most max_reps, within budget_s.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch

from kassay.validate.results import TimingStats
from kassay.validate.spec import TimingPolicy

_flush_buffers: dict[torch.device, torch.Tensor] = {}


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
    med = statistics.median(times_ms)
    sem = 1.2533 * statistics.stdev(times_ms) / math.sqrt(len(times_ms))
    return sem / med if med > 0 else 0.0


def stats(times_ms: list[float], clock: str, flushed: bool) -> TimingStats:
    med = statistics.median(times_ms)
    std = statistics.stdev(times_ms) if len(times_ms) > 1 else 0.0
    sem = 1.2533 * std / math.sqrt(len(times_ms))
    return TimingStats(
        clock=clock,  # type: ignore[arg-type]
        n=len(times_ms),
        median_ms=med,
        mean_ms=statistics.fmean(times_ms),
        std_ms=std,
        p10_ms=_quantile(times_ms, 0.1),
        p90_ms=_quantile(times_ms, 0.9),
        rel_sem=sem / med if med > 0 else 0.0,
        l2_flushed=flushed,
        samples_ms=list(times_ms),
    )


def time_call(fn: Callable[[], object], device: torch.device, policy: TimingPolicy) -> TimingStats:
    """Time `fn` (which runs one whole case: e.g. forward + backward) per `policy`."""
    cuda = device.type == "cuda"
    flush = cuda and policy.flush_l2
    for _ in range(policy.warmup):
        fn()
    if cuda:
        torch.cuda.synchronize(device)
    times: list[float] = []
    # The CPU clock: perf_counter measures what a caller waits; process_time the CPU the
    # executor spends (all threads), which other processes on a shared host cannot inflate.
    clock = time.process_time if policy.cpu_clock == "process" else time.perf_counter
    t_end = time.perf_counter() + policy.budget_s
    while len(times) < policy.max_reps:
        if flush:
            _flush_buffer(device).zero_()
        if cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        else:
            t0 = clock()
            fn()
            times.append((clock() - t0) * 1e3)
        if len(times) >= policy.min_reps:
            if len(times) > 1 and _rel_sem(times) <= policy.target_rel_sem:
                break
            if time.perf_counter() > t_end:
                break
    cpu_label = "cpu_process_time" if policy.cpu_clock == "process" else "cpu_perf_counter"
    return stats(times, "cuda_events" if cuda else cpu_label, flush)
