"""Bring your own op: examples/op-plugin (RMSNorm forward + backward as its own package, found
through the `kassay.ops` entry point) installed beside kassay passes through every path a
built-in op does: `kassay impls`, `kassay run` and every report format, `kassay selftest` (its
mutants caught, its correct impls passing), and `kassay serve` (the API admits it by its
contract, the worker runs it, the dashboard and the report routes show it). The package is
installed into a folder of its own and put on PYTHONPATH of the processes started here only,
so the rest of the suite keeps its two ops; no file under service/ names it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from users import KASSAY

from kassay_client import Client

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "examples" / "op-plugin"
PIP_INSTALL = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
PIP_INSTALL += ["--no-index"]
SPEC = {
    "name": "rmsnorm-plugin",
    "suites": [
        {
            "op": "rmsnorm",
            "impls": ["torch", "triton"],
            "params": {"N": 64, "H": 96, "dtype": ["float32", "float16"]},
            "timing": {"warmup": 0, "min_reps": 1, "max_reps": 2, "budget_s": 0.2},
        }
    ],
}


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    target = tmp_path_factory.mktemp("op-plugin")
    # a copy: building in the example's folder would leave build/ and *.egg-info there
    src = tmp_path_factory.mktemp("op-plugin-src") / "op-plugin"
    shutil.copytree(PLUGIN, src)
    subprocess.run(
        [*PIP_INSTALL, "--target", str(target), str(src)],
        check=True,
        capture_output=True,
    )
    return str(target)


def _env(procs: object, plugin_path: str) -> dict[str, str]:
    env = procs.env()  # type: ignore[attr-defined]
    env["PYTHONPATH"] = plugin_path  # a user who installed the plugin with `pip --target`
    return env


def _kassay(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KASSAY, *args],
        env={**env, "COLUMNS": "200"},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_no_file_of_the_service_names_the_plugin_op() -> None:
    """Neither the op's name (as a string: an op key) nor its package appears in the service
    (an RMSNorm layer of the convergence model is not the op)."""
    named = re.compile(r"""["']rmsnorm["']|kassay_rmsnorm|kassay-rmsnorm""", re.IGNORECASE)
    for path in [
        *(ROOT / "service").rglob("*"),
        ROOT / "protos" / "kassay" / "v1" / "worker.proto",
    ]:
        if path.is_file() and path.suffix in (".py", ".proto", ".html", ".js", ".toml"):
            assert not named.search(path.read_text(errors="replace")), path


def test_the_cli_runs_lists_and_selftests_a_plugin_op(
    procs, plugin_path: str, tmp_path: Path
) -> None:
    env = _env(procs, plugin_path)
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    ran = _kassay(
        env,
        tmp_path,
        "run",
        "spec.json",
        "--device",
        "cpu",
        "--quiet",
        "--json",
        "r.json",
        "--junit",
        "r.xml",
        "--markdown",
        "r.md",
        "--html",
        "r.html",
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    statuses = {(c["impl"], c["regime"], c["status"]) for c in report["cases"]}
    assert {s for _, _, s in statuses} == {"passed"}, statuses
    # both regimes (the plugin's own `large` one too) and its coverage points ran
    assert {r for _, r, _ in statuses} == {"normal", "large"}
    assert report["summary"]["added_by_coverage"] > 0
    outputs = {o["name"] for c in report["cases"] for o in c["outputs"]}
    assert outputs == {"y", "grad_x", "grad_weight"}
    for name in ("r.xml", "r.md", "r.html"):
        assert "rmsnorm" in (tmp_path / name).read_text(), name
    selftest = _kassay(
        env,
        tmp_path,
        "selftest",
        "--device",
        "cpu",
        "--only",
        "rmsnorm.m_grad_weight_unnormalised",
        "rmsnorm.m_mean_square_in_dtype",
    )
    assert selftest.returncode == 0, selftest.stdout[-3000:] + selftest.stderr[-3000:]
    assert "detected 2/2 mutants, false failures 0/" in selftest.stdout, selftest.stdout[-2000:]


def test_serve_admits_runs_and_shows_a_plugin_op(procs, plugin_path: str) -> None:
    port = procs.free_port()
    serve = procs.serve(port=port, env={"PYTHONPATH": _env(procs, plugin_path)["PYTHONPATH"]})
    url = f"http://127.0.0.1:{port}"
    try:
        procs.wait_ready(serve, workers_up=1)
        with Client(url) as client:
            job = client.jobs.wait(client.jobs.create(SPEC).id, timeout=300)
            report = client.jobs.report(job.id)
            texts = {
                fmt: client.jobs.report(job.id, format=fmt) for fmt in ("junit", "markdown", "html")
            }
        assert job.state == "finished"
        assert report.cases and all(c.status == "passed" for c in report.cases), [
            (c.case_id, c.status, c.message) for c in report.cases if c.status != "passed"
        ]
        assert {c.op for c in report.cases} == {"rmsnorm"}
        for fmt, text in texts.items():
            assert "rmsnorm" in text, fmt
        page = httpx.get(f"{url}/jobs/{job.id}", timeout=30)
        assert page.status_code == 200 and "rmsnorm" in page.text
        # the worker offers the op's impls like a built-in's (`kassay impls`)
        listed = _kassay(procs.env(), ROOT, "impls", "--server", url)
        assert listed.returncode == 0, listed.stderr
        assert "rmsnorm" in listed.stdout and "triton" in listed.stdout, listed.stdout
    finally:
        serve.stop()
