"""Bring your own kernel from a wheel install of kassay, with an op plugin installed editable
beside it (#38): the sandboxed impl runner must read kassay in site-packages and the plugin in
its source folder (on no sys.path entry: setuptools' editable finder maps it), and nothing of
the service. The editable install of kassay itself is what every other integration test runs
(tests/users.py).

The fresh venv gets kassay's wheel (built here from a copy of the sources) and the plugin
(`pip install -e`, through setuptools' finder); its third-party packages (torch, grpcio, ...) come from the test's own venv
through a path file, so that no download is needed."""

from __future__ import annotations

import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
from users import user_env, wait_serve_ready

from kassay.contract.results import Report

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PIP = ["-m", "pip", "-q", "--disable-pip-version-check"]
OFFLINE = ["--no-deps", "--no-build-isolation", "--no-index"]

#: an impl of the plugin's op, brought by a job: the runner imports the plugin to run it
RMS_MODULE = """
from kassay.impls import Impl
from kassay_rmsnorm.impls import rmsnorm_eager, with_grads

def impls():
    return [Impl("rmsnorm", "rms_mine", with_grads(rmsnorm_eager))]
"""


def _fresh_venv(tmp: Path) -> Path:
    """A venv with kassay from its wheel and the op plugin editable; returns its bin folder."""
    src = tmp / "kassay-src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("service", "client"):
        shutil.copytree(
            ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
        )
    dist = tmp / "dist"
    subprocess.run([sys.executable, *PIP, "wheel", *OFFLINE, "-w", dist, src], check=True)
    (wheel,) = dist.glob("kassay-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    (purelib,) = venv.glob("lib/python3*/site-packages")
    # the test venv's site-packages for the dependencies, after the fresh venv's own
    (purelib / "_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    python = venv / "bin" / "python"
    subprocess.run([python, *PIP, "install", *OFFLINE, wheel], check=True)
    plugin = tmp / "op-plugin"
    shutil.copytree(ROOT / "examples" / "op-plugin", plugin)
    # a package folder named otherwise than the package: setuptools then installs it editable
    # through a finder (no sys.path entry), as it does kassay (two source roots)
    (plugin / "src" / "kassay_rmsnorm").rename(plugin / "rmsnorm_code")
    meta = (plugin / "pyproject.toml").read_text()
    meta = meta.replace(
        '[tool.setuptools.packages.find]\nwhere = ["src"]',
        '[tool.setuptools]\npackages = ["kassay_rmsnorm"]\n'
        'package-dir = {"kassay_rmsnorm" = "rmsnorm_code"}',
    )
    assert "rmsnorm_code" in meta
    (plugin / "pyproject.toml").write_text(meta)
    subprocess.run([python, *PIP, "install", *OFFLINE, "-e", plugin], check=True)
    assert list(purelib.glob("__editable__*kassay_rmsnorm*finder.py")), "not a finder install"
    return venv / "bin"


@pytest.fixture(scope="module")
def fresh_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _fresh_venv(tmp_path_factory.mktemp("fresh"))


def test_a_wheel_install_with_an_editable_plugin_runs_code_jobs(
    procs, tmp_path: Path, fresh_bin: Path
) -> None:
    bin_dir = fresh_bin
    kassay = str(bin_dir / "kassay")
    where = subprocess.run(
        [bin_dir / "python", "-c", "import kassay, kassay_rmsnorm; print(kassay.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    assert str(fresh_bin.parent) in where, where  # kassay from the wheel, not the sources
    pkg = tmp_path / "kernel-package"
    shutil.copytree(ROOT / "examples" / "kernel-package", pkg)
    subprocess.run(
        [sys.executable, *PIP, "wheel", *OFFLINE, "-w", "dist", "."], cwd=pkg, check=True
    )
    (wheel,) = (pkg / "dist").glob("*.whl")
    module = tmp_path / "kassay_rms_mine.py"
    module.write_text(RMS_MODULE)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: installs\n"
        "suites:\n"
        "  - op: lse_merge\n"
        "    impls: [torch, kassay, example_merge]\n"
        "    params: {T: 16, Hh: 2, D: 32, K: 3, dtype: float32, mode: merge}\n"
        "    regimes: [normal, fa2_inf]\n"
        "    coverage: none\n"
        "  - op: rmsnorm\n"
        "    impls: [torch, rms_mine]\n"
        "    params: {N: 16, H: 64, dtype: float32}\n"
        "    coverage: none\n"
    )
    port = procs.free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as fh:
        serve = subprocess.Popen(
            [kassay, "serve", "--port", str(port)],
            cwd=tmp_path,
            env=user_env({"KASSAY_WORKER_POLL_S": "0.5"}),
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_serve_ready(url, serve, log)
        done = subprocess.run(
            [
                kassay,
                "submit",
                str(spec),
                "--wait",
                "--artifact",
                str(wheel),
                "--artifact",
                str(module),
            ],
            cwd=tmp_path,
            env=user_env({"KASSAY_SERVER": url}),
            capture_output=True,
            text=True,
            timeout=400,
        )
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-4000:] + "\n" + log.read_text()[-3000:]
        summary = re.search(r"(\d+) passed · (\d+) cases · exit 0", out)
        assert summary and summary.group(1) == summary.group(2) == "10", out[-2000:]
    finally:
        serve.terminate()
        serve.wait(timeout=60)
    assert "PermissionError" not in log.read_text()


#: a kernel repository's test file (#39): two correct functions (an fp32 cross-entropy written
#: otherwise than torch's, a logsumexp merge) and three broken ones
USER_TESTS = Path(__file__).with_name("data") / "user_kernel_tests.py"
REPORTS = ["--junitxml", "junit.xml", "--kassay-report", "kassay.json"]


def test_a_kernel_repos_pytest_file_gets_kassays_verdicts(tmp_path: Path, fresh_bin: Path) -> None:
    """#39: with kassay installed from its wheel, plain `pytest` on a user's file: the correct
    functions pass, each broken one fails with a first line naming the output, the metric, its
    value and the limit; --kassay-report writes a report of the schema."""
    work = tmp_path / "kernels"
    work.mkdir()
    shutil.copy(USER_TESTS, work / "test_user_kernels.py")
    done = subprocess.run(
        [fresh_bin / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *REPORTS],
        cwd=work,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]  # tests failed
    import xml.etree.ElementTree as ET

    outcome = {}
    for case in ET.parse(work / "junit.xml").iter("testcase"):
        failure = case.find("failure")
        outcome[case.get("name")] = "" if failure is None else failure.get("message") or ""
    assert outcome["test_flce"] == "" and outcome["test_merge"] == "", outcome
    first = {k: v.split("\n")[0] for k, v in outcome.items() if v}
    assert set(first) == {"test_flce_scaled", "test_flce_half_lse", "test_merge_naive"}, first
    for line in first.values():
        assert "KernelAssertionError: kassay: " in line, line
    for name in ("test_flce_scaled", "test_flce_half_lse"):
        found = re.search(r"output (\w+): max_abs (\S+) > (\S+);.*\[max_abs limit", first[name])
        assert found and float(found.group(2)) > float(found.group(3)), first[name]
    assert "output out: " in first["test_merge_naive"]
    assert "NaN/Inf element(s) where the reference is finite" in first["test_merge_naive"]
    report = Report.model_validate_json((work / "kassay.json").read_text())
    by_impl: dict[str, set[str]] = {}
    for c in report.cases:
        by_impl.setdefault(c.impl, set()).add(c.status)
    assert by_impl["flce"] == {"passed"} and by_impl["merge"] == {"passed"}, by_impl
    assert "failed" in by_impl["flce_scaled"] and "failed" in by_impl["merge_naive"], by_impl
