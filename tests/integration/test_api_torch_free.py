"""The API runs without torch: admission, dispatch over gRPC, results and reports use only the
torch-free contract. Two ways of proving it: the API process started with torch and triton made
unimportable, and `pip install .[api]` into a fresh venv (no torch at all) serving `kassay api`."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import venv
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]

# Runs `kassay api ...` in a process where `import torch` / `import triton` raise ImportError.
_NO_TORCH_LAUNCH = (
    "import sys; sys.modules['torch'] = None; sys.modules['triton'] = None; "
    "from kassay.cli import main; sys.exit(main(sys.argv[1:]))"
)

LSE = {"T": 8, "Hh": 2, "D": 4, "dtype": "float32", "K": 2}


def _job(name: str, impls: list[str]) -> dict:
    return {
        "name": name,
        "suites": [
            {
                "op": "lse_merge",
                "impls": impls,
                "params": LSE,
                "regimes": ["normal"],
                "timing": {"enabled": False},
            }
        ],
    }


def _wait_job(url: str, job_id: str, timeout: float = 180.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = httpx.get(f"{url}/v1/jobs/{job_id}", timeout=5).json()
        if job["state"] not in ("queued", "running"):
            return job
        time.sleep(0.3)
    pytest.fail(f"job {job_id} did not finish: {job}")


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the API exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    pytest.fail(f"the API did not answer /healthz:\n{log.read_text()[-3000:]}")


@pytest.mark.integration
def test_api_without_torch_admits_dispatches_and_reports(tmp_path: Path, procs) -> None:
    worker_port = procs.free_port()
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    env = procs.env(
        {
            "KASSAY_WORKERS": f"127.0.0.1:{worker_port}",
            "KASSAY_DATABASE_URL": f"sqlite:///{tmp_path / 'k.db'}",
            "KASSAY_WORKER_POLL_S": "0.3",
            "KASSAY_LEASE_S": "4",
        }
    )
    log = tmp_path / "api.log"
    with open(log, "wb") as fh:
        api = subprocess.Popen(
            [sys.executable, "-c", _NO_TORCH_LAUNCH, "api", "--port", str(port)],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
        )
    worker = None
    try:
        _wait_http(url, api, log)
        # No worker has answered Describe yet: impl names are taken on trust.
        good = httpx.post(f"{url}/v1/jobs", json=_job("good", ["torch", "te_style"]), timeout=10)
        bad = httpx.post(f"{url}/v1/jobs", json=_job("bad", ["torch", "no_such_impl"]), timeout=10)
        assert (good.status_code, bad.status_code) == (201, 201), (good.text, bad.text)
        # A spec error is still refused by the contract alone.
        refused = httpx.post(
            f"{url}/v1/jobs",
            json={**_job("x", ["torch"]), "suites": [{"op": "lse_merge", "impls": ["torch"]}]},
            timeout=10,
        )
        assert refused.status_code == 422 and "params" in refused.text

        worker = procs.worker(port=worker_port)
        done = _wait_job(url, good.json()["id"])
        assert done["state"] == "finished" and done["ok"] is True, done
        failed = _wait_job(url, bad.json()["id"])
        assert failed["state"] == "finished" and failed["ok"] is False
        report = httpx.get(f"{url}/v1/jobs/{bad.json()['id']}/report", timeout=10).json()
        messages = {c["impl"]: c["message"] for c in report["cases"]}
        assert "no worker offers impl 'no_such_impl' for op 'lse_merge'" in messages["no_such_impl"]
        assert "te_style" in messages["no_such_impl"]  # names what the workers do offer

        for fmt in ("json", "junit", "markdown", "html"):
            r = httpx.get(
                f"{url}/v1/jobs/{good.json()['id']}/report", params={"format": fmt}, timeout=10
            )
            assert r.status_code == 200 and r.text, fmt
        assert httpx.get(f"{url}/", timeout=10).status_code == 200
        # With the worker described, an unknown impl is refused at admission.
        late = httpx.post(f"{url}/v1/jobs", json=_job("late", ["nope"]), timeout=10)
        assert late.status_code == 422 and "known impls" in late.json()["message"]
        assert api.poll() is None, log.read_text()[-3000:]
    finally:
        if worker is not None:
            worker.stop()
        api.terminate()
        api.wait(timeout=20)


def _api_venv() -> Path:
    """A venv with `pip install .[api]` and nothing else, reused while pyproject.toml is the
    same (CI builds it once per clean clone)."""
    key = hashlib.sha1((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:12]
    home = ROOT / ".venv-api"
    stamp = home / f".installed-{key}"
    if stamp.exists():
        return home
    venv.EnvBuilder(with_pip=True, clear=True).create(home)
    py = home / "bin" / "python"
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{ROOT}[api]"],
        check=True,
        timeout=900,
    )
    stamp.touch()
    return home


@pytest.mark.integration
def test_pip_install_api_extra_starts_kassay_api_without_torch(tmp_path: Path, procs) -> None:
    home = _api_venv()
    py = home / "bin" / "python"
    has_torch = subprocess.run(
        [str(py), "-c", "import torch"], capture_output=True, timeout=120
    ).returncode
    assert has_torch != 0, "the api extra must not bring torch"
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        {
            "KASSAY_DATABASE_URL": f"sqlite:///{tmp_path / 'k.db'}",
            "KASSAY_WORKERS": f"127.0.0.1:{procs.free_port()}",
        }
    )
    log = tmp_path / "api.log"
    with open(log, "wb") as fh:
        api = subprocess.Popen(
            [str(home / "bin" / "kassay"), "api", "--port", str(port)],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
        )
    try:
        _wait_http(url, api, log)
        r = httpx.post(f"{url}/v1/jobs", json=_job("venv", ["torch"]), timeout=10)
        assert r.status_code == 201, r.text
        assert httpx.get(f"{url}/v1/jobs/{r.json()['id']}/report", timeout=5).status_code == 200
    finally:
        api.terminate()
        api.wait(timeout=20)
