"""The CI signal (#32): `kassay submit --wait` piped to a file, as GitHub Actions and GitLab run
it (no terminal), writes a log like pytest's: progress lines while it waits, then one line per
case that did not pass (its short name, the limit it broke and by how much), then one summary
line with the job page's URL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]

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
    w = procs.worker(env={"KASSAY_ENABLE_MUTANTS": "true"})
    api = procs.api([w], enable_mutants="true")
    try:
        procs.wait_ready(api, w)
        spec = tmp_path / "spec.yaml"
        spec.write_text(yaml.safe_dump(SPEC))
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
                [sys.executable, "-m", "kassay.cli", "submit", str(spec), "--wait"],
                stdout=out,
                stderr=err,
                env=env,
                timeout=240,
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
        assert line.startswith("FAILED   lse_merge.m_zeros "), line
        assert "out: output is all zeros" in line or "> limit" in line, line
        assert len(line) < 240, line
    assert any("dtype=float16 [huge]" in line for line in failed), failed
    summary = log[-1]
    assert summary.startswith(f"kassay: {len(failed)} failed, ")
    assert f"{len(failed)} failed" in summary and "exit 1" in summary
    assert f"{api.extra['url']}/jobs/job_" in summary, summary
    assert "cases done" in progress and "failed" in progress, progress
    assert "Traceback" not in progress
