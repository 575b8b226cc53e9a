"""Every bench script runs in CI, small, so it cannot rot (#32: bench/service.py had failed at
its own assertion since coverage added cases). The CPU ones run end to end at toy sizes and
write their JSON; the ones that need a GPU (they time with CUDA events) at least parse their
arguments and import what they need."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
SMALL = {
    "service.py": ["--seeds", "2", "--reps", "1", "--requests", "200", "--connections", "2"],
    "store_throughput.py": ["--requests", "100", "--connections", "2", "--groups", "10"],
}


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "service"), str(ROOT / "client")])
    env.setdefault("TRITON_INTERPRET", "1")
    return env


@pytest.mark.parametrize("script", sorted(SMALL))
def test_cpu_bench_scripts_run_small(script: str, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *SMALL[script], "--out", str(out)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(out.read_text())


@pytest.mark.parametrize(
    "script",
    sorted(
        p.name
        for p in (ROOT / "bench").glob("*.py")
        if p.name not in SMALL and p.name != "common.py"
    ),
)
def test_every_other_bench_script_parses_its_arguments(script: str) -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--help"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "usage" in r.stdout.lower()


def test_the_flce_table_renders_a_committed_result() -> None:
    newest = sorted((ROOT / "bench" / "results").glob("flce-h200-*.json"))[-1]
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "flce_table.py"), str(newest)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("| N, H, V | impl |")
