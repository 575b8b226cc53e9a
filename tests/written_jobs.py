"""Jobs through the API in-process with the dispatcher idle: submitted over HTTP, their results
written to the store as a worker's would be (lse_merge, torch and te_style, timed with CUDA
events on a named device). For the compare, series and dashboard tests."""

from __future__ import annotations

from typing import Any

from kassay.contract.results import Environment, MemoryStats, OutputMetrics
from kassay.validate.case_result import case_result
from kassay.validate.timing import stats

H200 = Environment(
    device="cuda:0", device_name="NVIDIA H200", torch="2", kassay="0", python="3", hostname="a"
)
A100 = H200.model_copy(update={"device_name": "NVIDIA A100"})
SPEC: dict[str, Any] = {
    "name": "ci",
    "suites": [
        {
            "op": "lse_merge",
            "impls": ["torch", "te_style"],
            "params": {"T": 8, "Hh": 2, "D": 4, "dtype": "float32"},
            "regimes": ["normal"],
            "coverage": "none",
        }
    ],
}


def _output(error: float) -> OutputMetrics:
    return OutputMetrics(
        name="out",
        dtype="float32",
        expected_dtype="float32",
        shape=[8, 2, 4],
        max_abs=10 * error,
        max_rel=error,
        rel_l2=error,
        max_ulp=1,
        nan=0,
        inf=0,
        ref_nan=0,
        ref_inf=0,
    )


def finished_job(
    client: Any,
    labels: dict[str, str],
    *,
    slow: float = 1.0,
    env: Environment = H200,
    spec: dict[str, Any] | None = None,
    commit: str = "c",
    torch_status: str = "passed",
    error: float = 1e-7,
    peak_bytes: int = 1 << 20,
) -> str:
    """Submit a job (`client`: the app's TestClient) and write each case's result: te_style
    timed `slow` times torch's, torch's status `torch_status`; one output `out` with rel_l2
    `error` (max_abs 10x it) and `peak_bytes` of peak extra memory. Its id."""
    body = {**(spec or SPEC), "labels": {**labels, "commit": commit}}
    job = client.post("/v1/jobs", json=body).json()
    store = client.app.state.services.store
    for job_id, group in store.queue.pending_groups():
        assert job_id == job["id"]
        for impl in group.impls:
            factor = slow if impl == "te_style" else 1.0
            samples = [factor * (1 + 0.001 * (i % 7)) for i in range(50)]
            store.results.record_result(
                job["id"],
                case_result(
                    group,
                    impl,
                    torch_status if impl == "torch" else "passed",  # type: ignore[arg-type]
                    timing=stats(samples, "cuda_events", True),
                    outputs=[_output(error)],
                    memory=MemoryStats(measured=True, peak_extra_bytes=peak_bytes, model_bytes=1),
                    environment=env,
                ),
            )
        store.queue.finish_group(job["id"], group.group_id)
    store.results.add_environment(job["id"], env.model_dump(mode="json"))
    assert client.get(f"/v1/jobs/{job['id']}").json()["state"] == "finished"
    return str(job["id"])
