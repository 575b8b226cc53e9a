"""`kassay run` and `kassay selftest` as a user calls them (real subprocesses)."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _kassay(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run(
        [sys.executable, "-m", "kassay.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_run_smoke_writes_all_reports(tmp_path: Path) -> None:
    r = _kassay(
        "run",
        str(ROOT / "examples" / "smoke.yaml"),
        "--device",
        "cpu",
        "--json",
        "r.json",
        "--junit",
        "r.xml",
        "--markdown",
        "r.md",
        "--quiet",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["summary"]["ok"] and data["summary"]["failed"] == 0
    assert data["summary"]["passed"] > 0
    ET.parse(tmp_path / "r.xml")
    assert "kassay: smoke" in (tmp_path / "r.md").read_text()
    assert "passed" in r.stdout


def test_run_exit_codes_for_failures_and_bad_specs(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: b\nsuites:\n  - op: lse_merge\n    impls: [nope]\n    params: {T: 4, Hh: 1, D: 2}\n"
    )
    r = _kassay("run", str(bad), "--device", "cpu", cwd=tmp_path)
    assert r.returncode == 2 and "known impls" in r.stderr
    missing = _kassay("run", str(tmp_path / "missing.yaml"), cwd=tmp_path)
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    failing = tmp_path / "f.yaml"
    failing.write_text(
        "name: f\nsuites:\n  - op: lse_merge\n    impls: [torch, m_zeros]\n"
        "    params: {T: 4, Hh: 1, D: 2}\n    timing: {enabled: false}\n"
    )
    env_r = subprocess.run(
        [sys.executable, "-m", "kassay.cli", "run", str(failing), "--device", "cpu"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "KASSAY_ENABLE_MUTANTS": "1"},
    )
    assert env_r.returncode == 1, env_r.stderr[-2000:]


def test_selftest_command(tmp_path: Path) -> None:
    r = _kassay(
        "selftest", "--device", "cpu", "--only", "m_copy_update", "m_naive_logaddexp", cwd=tmp_path
    )
    assert r.returncode == 0, r.stdout[-3000:]
    assert r.stdout.strip().splitlines()[-1].startswith("detected 2/2 mutants, false failures 0/")
