"""Property-based fuzzing of the live API against its own OpenAPI schema (schemathesis): no
request it generates may get a server error, an undocumented status code or a response that
breaks the documented schema. A fixed seed and example budget keep the run short and the same
on every CI run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

WRITE = "fuzz-write"


@pytest.mark.integration
def test_schemathesis_finds_no_server_error_or_schema_violation(tmp_path: Path, procs) -> None:
    exe = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert exe, "schemathesis is a dev dependency (pyproject.toml)"
    # No worker: jobs stay queued, so fuzzed specs cost the API only admission.
    api = procs.api([], api_tokens=WRITE)
    try:
        procs.wait_ready(api, workers_up=0)
        run = subprocess.run(
            [
                exe,
                "run",
                f"{api.extra['url']}/openapi.json",
                "--checks",
                "not_a_server_error,response_schema_conformance,"
                "status_code_conformance,content_type_conformance",
                "--phases",
                "examples,coverage,fuzzing,stateful",
                "--max-examples",
                "40",
                "--seed",
                "20261203",
                "--workers",
                "1",
                "-H",
                f"Authorization: Bearer {WRITE}",
                "--exclude-path",
                "/v1/jobs/{job_id}/events",  # an endless stream while the job is queued
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
        out = run.stdout + run.stderr
        assert run.returncode == 0, out[-6000:] + "\n--- api log ---\n" + api.tail(60)
        assert "generated" in out  # it really ran cases
        assert api.alive(), api.tail(60)
    finally:
        api.stop()
