"""The worker's Prometheus metrics, served on a port of their own (KASSAY_WORKER_METRICS_LISTEN;
the gRPC port speaks only gRPC, and a scraper needs no worker token).

- cases by op, impl and status, and their durations (histograms by op and impl), counted as
  results stream out of the worker;
- executor restarts (a case that crashed, hung or poisoned its device costs one);
- the state of each GPU this worker may use, read through NVML at scrape time: utilization,
  memory, power, SM clock. A worker without a GPU, NVML or driver exports no GPU series at all
  (absent, never zeros: a zero would read as an idle card).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kassay.contract.results import CaseResult

log = logging.getLogger(__name__)

#: case durations: CPU cases take milliseconds, timed GPU cases seconds, big grids minutes
CASE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
# an impl runner start (sandbox, Python, torch, the artifacts' imports) takes seconds; cold caches more
RUNNER_START_BUCKETS = (0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120)


def load_nvml() -> Any | None:
    """The initialised `pynvml` module, or None (no binding, no driver)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


def visible_handles(nvml: Any, visible: str | None) -> list[tuple[str, Any]]:
    """(label, NVML handle) of each GPU this process may use: those CUDA_VISIBLE_DEVICES names
    (indices or UUIDs) when it is set, else every GPU NVML sees. The label is the NVML index
    (the host's numbering, as nvidia-smi shows it)."""
    count = int(nvml.nvmlDeviceGetCount())
    if visible is None:
        picks: list[Any] = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    else:
        picks = []
        for entry in (e.strip() for e in visible.split(",")):
            if not entry or entry.startswith("-"):
                break  # CUDA ignores everything from the first invalid entry on
            with contextlib.suppress(Exception):
                picks.append(
                    nvml.nvmlDeviceGetHandleByIndex(int(entry))
                    if entry.isdigit()
                    else nvml.nvmlDeviceGetHandleByUUID(entry)
                )
    out = []
    for h in picks:
        index = str(nvml.nvmlDeviceGetIndex(h))
        out.append((index, h))
    return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GpuCollector(Collector):
    """NVML read at scrape time for the GPUs `handles()` names; no GPU, no series."""

    def __init__(self, nvml: Any, handles: Callable[[], list[tuple[str, Any]]]) -> None:
        self.nvml = nvml
        self.handles = handles

    def collect(self) -> Iterator[GaugeMetricFamily]:
        nv = self.nvml
        labels = ["gpu", "uuid", "name"]
        util = GaugeMetricFamily(
            "kassay_gpu_utilization_ratio",
            "GPU busy fraction (NVML, last sample period)",
            labels=labels,
        )
        used = GaugeMetricFamily(
            "kassay_gpu_memory_used_bytes", "device memory used", labels=labels
        )
        total = GaugeMetricFamily("kassay_gpu_memory_total_bytes", "device memory", labels=labels)
        power = GaugeMetricFamily("kassay_gpu_power_watts", "board power draw", labels=labels)
        clock = GaugeMetricFamily("kassay_gpu_sm_clock_hertz", "SM clock", labels=labels)
        try:
            handles = self.handles()
        except Exception as exc:  # a driver gone away: report nothing rather than fail the scrape
            log.warning("NVML: %s", exc)
            handles = []
        for index, h in handles:
            try:
                key = [index, _text(nv.nvmlDeviceGetUUID(h)), _text(nv.nvmlDeviceGetName(h))]
            except Exception:
                continue
            # each reading on its own: a card that does not report power still reports the rest
            with contextlib.suppress(Exception):
                util.add_metric(key, nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0)
            with contextlib.suppress(Exception):
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                used.add_metric(key, float(mem.used))
                total.add_metric(key, float(mem.total))
            with contextlib.suppress(Exception):
                power.add_metric(key, nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
            with contextlib.suppress(Exception):
                clock.add_metric(key, nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM) * 1e6)
        for family in (util, used, total, power, clock):
            if family.samples:
                yield family


class _Restarts(Collector):
    def __init__(self, read: Callable[[], int]) -> None:
        self.read = read

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "kassay_worker_executor_restarts",
            "executors restarted after a crash, hang or poisoned device",
            value=self.read(),
        )


class WorkerMetrics:
    """Every metric a worker exports, in a registry of its own."""

    def __init__(
        self,
        *,
        restarts: Callable[[], int],
        device: str,
        nvml_loader: Callable[[], Any | None] = load_nvml,
        cuda_visible: str | None = None,
    ) -> None:
        """`restarts` reads the supervisor's count; `device` is the worker's (no GPU series for
        cpu); `nvml_loader` the NVML boundary (tests give a fake one); `cuda_visible`: the
        CUDA_VISIBLE_DEVICES the worker runs under (default: its environment's)."""
        self.registry = r = CollectorRegistry()
        self.cases = Counter(
            "kassay_worker_cases", "cases run, by result", ["op", "impl", "status"], registry=r
        )
        self.case_seconds = Histogram(
            "kassay_worker_case_seconds",
            "a case's duration (inputs, reference share, runs, timing)",
            ["op", "impl"],
            buckets=CASE_BUCKETS,
            registry=r,
        )
        r.register(_Restarts(restarts))
        self.runner_starts = Counter(
            "kassay_worker_runner_starts",
            "impl runners started for code jobs' uploaded code, by outcome (ready, failed)",
            ["outcome"],
            registry=r,
        )
        self.runner_start_seconds = Histogram(
            "kassay_worker_runner_start_seconds",
            "an impl runner's start: sandbox, Python, torch and the artifacts' imports",
            buckets=RUNNER_START_BUCKETS,
            registry=r,
        )
        self.gpus: GpuCollector | None = None
        if device.startswith("cuda") or device == "auto":
            nvml = nvml_loader()
            if nvml is not None:
                visible = (
                    cuda_visible
                    if cuda_visible is not None
                    else os.environ.get("CUDA_VISIBLE_DEVICES")
                )
                self.gpus = GpuCollector(nvml, lambda: visible_handles(nvml, visible))
                r.register(self.gpus)

    def observe(self, result: CaseResult) -> None:
        self.cases.labels(result.op, result.impl, result.status).inc()
        self.case_seconds.labels(result.op, result.impl).observe(result.duration_s)

    def observe_runner_start(self, ok: bool, seconds: float) -> None:
        self.runner_starts.labels("ready" if ok else "failed").inc()
        self.runner_start_seconds.observe(seconds)

    def serve(self, listen: str) -> tuple[int, Callable[[], None]]:
        """Serve /metrics on HOST:PORT (a thread; port 0 picks one); returns the port and how
        to stop it."""
        from prometheus_client import start_http_server

        host, _, port = listen.rpartition(":")
        addr = host.strip("[]") or "0.0.0.0"
        server, thread = start_http_server(int(port), addr=addr, registry=self.registry)

        def stop() -> None:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)

        return int(server.server_port), stop
