"""What FastAPI cannot infer for the OpenAPI schema: the job-spec request body and the JSON
report (both typed, with an example each), and the auth schemes (a bearer token on every
operation; reads also accept the session cookie a browser gets at /login, and need nothing
when reads are open)."""

from __future__ import annotations

from typing import Any

from kassay.contract.results import (
    CaseResult,
    Environment,
    MemoryStats,
    OutputMetrics,
    Report,
    Summary,
    TimingStats,
    WorstEntry,
)
from kassay.contract.spec import JobSpec

JOB_SPEC_EXAMPLE: dict[str, Any] = {
    "name": "flce-ci",
    "labels": {"repo": "kernels", "branch": "main", "commit": "3f2a9c1"},
    "suites": [
        {
            "op": "flce",
            "impls": ["torch", "kassay"],
            "baseline": "torch",
            "params": {"N": [1024, 4096], "H": 1024, "V": 32000, "dtype": "bfloat16"},
            "regimes": ["normal"],
        }
    ],
}

JOB_SPEC_YAML_EXAMPLE = """name: flce-ci
labels: {branch: main, commit: 3f2a9c1}
suites:
  - op: flce
    impls: [torch, kassay]
    params: {N: [1024, 4096], H: 1024, V: 32000, dtype: bfloat16}
"""


def report_example() -> dict[str, Any]:
    """A one-case report, as GET /v1/jobs/{id}/report returns it."""
    env = Environment(
        device="cuda:0",
        device_name="NVIDIA H200",
        driver="570.86",
        cuda="12.8",
        torch="2.13.0",
        triton="3.9.0",
        kassay="0.1.0",
        python="3.11.2",
        hostname="gpu-7",
        clocks={"sm_max_mhz": "1980"},
        ceilings={"matmul_tflops": 700.0, "copy_gbps": 3900.0},
    )
    case = CaseResult(
        case_id="s0-flce-kassay-3",
        group_id="g3",
        op="flce",
        impl="kassay",
        params={"N": 4096, "H": 1024, "V": 32000, "dtype": "bfloat16"},
        regime="normal",
        seed=0,
        dtype="bfloat16",
        status="passed",
        outputs=[
            OutputMetrics(
                name="grad_input",
                dtype="bfloat16",
                expected_dtype="bfloat16",
                shape=[4096, 1024],
                max_abs=3.1e-4,
                max_rel=0.0078,
                rel_l2=0.0021,
                max_ulp=2,
                nan=0,
                inf=0,
                ref_nan=0,
                ref_inf=0,
                worst=[
                    WorstEntry(index=[17, 903], value=0.0412, reference=0.04089, abs_err=3.1e-4)
                ],
                threshold_max_abs=6.5e-4,
                threshold_rel_l2=0.0049,
                baseline_max_abs=3.0e-4,
                baseline_rel_l2=0.0022,
            )
        ],
        timing=TimingStats(
            clock="cuda_events",
            mode="graph",
            n=50,
            median_ms=1.52,
            mean_ms=1.53,
            std_ms=0.01,
            p10_ms=1.51,
            p90_ms=1.55,
            rel_sem=0.002,
            l2_flushed=True,
            tflops=528.4,
            gbps=44.7,
            roofline_fraction=0.75,
            speedup_vs_baseline=1.9,
            wall_median_ms=1.6,
            host_overhead_ms=0.08,
            samples_ms=[1.51, 1.52, 1.52, 1.55],
        ),
        memory=MemoryStats(
            measured=True, peak_extra_bytes=84_000_000, model_bytes=75_497_472, ratio_to_model=1.11
        ),
        duration_s=0.9,
        worker="gpu-7:50051",
        device="cuda:0",
        environment=env,
    )
    report = Report(
        job_id="j_3b1f0c2a9d7e4f11",
        name="flce-ci",
        labels={"branch": "main", "commit": "3f2a9c1"},
        environments=[env],
        summary=Summary.of([case]),
        cases=[case],
    )
    return report.model_dump(mode="json")


def _merge(components: dict[str, Any], schema: dict[str, Any], name: str) -> None:
    for k, v in schema.pop("$defs", {}).items():
        components.setdefault(k, v)
    components[name] = schema


def complete(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` (FastAPI's) with the spec and report typed, examples and security schemes."""
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    ref = "#/components/schemas/{model}"
    _merge(schemas, JobSpec.model_json_schema(ref_template=ref), "JobSpec")
    _merge(schemas, Report.model_json_schema(ref_template=ref, mode="serialization"), "Report")
    paths = schema.get("paths", {})
    body = paths.get("/v1/jobs", {}).get("post", {}).get("requestBody", {}).get("content", {})
    if "application/json" in body:
        body["application/json"]["example"] = JOB_SPEC_EXAMPLE
    if "application/yaml" in body:
        body["application/yaml"]["example"] = JOB_SPEC_YAML_EXAMPLE
    ok = paths.get("/v1/jobs/{job_id}/report", {}).get("get", {}).get("responses", {}).get("200")
    if ok is not None:
        ok.setdefault("content", {})["application/json"] = {
            "schema": {"$ref": "#/components/schemas/Report"},
            "example": report_example(),
        }
    components["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "a token from KASSAY_API_TOKENS (write), KASSAY_READ_TOKENS (read) "
            "or KASSAY_CODE_TOKENS (code); reads need none while KASSAY_OPEN_READS is true",
        },
        "session": {
            "type": "apiKey",
            "in": "cookie",
            "name": "kassay_session",
            "description": "a browser's session from POST /login: reads only",
        },
    }
    for item in paths.values():
        for method, op in item.items():
            if not isinstance(op, dict):
                continue
            # reads: a token, a browser session, or nothing when reads are open
            op["security"] = (
                [{"bearer": []}, {"session": []}, {}] if method == "get" else [{"bearer": []}]
            )
    return schema
