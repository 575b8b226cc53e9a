"""The CI signal (#32): `kassay submit --wait` piped to a file, as GitHub Actions and GitLab run
it (no terminal), writes a log like pytest's: progress lines while it waits, then one line per
case that did not pass (its short name, the limit it broke and by how much), then one summary
line with the job page's URL."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import yaml
from users import KASSAY

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]

#: the smoke job plus a kernel that never writes out, as the issue's reproduction had it
BROKEN = {
    "op": "lse_merge",
    "impls": ["torch", "m_zeros"],
    "params": {"T": 64, "Hh": 4, "D": 32, "K": [2, 4], "dtype": ["float32", "float16"]},
    "regimes": ["normal", "huge"],
    "coverage": "none",
    "timing": {"enabled": False},
}
SPEC = {
    "name": "ci-log",
    "suites": [
        {
            "op": "lse_merge",
            "impls": ["torch", "m_zeros"],  # a kernel that never writes out: every case fails
            "params": {"T": 16, "Hh": 2, "D": 8, "K": 3, "dtype": ["float32", "float16"]},
            "regimes": ["normal", "huge"],
            "timing": {"enabled": False},
        }
    ],
}


def test_a_piped_wait_writes_a_short_log_with_failures_first(procs, tmp_path: Path) -> None:
    w = procs.worker(env={"KASSAY_ENABLE_MUTANTS": "true"}, case_timeout_s=120.0)
    api = procs.api([w], enable_mutants="true")
    try:
        procs.wait_ready(api, w)
        smoke = yaml.safe_load((ROOT / "examples" / "smoke.yaml").read_text())
        smoke["suites"].append(BROKEN)
        spec = tmp_path / "spec.yaml"
        spec.write_text(yaml.safe_dump(smoke))
        env = procs.env(
            {
                "KASSAY_SERVER": api.extra["url"],
                "KASSAY_TOKEN": procs.write_token,
                "KASSAY_PROGRESS_S": "0.05",
            }
        )
        env.pop("COLUMNS", None)
        with open(tmp_path / "ci.log", "w") as out, open(tmp_path / "ci.err", "w") as err:
            done = subprocess.run(
                [*KASSAY, "submit", str(spec), "--wait"],
                stdout=out,
                stderr=err,
                env=env,
                timeout=540,
            )
        log = (tmp_path / "ci.log").read_text().splitlines()
        progress = (tmp_path / "ci.err").read_text()
    finally:
        api.stop()
        w.stop()
    assert done.returncode == 1, (log, progress)
    failed = [line for line in log if line.startswith("FAILED")]
    assert failed and len(log) == len(failed) + 1, log  # nothing else: no table, no wrapping
    for line in failed:
        assert line.startswith("FAILED   lse_merge.m_zeros "), line  # the smoke job passes
        assert "out: output is all zeros" in line or "> limit" in line, line
        assert len(line) < 240, line
    assert any("dtype=float16 [huge]" in line for line in failed), failed
    total = int(log[-1].split(" cases ·")[0].rsplit("· ", 1)[1])
    assert total > 150 and len(log) <= 80, (total, len(log))
    summary = log[-1]
    assert summary.startswith(f"kassay: {len(failed)} failed, ")
    assert f"{len(failed)} failed" in summary and "exit 1" in summary
    assert f"{api.extra['url']}/jobs/job_" in summary, summary
    assert "cases done" in progress and "failed" in progress, progress
    assert "Traceback" not in progress


def test_kassay_run_and_submit_wait_print_the_same_summary(procs, tmp_path: Path) -> None:
    """#43: one summary and one exit-code table. The same spec run in-process (`kassay run`)
    and on a server (`kassay submit --wait`), both piped as in CI: the same lines, case by
    case, and the same exit code; only what the last line points to differs (the report file,
    the job's page)."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    w = procs.worker(env={"KASSAY_ENABLE_MUTANTS": "true"}, case_timeout_s=120.0)
    api = procs.api([w], enable_mutants="true")
    try:
        procs.wait_ready(api, w)
        env = procs.env({"KASSAY_SERVER": api.extra["url"], "KASSAY_TOKEN": procs.write_token})
        served = subprocess.run(
            [*KASSAY, "submit", str(spec), "--wait", "--quiet"],
            env=env,
            capture_output=True,
            text=True,
            timeout=540,
        )
    finally:
        api.stop()
        w.stop()
    local = subprocess.run(
        [*KASSAY, "run", str(spec), "--device", "cpu", "--quiet", "--json", "report.json"],
        cwd=tmp_path,
        env=procs.env({"KASSAY_ENABLE_MUTANTS": "true"}),
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert served.returncode == local.returncode == 1, (served.stderr[-2000:], local.stderr)
    a, b = served.stdout.splitlines(), local.stdout.splitlines()
    assert a[:-1] == b[:-1] and len(a) > 2, (a, b)
    assert a[-1].split(" · exit ")[0] == b[-1].split(" · exit ")[0], (a[-1], b[-1])
    assert a[-1].endswith(f"exit 1 · {api.extra['url']}/jobs/" + a[-1].rsplit("/", 1)[1])
    assert b[-1].endswith("exit 1 · report.json"), b[-1]


def test_operations_the_cli_owes_a_ci_user(procs, tmp_path: Path) -> None:
    """`kassay impls`, a "did you mean" on a misspelt impl, no traceback on a closed pipe, and a
    bad setting in one line with exit 2."""
    w = procs.worker()
    api = procs.api([w])
    try:
        procs.wait_ready(api, w)
        env = procs.env({"KASSAY_SERVER": api.extra["url"], "KASSAY_TOKEN": procs.write_token})
        impls = subprocess.run([*KASSAY, "impls"], env=env, capture_output=True, text=True)
        assert impls.returncode == 0, impls.stderr
        rows = [line.split() for line in impls.stdout.splitlines()]
        assert ["lse_merge", "torch", "builtin", "all", "workers"] in rows, impls.stdout
        assert not any(r[2] == "mutant" for r in rows)  # not without KASSAY_ENABLE_MUTANTS
        bad = dict(SPEC, suites=[dict(SPEC["suites"][0], impls=["tourch"])])
        spec = tmp_path / "bad.yaml"
        spec.write_text(yaml.safe_dump(bad))
        r = subprocess.run([*KASSAY, "submit", str(spec)], env=env, capture_output=True, text=True)
        assert r.returncode == 2 and "did you mean 'torch'?" in r.stderr, r.stderr
        # the reader is gone before kassay writes (`| true`): a closed pipe, as `| head` makes
        piped = subprocess.run(
            " ".join([*KASSAY, "impls", "--json"]) + " | true",
            shell=True,
            env=env,
            capture_output=True,
            text=True,
        )
        assert "Traceback" not in piped.stderr and "BrokenPipe" not in piped.stderr, piped.stderr
    finally:
        api.stop()
        w.stop()
    refused = subprocess.run(
        [*KASSAY, "api", "--port", "1"],
        env=procs.env({"KASSAY_MAX_CASES": "-1"}),
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "kassay: bad setting KASSAY_MAX_CASES: Input should be greater than 0"
    ), refused.stderr


def test_json_logs_with_an_access_line_per_request(procs) -> None:
    import json

    import httpx

    api = procs.api([], log_format="json")
    try:
        procs.wait_ready(api, workers_up=0)
        assert httpx.get(f"{api.extra['url']}/v1/jobs", timeout=10).status_code == 200
        deadline = time.monotonic() + 10
        records: list[dict] = []
        while time.monotonic() < deadline:
            lines = [x for x in api.tail(400).splitlines() if x.startswith("{")]
            records = [json.loads(x) for x in lines]
            if any(
                r.get("logger") == "kassay.access" and r.get("path") == "/v1/jobs" for r in records
            ):
                break
        access = [r for r in records if r.get("logger") == "kassay.access"]
        hit = next(r for r in access if r["path"] == "/v1/jobs")
        assert hit["method"] == "GET" and hit["status"] == 200 and hit["ms"] >= 0
        assert hit["route"] == "/v1/jobs" and hit["level"] == "INFO" and "time" in hit
        # every line is JSON: uvicorn's and kassay's loggers alike
        assert all(x.startswith("{") for x in api.tail(400).splitlines() if x.strip()), api.tail(40)
    finally:
        api.stop()
