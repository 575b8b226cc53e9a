"""The worker's /metrics: cases by op/impl/status with durations, executor restarts, and GPU
gauges from NVML (a fake NVML stands in for the driver: the only boundary replaced)."""

from __future__ import annotations

from fake_nvml import FakeNvml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kassay.contract.results import CaseResult
from kassay.worker.server.metrics import WorkerMetrics


def samples(m: WorkerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(m.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def _result(impl: str, status: str, seconds: float) -> CaseResult:
    return CaseResult(
        case_id=f"g:{impl}",
        group_id="g",
        op="lse_merge",
        impl=impl,
        params={},
        regime="normal",
        seed=0,
        dtype="float32",
        status=status,  # type: ignore[arg-type]
        duration_s=seconds,
    )


def test_cases_durations_and_restarts() -> None:
    restarts = [0]
    m = WorkerMetrics(restarts=lambda: restarts[0], device="cpu")
    m.observe(_result("torch", "passed", 0.02))
    m.observe(_result("kassay", "failed", 3.0))
    m.observe(_result("kassay", "failed", 0.2))
    restarts[0] = 2
    got = samples(m)
    key = (("impl", "kassay"), ("op", "lse_merge"), ("status", "failed"))
    assert got[("kassay_worker_cases_total", key)] == 2
    assert got[("kassay_worker_case_seconds_count", (("impl", "kassay"), ("op", "lse_merge")))] == 2
    assert got[("kassay_worker_case_seconds_sum", (("impl", "kassay"), ("op", "lse_merge")))] == 3.2
    bucket = (("impl", "kassay"), ("le", "1.0"), ("op", "lse_merge"))
    assert got[("kassay_worker_case_seconds_bucket", bucket)] == 1
    assert got[("kassay_worker_executor_restarts_total", ())] == 2


def test_runner_starts_by_outcome_with_their_durations() -> None:
    m = WorkerMetrics(restarts=lambda: 0, device="cpu")
    assert ("kassay_worker_runner_starts_total", (("outcome", "ready"),)) not in samples(m)
    m.observe_runner_start(True, 1.5)
    m.observe_runner_start(True, 2.5)
    m.observe_runner_start(False, 0.25)
    got = samples(m)
    assert got[("kassay_worker_runner_starts_total", (("outcome", "ready"),))] == 2
    assert got[("kassay_worker_runner_starts_total", (("outcome", "failed"),))] == 1
    assert got[("kassay_worker_runner_start_seconds_count", ())] == 3
    assert got[("kassay_worker_runner_start_seconds_sum", ())] == 4.25
    assert got[("kassay_worker_runner_start_seconds_bucket", (("le", "2.0"),))] == 2


def test_gpu_gauges_from_nvml_for_the_visible_cards() -> None:
    nvml = FakeNvml()
    m = WorkerMetrics(restarts=lambda: 0, device="cuda:0", nvml_loader=lambda: nvml)
    got = samples(m)
    card0 = (("gpu", "0"), ("name", "NVIDIA H200"), ("uuid", "GPU-aaaa"))
    card1 = (("gpu", "1"), ("name", "NVIDIA H200"), ("uuid", "GPU-bbbb"))
    assert got[("kassay_gpu_utilization_ratio", card0)] == 0.37
    assert got[("kassay_gpu_memory_used_bytes", card0)] == 3 << 30
    assert got[("kassay_gpu_memory_total_bytes", card1)] == 80 << 30
    assert got[("kassay_gpu_power_watts", card0)] == 250.5
    assert got[("kassay_gpu_sm_clock_hertz", card1)] == 1980e6
    # card 1 reports no power: its power series is absent, not 0
    assert ("kassay_gpu_power_watts", card1) not in got

    # CUDA_VISIBLE_DEVICES=GPU-bbbb: this worker's card only
    only = WorkerMetrics(
        restarts=lambda: 0, device="cuda:0", nvml_loader=lambda: nvml, cuda_visible="GPU-bbbb"
    )
    gpus = {k[1] for k in samples(only) if k[0].startswith("kassay_gpu_")}
    assert gpus == {card1}


def test_no_gpu_no_gpu_series() -> None:
    """A CPU worker, or one whose NVML does not load: the GPU gauges are absent, not zeros."""
    for m in (
        WorkerMetrics(restarts=lambda: 0, device="cpu", nvml_loader=FakeNvml),
        WorkerMetrics(restarts=lambda: 0, device="cuda:0", nvml_loader=lambda: None),
    ):
        text = generate_latest(m.registry).decode()
        assert "kassay_gpu_" not in text
        assert "kassay_worker_executor_restarts_total 0.0" in text
