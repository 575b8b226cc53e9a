"""Timing of one impl call: device time with the host kept ahead, wall time beside it.

Two figures per case, both labelled:

- **device** time (the headline: TFLOP/s, GB/s, roofline and speed-up come from it): what the GPU
  spends on one call. Repetitions are enqueued back to back in batches, each between two CUDA
  events with the L2 flush (a fill kernel over twice the L2) enqueued before it, and the host
  synchronises once per batch (triton.testing.do_bench's method). Direct calls (mode `events`)
  keep the device busy whenever the host enqueues a call faster than the device runs it; when
  the host is the slower side the device would wait for Python between the events, so the call
  is replayed from a CUDA graph instead (mode `graph`), captured several times into one graph
  for short calls with a graph of the flushes alone subtracted (no graph-launch latency counted
  either). time_call measures both and picks; why a case was not timed as a graph is recorded.
  A long call (at least _LONG_MS of wall time) that the host enqueues in under half its time
  keeps the device busy by itself: it is timed as direct calls without a capture, after one
  warm-up and two wall calls (no warm-up and one wall call when the engine's own run of it
  came just before and was long).
- **wall** time: one call from the host's point of view (launches + device + a synchronise),
  median of a few calls: `host_overhead_ms` = wall - device shows a slow wrapper as such.

L2: cold (flushed before every repetition, the default) or warm, by `TimingPolicy.flush_l2`.
On the CPU both figures are the same clock's time and the mode is `cpu`: time.perf_counter
(`cpu_perf_counter`), or with the policy's cpu_clock `process` time.process_time
(`cpu_process_time`: other processes on a shared runner cannot inflate it). Every repetition's
time is kept in the result (`samples_ms`) for comparisons between jobs. On the CPU a fixed
calibration workload is timed right after every repetition (`calibration_ms`, one per sample;
the policy's cpu_calibration): the host's speed of the moment, which a comparison between jobs
divides out (kassay.validate.host_calibration), and the share of the timed window in which
other work kept a task waiting for a CPU (`cpu_pressure`, kassay.validate.cpu_pressure). Not on
CUDA: device time does not drift with
the host's load, and the GPU path is left as it is.
Repetitions continue, batch after batch, until the standard error of the median
(1.2533 sigma / sqrt(n); on CUDA sigma from the median absolute deviation, robust to the odd
slow repetition) falls under target_rel_sem of the median, with at least min_reps (or at least
three adding up to min_reps_time_s: a slow call is not repeated five times regardless), at most
max_reps, within budget_s. The SM clock and board power are sampled meanwhile (gpu_state).
bench/timing_fidelity.py checks the result against CUPTI's kernel durations.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from kassay.contract.results import TimingStats
from kassay.contract.spec import TimingPolicy
from kassay.validate.cpu_pressure import PressureWindow
from kassay.validate.gpu_state import GpuSampler
from kassay.validate.host_calibration import host_calibration

_flush_buffers: dict[torch.device, torch.Tensor] = {}
#: one side stream per device for every capture: libraries keep per-stream state for the life of
#: the process (cuBLAS a workspace per handle and stream), so a fresh stream per capture left a
#: workspace behind each time, each pinning a segment of the caching allocator (an executor's
#: reserved memory grew to 133 GiB over a CI grid on the H200 and the next groups ran out)
_capture_streams: dict[torch.device, torch.cuda.Stream] = {}
#: why a capture failed, per (device, capture key: the engine's op/impl). A failed capture is
#: not tried again for the same impl in this process: torch <= 2.11 keeps a failed capture's
#: private memory pool reserved until the process exits (pytorch/pytorch#190348), so an impl
#: that cannot be captured would leave a pool behind on every case of an executor's life.
_capture_failures: dict[tuple[torch.device, str], str] = {}

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


def _rel_sem(times_ms: list[float], *, robust: bool = False) -> float:
    """The standard error of the median (1.2533 sigma / sqrt(n)) over the median. robust: sigma
    taken as 1.4826 x the median absolute deviation (the standard deviation for normal data),
    so one outlier repetition cannot hold the loop open: on the H200 the first repetition of a
    loop of 2-4 ms memory-bound calls came out 2-5x the others (the device idle while the host
    enqueued it), which alone kept the std-based figure above 1% and ran those cases to
    max_reps."""
    if len(times_ms) < 2:
        return math.inf
    med = statistics.median(times_ms)
    if robust:
        sigma = 1.4826 * statistics.median(abs(t - med) for t in times_ms)
    else:
        sigma = statistics.stdev(times_ms)
    sem = 1.2533 * sigma / math.sqrt(len(times_ms))
    return sem / med if med > 0 else 0.0


def stats(times_ms: list[float], clock: str, flushed: bool, mode: str = "") -> TimingStats:
    med = statistics.median(times_ms)
    std = statistics.stdev(times_ms) if len(times_ms) > 1 else 0.0
    sem = 1.2533 * std / math.sqrt(len(times_ms))
    return TimingStats(
        clock=clock,  # type: ignore[arg-type]
        mode=mode or ("events" if clock == "cuda_events" else "cpu"),  # type: ignore[arg-type]
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


#: the fewest repetitions that meet min_reps by their time (the median of three survives one
#: outlier)
_MIN_TIMED_REPS = 3


def _long_enough(times: list[float], policy: TimingPolicy) -> bool:
    """Do the repetitions meet min_reps by their time: at least _MIN_TIMED_REPS of them adding
    up to the policy's min_reps_time_s?"""
    return (
        policy.min_reps_time_s > 0
        and len(times) >= _MIN_TIMED_REPS
        and sum(times) >= policy.min_reps_time_s * 1e3
    )


def _enough(
    times: list[float], policy: TimingPolicy, t_end: float, *, robust: bool = False
) -> bool:
    if len(times) >= policy.max_reps:
        return True
    if len(times) < policy.min_reps and not _long_enough(times, policy):
        return False
    return _rel_sem(times, robust=robust) <= policy.target_rel_sem or time.perf_counter() > t_end


def _batch_size(estimate_ms: float, policy: TimingPolicy, done: int) -> int:
    """Repetitions for the next batch: about _BATCH_S of device time, at least what min_reps
    still needs (by count, or by time at `estimate_ms` a call when that needs fewer), never
    past max_reps."""
    per = max(estimate_ms, 1e-3) / 1e3
    need = policy.min_reps - done
    if policy.min_reps_time_s > 0:
        by_time = max(_MIN_TIMED_REPS, math.ceil(policy.min_reps_time_s / per)) - done
        need = min(need, by_time)
    n = max(1, int(_BATCH_S / per), need)
    return max(1, min(n, policy.max_reps - done))


def _syncs(fn: Callable[[], object], device: torch.device) -> str | None:
    """Run `fn` once with torch's sync debug mode set to error: the text of the first host
    synchronisation it makes (such a call cannot be captured), or None."""
    torch.cuda.synchronize(device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
    except RuntimeError as exc:
        if "synchroniz" not in str(exc):
            raise
        return " ".join(str(exc).split())[:200]
    finally:
        torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize(device)
    return None


def _restore_after_failed_capture(device: torch.device) -> None:
    """A capture that raised leaves the default CUDA generator marked as capturing (the next
    random draw fails with "Offset increment outside graph capture"): one trivial capture that
    ends normally clears the mark. Checked with a draw."""
    torch.cuda.synchronize(device)
    scratch = torch.zeros(1, device=device)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        scratch.add_(1)
    del g
    torch.randn(1, device=device)
    torch.cuda.synchronize(device)


#: failed captures whose allocator pool _end_failed_capture handed back (research probes read it)
pools_ended = 0


def _end_failed_capture(pool: Any, device: torch.device) -> None:
    """Hand a failed capture's memory pool back to the caching allocator. torch's capture_end
    ends the stream capture before it tells the allocator the capture is over, so a capture
    the driver invalidated leaves its pool registered as capturing for the rest of the process
    (and CUDAGraph.pool() refuses to name it: the capture did not succeed, hence kassay's own
    pool handle). While any capture is underway the allocator defers every block freed with
    pending stream uses and never frees them: an executor's reserved memory then only grows
    (5960 MiB over six timed cases on the H200, tests/gpu/test_timing_gpu.py) and empty_cache
    cannot give it back. Ending the pool is refused when the capture did end it. Private torch
    calls, the ones torch.cuda.use_mem_pool makes: there is no public one for a failed capture."""
    global pools_ended
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        torch._C._cuda_endAllocateToPool(index, pool)
    except Exception:
        return
    torch._C._cuda_releasePool(index, pool)
    pools_ended += 1


def _capture(
    fn: Callable[[], object], device: torch.device, *, reps: int = 1, flush: torch.Tensor | None
) -> tuple[Any | None, str | None]:
    """A CUDA graph of `reps` calls (each after the flush, when given), or (None, why not).
    The call has run (warm-up) before, so its kernels are compiled and its pools exist."""
    stream = _capture_streams.get(device)
    if stream is None:
        stream = _capture_streams[device] = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    graph = torch.cuda.CUDAGraph()
    pool = torch.cuda.graph_pool_handle()  # a fresh private pool, as without it, but named
    try:
        with torch.cuda.stream(stream):
            fn()  # one more eager call on the capture stream (cuBLAS workspaces, lazy init)
        torch.cuda.current_stream(device).wait_stream(stream)
        torch.cuda.synchronize(device)
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            for _ in range(reps):
                if flush is not None:
                    _flush(flush)
                fn()
        torch.cuda.synchronize(device)
    except Exception as exc:
        _end_failed_capture(pool, device)
        _restore_after_failed_capture(device)
        text = " ".join(str(exc).split())
        return None, f"{type(exc).__name__}: {text[:200]}"
    return graph, None


def _flush(buf: torch.Tensor) -> None:
    # A fill kernel, not a memset: inside a CUDA graph a memset may run on a copy engine.
    buf.fill_(1)


#: GPU clock cycles of the spin kernel enqueued ahead of each batch (~1 ms at 2 GHz)
_LEAD_CYCLES = 2_000_000


def _lead(device: torch.device) -> None:
    """Keep the device busy (untimed) while the host enqueues a batch's first repetition: after
    the previous batch's synchronise the device is idle, and without a lead the first
    repetition's events counted the host's enqueueing (2-5x the device time of a 2-4 ms call
    on the H200). torch.cuda._sleep is the spin kernel torch's own tests use."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        with torch.cuda.device(device):
            sleep(_LEAD_CYCLES)


def _device_times(
    call: Callable[[], object],
    device: torch.device,
    policy: TimingPolicy,
    estimate_ms: float,
    *,
    flush: bool,
    per_call: int = 1,
    baseline: Callable[[], object] | None = None,
    lead: bool = True,
) -> list[float]:
    """Per-call device times (ms). Repetitions are enqueued in batches with the host synced
    once per batch; each is bracketed by CUDA events (the flush, when asked, enqueued before
    the start event). With `per_call` > 1 one repetition runs that many calls; with `baseline`,
    a repetition of it is timed right after each one and subtracted (both graphs pay one
    launch and the same flushes, which the difference removes)."""
    buf = _flush_buffer(device) if flush else None
    times: list[float] = []
    t_end = time.perf_counter() + policy.budget_s
    while not _enough(times, policy, t_end, robust=True):
        n = _batch_size(estimate_ms * per_call, policy, len(times))
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(4 * n)]
        if lead:
            _lead(device)
        for i in range(n):
            if buf is not None:
                _flush(buf)
            marks[4 * i].record()
            call()
            marks[4 * i + 1].record()
            if baseline is not None:
                marks[4 * i + 2].record()
                baseline()
                marks[4 * i + 3].record()
        marks[4 * n - 3 if baseline is None else 4 * n - 1].synchronize()
        for i in range(n):
            t = marks[4 * i].elapsed_time(marks[4 * i + 1])
            if baseline is not None:
                t -= marks[4 * i + 2].elapsed_time(marks[4 * i + 3])
            times.append(t / per_call)
        estimate_ms = max(statistics.median(times), 1e-4)
    return times


def _wall_times(
    fn: Callable[[], object], device: torch.device, policy: TimingPolicy, reps: int
) -> tuple[list[float], list[float]]:
    """Host-side times (ms) of whole calls: launch + device + synchronise; and of their
    enqueueing alone (until `fn` returns, before the synchronise)."""
    buf = _flush_buffer(device) if policy.flush_l2 else None
    wall: list[float] = []
    enqueue: list[float] = []
    for _ in range(reps):
        if buf is not None:
            _flush(buf)
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize(device)
        wall.append((time.perf_counter() - t0) * 1e3)
        enqueue.append((t1 - t0) * 1e3)
    return wall, enqueue


def _warm_up(fn: Callable[[], object], device: torch.device, runs: int) -> None:
    """Up to `runs` calls; one is enough for a long call (each more costs as much as a
    repetition)."""
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        if time.perf_counter() - t0 >= _LONG_MS / 1e3:
            break


#: below this device time per call a graph launch's few microseconds matter: the call is
#: captured several times into one graph (about _UNROLL_DEVICE_MS of work) and a graph of the
#: flushes alone is subtracted
_UNROLL_BELOW_MS = 1.0
_UNROLL_DEVICE_MS = 2.0
#: a graph replay must beat direct calls by this much to be chosen
_GRAPH_GAIN = 0.9
#: a call at least this long (wall ms) that the host enqueues in under _HOST_AHEAD of its time
#: keeps the device busy when called back to back: no graph is tried and the wall figure takes
#: two calls (one after a long run of the engine's). What it saves is repetitions of the long
#: calls that dominate a CI grid (a float32 flce case at N=8192 V=128256 takes ~0.4 s a call
#: and was called ~29 times to be timed). With the host at most half as busy as the device a
#: graph cannot be faster by _GRAPH_GAIN unless it changes what runs, which is no reason to
#: choose it.
_LONG_MS = 5.0
_HOST_AHEAD = 0.5


def _quick(call: Callable[[], object], device: torch.device, flush: bool) -> float:
    return statistics.median(
        # no lead: a few calls enqueued behind it would hide a host that cannot keep up, and
        # this estimate is what tells direct calls from a graph
        _device_times(
            call, device, TimingPolicy(min_reps=5, max_reps=5), 1.0, flush=flush, lead=False
        )
    )


def time_call(
    fn: Callable[[], object],
    device: torch.device,
    policy: TimingPolicy,
    *,
    capture_key: str | None = None,
    ran_ms: float | None = None,
) -> TimingStats:
    """Time `fn` (which runs one whole case: e.g. forward + backward) per `policy`: device
    time as the headline, wall time and host overhead beside it. `capture_key` names what `fn`
    calls (the engine passes op/impl): once a capture of it failed, later calls with the same
    key are timed as events without trying again (the reason says so). `ran_ms`: the wall
    time of a call of `fn` made just before (the engine's run for the outputs); when that was a
    long call, it was the warm-up and no other is made.

    The mode is chosen per call by measuring both. Direct calls back to back (`events`) time
    exactly what runs eagerly, and keep the device busy whenever the host enqueues a call faster
    than the device runs it. When the host is the slower side (a short kernel behind a Python
    wrapper) the device waits for it between events; then a CUDA-graph replay of the call is
    faster, and taken (`graph`). A graph can also change what runs (a copy captured as a graph
    node may run on a copy engine), which is why it must be faster to be chosen. A short call
    is captured several times into one graph and a graph of the flushes alone is subtracted,
    so a graph launch's latency is not counted either."""
    if device.type != "cuda":
        return _time_cpu(fn, policy)
    ran_long = ran_ms is not None and ran_ms >= _LONG_MS
    if not ran_long:
        _warm_up(fn, device, policy.warmup)
    torch.cuda.synchronize(device)
    # after a long run of the engine's one wall call is enough to tell a long call (~0.5 s of
    # float32 flce a call, twice in a CI grid's four slowest cases)
    first = 1 if ran_long else 2
    wall, enqueue = _wall_times(fn, device, policy, first)
    long_call = statistics.median(wall) >= _LONG_MS
    if not long_call:
        more, more_enq = _wall_times(
            fn, device, policy, max(0, min(_WALL_REPS, policy.max_reps) - first)
        )
        wall, enqueue = wall + more, enqueue + more_enq
    wall_ms, enqueue_ms = statistics.median(wall), statistics.median(enqueue)
    host_ahead = long_call and enqueue_ms < _HOST_AHEAD * wall_ms
    flush = policy.flush_l2
    buf = _flush_buffer(device) if flush else None
    direct_ms = wall_ms if host_ahead else _quick(fn, device, flush)
    why: str | None
    graph: Any = None
    flushes: Any = None
    per_call = 1
    if not policy.cuda_graph:
        why = "disabled by the timing policy"
    elif host_ahead:
        why = (
            f"a long call ({wall_ms:.4g} ms) that the host enqueues in {enqueue_ms:.3g} ms: "
            "direct calls keep the device busy"
        )
    else:
        failed = _capture_failures.get((device, capture_key)) if capture_key else None
        syncing = None if failed else _syncs(fn, device)
        if failed is not None:
            why = f"a capture of {capture_key} failed earlier in this process ({failed})"
        elif syncing is not None:
            why = f"the call synchronises with the host ({syncing})"
        else:
            graph, why = _capture(fn, device, reps=1, flush=None)
            if graph is None and capture_key and why:
                _capture_failures[(device, capture_key)] = why
    if graph is not None:
        replay_ms = _quick(graph.replay, device, flush)
        if replay_ms >= _GRAPH_GAIN * direct_ms:
            graph = None
            why = (
                f"direct calls keep the device busy (graph replay {replay_ms:.4g} ms, "
                f"direct {direct_ms:.4g} ms)"
            )
        elif replay_ms < _UNROLL_BELOW_MS:
            per_call = max(1, min(100, int(_UNROLL_DEVICE_MS / max(replay_ms, 1e-3))))
            if per_call > 1:
                many, _ = _capture(fn, device, reps=per_call, flush=buf)
                if buf is not None:
                    flushes, _ = _capture(lambda: None, device, reps=per_call, flush=buf)
                if many is not None and (buf is None or flushes is not None):
                    graph = many
                else:
                    flushes, per_call = None, 1
    sampler = GpuSampler(device).start()
    try:
        if graph is not None:
            times = _device_times(
                graph.replay,
                device,
                policy,
                direct_ms,
                flush=flush and per_call == 1,
                per_call=per_call,
                baseline=flushes.replay if flushes is not None else None,
            )
        else:
            times = _device_times(fn, device, policy, direct_ms, flush=flush)
    finally:
        state = sampler.stop()
        del graph, flushes
    out = stats(times, "cuda_events", flush, "events" if why else "graph")
    out.graph_fallback = why
    out.wall_median_ms = wall_ms
    out.host_overhead_ms = max(0.0, wall_ms - out.median_ms)
    out.sm_clock_mhz = state.sm_clock_mhz
    out.power_w = state.power_w
    out.power_limit_w = state.power_limit_w
    out.throttle_reasons = state.throttle_reasons
    out.power_capped = state.power_capped
    return out


def _time_cpu(fn: Callable[[], object], policy: TimingPolicy) -> TimingStats:
    for _ in range(policy.warmup):
        fn()
    # perf_counter measures what a caller waits; process_time the CPU the executor spends (all
    # threads), which other processes on a shared host cannot inflate.
    clock = time.process_time if policy.cpu_clock == "process" else time.perf_counter
    # The calibration right after each repetition, on the same clock: paired, so that the
    # host's speed is taken at the moment the repetition ran (a shared host drifts within a
    # job too).
    cal = host_calibration() if policy.cpu_calibration else None
    if cal is not None:
        for _ in range(max(1, policy.warmup)):
            cal()
    times: list[float] = []
    cal_times: list[float] = []
    t_start = time.perf_counter()
    t_end = t_start + policy.budget_s
    pressure = PressureWindow()
    while not _enough(times, policy, t_end):
        t0 = clock()
        fn()
        t1 = clock()
        times.append((t1 - t0) * 1e3)
        if cal is not None:
            cal()
            cal_times.append((clock() - t1) * 1e3)
    waited = pressure.share(time.perf_counter() - t_start)
    label = "cpu_process_time" if policy.cpu_clock == "process" else "cpu_perf_counter"
    out = stats(times, label, False, "cpu")
    out.cpu_pressure = None if waited is None else round(waited, 4)
    out.wall_median_ms = out.median_ms
    out.host_overhead_ms = 0.0
    if cal is not None:
        out.calibration = cal.name
        out.calibration_ms = cal_times
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
