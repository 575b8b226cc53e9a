"""Bring your own kernel exactly as the README tells a user who just ran `make venv` (#38): the
venv's console script, no PYTHONPATH, `kassay serve` in a folder of their own, the example
kernel package's wheel built there and `kassay submit kassay-job.yaml --artifact dist/*.whl
--wait` as written in examples/kernel-package. Every case passes and the exit code is 0.

The one difference from the README's command: the wheel is built with --no-build-isolation
--no-index (the test machine need not reach PyPI for setuptools); the wheel is the same."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from users import KASSAY, user_env, wait_serve_ready

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PIP_WHEEL = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]


def test_the_readme_kernel_package_passes_every_case(procs, tmp_path: Path) -> None:
    home = tmp_path / "user"
    pkg = home / "kernel-package"
    shutil.copytree(ROOT / "examples" / "kernel-package", pkg)
    subprocess.run([*PIP_WHEEL, "--no-index", "-w", "dist", "."], cwd=pkg, check=True)
    (wheel,) = (pkg / "dist").glob("*.whl")
    port = procs.free_port()
    log = home / "serve.log"
    with open(log, "wb") as fh:
        serve = subprocess.Popen(
            [*KASSAY, "serve", "--port", str(port)],
            cwd=home,
            env=user_env({"KASSAY_WORKER_POLL_S": "0.5"}),
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_serve_ready(url, serve, log)
        env = user_env({"KASSAY_SERVER": url})
        done = subprocess.run(
            [
                *KASSAY,
                "submit",
                "kassay-job.yaml",
                "--wait",
                "--artifact",
                str(wheel.relative_to(pkg)),
            ],
            cwd=pkg,
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
        )
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-4000:] + "\n" + log.read_text()[-3000:]
        summary = re.search(r"(\d+) passed · (\d+) cases · exit 0", out)
        assert summary and summary.group(1) == summary.group(2) == "48", out[-2000:]
    finally:
        serve.terminate()
        serve.wait(timeout=60)
    assert "PermissionError" not in log.read_text()
