"""Bring your own kernel, through the real API, worker and sandboxed executor: a kernel package's
wheel built here is uploaded and run next to torch; hostile artifacts each fail only their own
cases, leave the worker serving and leak nothing. The worker requires a token, so artifacts
travel over the same authenticated channel as runs."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from users import KASSAY, user_env

from kassay.settings import Settings
from kassay_client import Client
from kassay_client.errors import (
    AuthenticationError,
    PayloadTooLargeError,
    PermissionDeniedError,
    UnprocessableEntityError,
)

#: sandboxes run as users of their own from this uid up
SANDBOX_UID = Settings().sandbox_uid

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CODE_TOKEN = "itest-code"
#: the API and the worker share it: artifacts reach the worker over the authenticated channel
WORKER_TOKEN = "itest-byok-worker-token-" + secrets.token_hex(8)
SECRET = "kassay-secret-" + secrets.token_hex(8)
#: over the API's 1 MiB PutArtifact chunks, so that an artifact can travel as several
MAX_ARTIFACT_BYTES = 3_000_000
PIP_WHEEL = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
PIP_WHEEL += ["--no-index"]

#: a module artifact whose impls misbehave, each in its own way; {port} and {outside} are filled
#: in by the test (the API's port, a world-writable folder outside the sandbox)
HOSTILE = """
import ctypes, os, socket, sys, time
from kassay.impls import Impl

def _secrets(inputs, params):
    found = dict(os.environ)
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                found["/proc/" + pid] = open(f"/proc/{{pid}}/environ").read()
            except OSError:
                pass
    text = repr(found)
    print("STOLEN", text)
    print("STOLEN", text, file=sys.stderr)
    raise RuntimeError("STOLEN " + text)

def _connect(inputs, params):
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
    raise RuntimeError("connected to the API")

def _write(inputs, params):
    with open("inside.txt", "w") as fh:
        fh.write("ok")
    wrote = []
    for path in ("{outside}/escaped.txt", "/tmp/kassay-escaped-{port}.txt", __file__):
        try:
            with open(path, "a") as fh:
                fh.write("escaped")
            wrote.append(path)
        except OSError:
            pass
    raise RuntimeError(f"inside: {{os.path.exists('inside.txt')}}; escaped to: {{wrote}}")

def _fork_bomb(inputs, params):
    n = 0
    while True:
        try:
            pid = os.fork()
        except OSError as exc:
            raise RuntimeError(f"fork refused after {{n}} children: {{exc}}")
        if pid == 0:
            time.sleep(3600)
            os._exit(0)
        n += 1
        if n > 5000:
            raise RuntimeError("forked 5000 children")

def _memory(inputs, params):
    hoard = []
    while True:
        hoard.append(bytearray(64 << 20))

def _spin(inputs, params):
    while True:
        pass

def _segfault(inputs, params):
    ctypes.string_at(0)

def impls():
    made = [("h_secrets", _secrets), ("h_connect", _connect), ("h_write", _write),
            ("h_fork", _fork_bomb), ("h_memory", _memory), ("h_spin", _spin),
            ("h_segfault", _segfault)]
    return [Impl("lse_merge", name, run) for name, run in made]
"""

#: an impl that reports where it runs, and whether an earlier group left its marker there
WHERE = """
import os
from kassay.impls import Impl

def _where(inputs, params):
    before = sorted(os.listdir("."))
    with open("marker.txt", "w") as fh:
        fh.write("left by an earlier group")
    raise RuntimeError(f"cwd={os.getcwd()} home={os.environ['HOME']} before={before}")

def impls():
    return [Impl("lse_merge", "w_where", _where)]
"""

EXIT_AT_IMPORT = """
import os
os._exit(3)

def impls():
    return []
"""


@dataclass
class CodeStack:
    url: str
    port: int
    worker: Any
    api: Any
    wheel: Path
    tmp: Path
    #: the worker's Prometheus /metrics
    metrics_url: str

    def client(self, token: str | None = CODE_TOKEN) -> Client:
        return Client(self.url, token=token, timeout=60)

    def runner_starts(self, outcome: str) -> float:
        """The worker's count of impl runner starts with this outcome (ready, failed)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(self.metrics_url, timeout=10).text
        for fam in text_string_to_metric_families(text):
            for x in fam.samples:
                if x.name == "kassay_worker_runner_starts_total" and x.labels == {
                    "outcome": outcome
                }:
                    return x.value
        return 0.0


def _build_wheel(tmp: Path) -> Path:
    """The example kernel package's wheel, built as its CI would."""
    src = tmp / "kernel-package"
    shutil.copytree(ROOT / "examples" / "kernel-package", src)
    out = tmp / "dist"
    subprocess.run(
        [*PIP_WHEEL, "-w", str(out), str(src)],
        check=True,
        timeout=300,
    )
    (wheel,) = out.glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def code_stack(module_procs: Any) -> Iterator[CodeStack]:
    tmp = module_procs.tmp
    secret_env = {"KASSAY_TEST_SECRET": SECRET, "AWS_SECRET_ACCESS_KEY": SECRET}
    metrics_port = module_procs.free_port()
    worker = module_procs.worker(
        env={
            **secret_env,
            "KASSAY_WORKER_METRICS_LISTEN": f"127.0.0.1:{metrics_port}",
            "KASSAY_SANDBOX_MEMORY_BYTES": str(1536 << 20),
            "KASSAY_SANDBOX_NPROC": "200",
            "KASSAY_WORKER_TOKEN": WORKER_TOKEN,
        },
        # h_memory fills 1.5 GiB before MemoryError (0.7 s alone, over 6 s on this shared
        # 2-core box under a full test run, once past 15 s in a clean-clone run): only h_spin
        # should reach the timeout
        case_timeout_s=30.0,
    )
    port = module_procs.free_port()
    api = module_procs.api(
        [worker],
        port=port,
        api_tokens=module_procs.write_token,
        read_tokens=module_procs.read_token,
        code_tokens=CODE_TOKEN,
        max_artifact_bytes=str(MAX_ARTIFACT_BYTES),
        test_secret=SECRET,
        worker_token=WORKER_TOKEN,
    )
    wheel = _build_wheel(tmp)
    try:
        module_procs.wait_ready(api, worker)
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        yield CodeStack(api.extra["url"], port, worker, api, wheel, tmp, metrics_url)
    finally:
        for p in (api, worker):
            p.stop()


def _spec(impls: list[str], artifacts: list[str], **params: Any) -> dict[str, Any]:
    return {
        "name": "byok",
        "artifacts": artifacts,
        "suites": [
            {
                "op": "lse_merge",
                "impls": impls,
                "params": {"T": 16, "Hh": 2, "D": 32, "K": 3, "dtype": "float32", **params},
                # an exact grid: only the groups a test asks for
                "regimes": ["normal"],
                "coverage": "none",
                "timing": {"warmup": 0, "min_reps": 1, "max_reps": 2, "budget_s": 0.2},
            }
        ],
    }


def _cases(client: Client, job_id: str) -> dict[str, Any]:
    return {c.impl: c for c in client.jobs.report(job_id).cases}


def _assert_serving(client: Client) -> None:
    """A plain job (no artifacts) still passes on the same worker."""
    spec = _spec(["torch", "kassay"], [])
    del spec["artifacts"]
    job = client.jobs.wait(client.jobs.create(spec).id, timeout=120)
    assert job.progress.passed == 2, _cases(client, job.id)


def _sandbox_processes() -> list[str]:
    """Processes of the sandbox's user still alive (none once a group is over)."""
    out = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and os.stat(f"/proc/{pid}").st_uid >= SANDBOX_UID:
                out.append(Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " "))
        except OSError:
            pass
    return out


# ------------------------------------------------------------------------------- the happy path


def test_a_wheel_built_here_runs_next_to_torch(code_stack: CodeStack) -> None:
    with code_stack.client() as kc:
        first = kc.artifacts.upload(code_stack.wheel)
        again = kc.artifacts.upload(code_stack.wheel)
        assert first.kind == "wheel" and first.entry_points == ["example"]
        assert again.digest == first.digest and again.created_at == first.created_at
        stored = [a for a in kc.artifacts.list() if a.digest == first.digest]
        assert len(stored) == 1  # the same digest twice is stored once

    spec_path = code_stack.tmp / "byok.yaml"
    import yaml

    spec = _spec(["torch", "example_merge"], [], K=[2, 3])
    del spec["artifacts"]
    spec_path.write_text(yaml.safe_dump(spec))
    junit, md = code_stack.tmp / "byok.xml", code_stack.tmp / "byok.md"
    reports = ["--artifact", str(code_stack.wheel), "--junit", str(junit), "--markdown", str(md)]
    env = user_env({"KASSAY_SERVER": code_stack.url, "KASSAY_TOKEN": CODE_TOKEN})
    done = subprocess.run(
        [*KASSAY, "submit", str(spec_path), "--quiet", *reports],
        env=env,
        cwd=code_stack.tmp,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"sha256:{first.digest}" in done.stderr
    assert 'failures="0"' in junit.read_text() and "example_merge" in md.read_text()
    assert f"code brought by the job: sha256 {first.digest[:16]}" in md.read_text()
    # the worker's /metrics counted the runner that ran it
    assert code_stack.runner_starts("ready") >= 1

    with code_stack.client() as kc:
        (job,) = kc.jobs.list(limit=1).items
        report = kc.jobs.report(job.id)
        assert {c.impl: c.status for c in report.cases} == {
            "torch": "passed",
            "example_merge": "passed",
        } or sorted(c.status for c in report.cases) == ["passed"] * 4
        assert len(report.cases) == 4
        # the job records the code it ran: in every result's environment
        assert all(c.environment["artifacts"] == [first.digest] for c in report.cases)
    assert _sandbox_processes() == []


def test_impl_names_no_artifact_provides_fail_listing_what_was_found(
    code_stack: CodeStack,
) -> None:
    with code_stack.client() as kc:
        digest = kc.artifacts.upload(code_stack.wheel).digest
        job = kc.jobs.create(_spec(["torch", "example_mrege"], [digest]))
        job = kc.jobs.wait(job.id, timeout=120)
        cases = _cases(kc, job.id)
    assert job.ok is False
    message = cases["example_mrege"].message
    assert cases["example_mrege"].status == "error"
    assert "unknown impl 'example_mrege'" in message and "example_merge" in message


# -------------------------------------------------------------------------------- who may


def test_code_needs_the_code_scope_and_bad_artifacts_are_refused(
    code_stack: CodeStack, module_procs: Any
) -> None:
    wheel = code_stack.wheel
    for token, error in (
        (module_procs.write_token, PermissionDeniedError),
        (module_procs.read_token, PermissionDeniedError),
        (None, AuthenticationError),
    ):
        with code_stack.client(token) as kc, pytest.raises(error):
            kc.artifacts.upload(wheel)
    with code_stack.client() as kc:
        digest = kc.artifacts.upload(wheel).digest
    with code_stack.client(module_procs.write_token) as kc:
        with pytest.raises(PermissionDeniedError, match="code scope"):
            kc.jobs.create(_spec(["torch", "example_merge"], [digest]))
        kc.jobs.create(_spec(["torch"], []) | {"artifacts": []})  # plain jobs need no code scope
    bad = code_stack.tmp / "bad"
    bad.mkdir()
    cases = {
        "big.py": b"def impls():\n    return []\n" + b"#" * MAX_ARTIFACT_BYTES,
        "noimpls.py": b"x = 1\n",
        "broken-0.1-py3-none-any.whl": b"not a zip",
        "../escape.py": b"def impls(): return []\n",
    }
    with code_stack.client() as kc:
        with pytest.raises(UnprocessableEntityError, match=r"no artifact"):
            kc.jobs.create(_spec(["torch"], ["0" * 64]))
        for name, data in cases.items():
            expected = PayloadTooLargeError if name == "big.py" else UnprocessableEntityError
            with pytest.raises(expected):
                kc.request(
                    "POST",
                    "/v1/artifacts",
                    params={"filename": name},
                    content=data,
                    headers={"Content-Type": "application/octet-stream"},
                )


# ------------------------------------------------------------------------------- hostile code


def test_hostile_artifacts_fail_only_their_own_cases(code_stack: CodeStack) -> None:
    outside = code_stack.tmp / "outside"
    outside.mkdir()
    outside.chmod(0o777)  # only the sandbox stands between the code and this folder
    module = code_stack.tmp / "kassay_hostile.py"
    module.write_text(HOSTILE.format(port=code_stack.port, outside=outside))
    hostile = [
        "h_secrets",
        "h_connect",
        "h_write",
        "h_fork",
        "h_memory",
        "h_spin",
        "h_segfault",
    ]
    with code_stack.client() as kc:
        good = kc.artifacts.upload(code_stack.wheel).digest
        bad = kc.artifacts.upload(module).digest
        job = kc.jobs.create(_spec(["torch", *hostile, "example_merge"], [good, bad]))
        job = kc.jobs.wait(job.id, timeout=300)
        cases = _cases(kc, job.id)
        md = kc.jobs.report(job.id, format="markdown")
        status = {name: c.status for name, c in cases.items()}
        assert status == {
            "torch": "passed",
            "h_secrets": "error",
            "h_connect": "error",
            "h_write": "error",
            "h_fork": "error",
            "h_memory": "error",
            "h_spin": "timeout",
            "h_segfault": "crashed",
            "example_merge": "passed",
        }, {n: c.message[:300] for n, c in cases.items()}
        msg = {name: c.message for name, c in cases.items()}
        # the environment is scrubbed and the worker's /proc entries are out of reach
        assert "STOLEN" in msg["h_secrets"] and "KASSAY_TEST_SECRET" not in msg["h_secrets"]
        assert WORKER_TOKEN not in msg["h_secrets"]  # nor the token that lets one run code
        # no network: Landlock refuses TCP before the empty network namespace would
        assert "Permission denied" in msg["h_connect"] or "unreachable" in msg["h_connect"]
        assert "inside: True; escaped to: []" in msg["h_write"]
        assert "fork refused after" in msg["h_fork"]
        assert "MemoryError" in msg["h_memory"]
        assert "SIGSEGV" in msg["h_segfault"]
        _assert_serving(kc)
    assert not (outside / "escaped.txt").exists()
    assert not Path(f"/tmp/kassay-escaped-{code_stack.port}.txt").exists()
    for text in (md, code_stack.worker.tail(100_000), code_stack.api.tail(100_000)):
        assert SECRET not in text and WORKER_TOKEN not in text
    deadline = time.monotonic() + 10
    while _sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _sandbox_processes() == []


def test_each_job_gets_a_fresh_working_directory_removed_when_it_ends(
    code_stack: CodeStack,
) -> None:
    """#42: one impl runner serves all the groups of a job, across the runs the API sends them
    in (6 groups, KASSAY_DISPATCH_BATCH 4: two runs): they share its working directory (its
    HOME too), which no other job wrote in and which is gone once the job is over. The module
    is padded past 2 MiB, so it reaches the worker in several PutArtifact chunks."""
    module = code_stack.tmp / "kassay_where.py"
    module.write_text(WHERE + "#" * 2_500_000 + "\n")
    shm = Path("/dev/shm")
    exchanges_before = set(shm.glob("kassay-sandbox-*")) if shm.is_dir() else set()
    seen: dict[str, list[tuple[str, str]]] = {}
    with code_stack.client() as kc:
        digest = kc.artifacts.upload(module).digest
        for job_name in ("first", "second"):
            spec = _spec(["torch", "w_where"], [digest], K=[2, 3, 4, 5, 6, 7])
            job = kc.jobs.wait(kc.jobs.create(spec).id, timeout=180)
            report = kc.jobs.report(job.id)
            torch_cases = [c for c in report.cases if c.impl == "torch"]
            assert all(c.status == "passed" for c in torch_cases), [
                (c.status, c.message) for c in torch_cases
            ]
            for case in report.cases:
                if case.impl != "w_where":
                    continue
                found = re.search(r"cwd=(\S+) home=(\S+) before=(\[.*?\])", case.message)
                assert found, case.message
                assert found.group(1) == found.group(2), case.message
                seen.setdefault(job_name, []).append((found.group(1), found.group(3)))
    for where in seen.values():
        assert len(where) == 6 and len({cwd for cwd, _ in where}) == 1, where  # one runner
        # the job's first group found it empty; the others saw the marker the first left
        assert sorted("marker.txt" in before for _, before in where) == [False] + [True] * 5
    (first, _), (second, _) = seen["first"][0], seen["second"][0]
    assert first != second, "two jobs shared a working directory"
    assert not Path(first).exists() and not Path(second).exists(), "a working directory lived on"
    # nor their tensor exchange folders in shared memory (kassay.worker.runner.sandbox.exchange_dir)
    exchanges = set(shm.glob("kassay-sandbox-*")) if shm.is_dir() else set()
    assert exchanges <= exchanges_before, exchanges - exchanges_before


def test_a_wheel_pinning_another_torch_fails_its_cases_saying_why(code_stack: CodeStack) -> None:
    """Installed without dependencies: a wheel whose Requires-Dist the worker's environment does
    not meet is refused at install, and the job's cases say what and why."""
    wheel = code_stack.tmp / "pinned" / "pinned_kernels-0.1-py3-none-any.whl"
    wheel.parent.mkdir()
    info = "pinned_kernels-0.1.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pinned_kernels/__init__.py", "def impls():\n    return []\n")
        zf.writestr(
            f"{info}/METADATA",
            "Metadata-Version: 2.1\nName: pinned-kernels\nVersion: 0.1\n"
            "Requires-Dist: torch==1.0.0\n",
        )
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\n")
        zf.writestr(f"{info}/entry_points.txt", "[kassay.impls]\npinned = pinned_kernels:impls\n")
    with code_stack.client() as kc:
        digest = kc.artifacts.upload(wheel).digest
        job = kc.jobs.wait(kc.jobs.create(_spec(["torch"], [digest])).id, timeout=120)
        (case,) = _cases(kc, job.id).values()
    assert job.ok is False and case.status == "error"
    assert "needs torch==1.0.0 and the worker has torch" in case.message
    assert "without dependencies" in case.message


def test_an_artifact_that_exits_at_import_fails_only_its_own_impl(code_stack: CodeStack) -> None:
    """Its code runs only in the impl runner: the built-ins beside it are judged as ever, and
    the impl it should have provided fails alone, saying why (#38)."""
    module = code_stack.tmp / "kassay_exit_at_import.py"
    module.write_text(EXIT_AT_IMPORT)
    failed_before = code_stack.runner_starts("failed")
    with code_stack.client() as kc:
        digest = kc.artifacts.upload(module).digest
        job = kc.jobs.wait(kc.jobs.create(_spec(["torch"], [digest])).id, timeout=120)
        (case,) = _cases(kc, job.id).values()
        assert case.status == "passed" and case.ran_in == "trusted", case.message
        spec = _spec(["torch", "kassay", "mine"], [digest])
        cases = _cases(kc, kc.jobs.wait(kc.jobs.create(spec).id, timeout=120).id)
        assert {n: c.status for n, c in cases.items()} == {
            "torch": "passed",
            "kassay": "passed",
            "mine": "error",
        }, {n: c.message for n, c in cases.items()}
        msg = cases["mine"].message
        assert "impl 'mine' not available" in msg and "did not start" in msg, msg
        assert "exited with code 3" in msg, msg
        _assert_serving(kc)
    # a runner that did not start is counted as such on the worker's /metrics
    assert code_stack.runner_starts("failed") > failed_before


#: a kernel package whose entry point fails to import (a module it forgot to ship)
BROKEN_IMPORT = """
import kassay_missing_helper  # noqa: F401

def impls():
    return []
"""


def test_an_artifact_failing_at_import_says_so_beside_passing_built_ins(
    code_stack: CodeStack,
) -> None:
    """#38: the import error's own line reaches the case of the impl it was to provide; torch
    and kassay beside it pass."""
    module = code_stack.tmp / "kassay_broken_import.py"
    module.write_text(BROKEN_IMPORT)
    with code_stack.client() as kc:
        digest = kc.artifacts.upload(module).digest
        spec = _spec(["torch", "kassay", "broken_merge"], [digest], K=[2, 3])
        job = kc.jobs.wait(kc.jobs.create(spec).id, timeout=180)
        report = kc.jobs.report(job.id)
    assert len(report.cases) == 6
    for case in report.cases:
        if case.impl == "broken_merge":
            assert case.status == "error", case.message
            assert "ModuleNotFoundError: No module named 'kassay_missing_helper'" in case.message
            assert str(code_stack.tmp) not in case.message  # no host path of the service's
        else:
            assert case.status == "passed", (case.impl, case.message)


def test_workers_describe_their_sandbox(code_stack: CodeStack) -> None:
    r = httpx.get(f"{code_stack.url}/v1/workers", timeout=10)
    (worker,) = r.json()
    box = worker["sandbox"]
    assert box["artifacts"] is True
    assert box["network"] in ("namespace", "landlock-tcp", "none")
    assert box["limits"]["nproc"] == 200 and box["notes"]


#: an artifact that attacks the verdict rather than the host: at import it makes the engine's
#: tolerance and bias checks pass everything, swaps the registry's built-in `torch` lse_merge for
#: a wrong one and breaks torch.exp; its own impl returns garbage
SUBVERT = """
import torch
from kassay.impls import Impl
from kassay.ops import registry
from kassay.validate import engine, tolerance, verdicts

def _always_pass(*args, **kwargs):
    return tolerance.Verdict(True, "", "baseline")

def _no_bias(*args, **kwargs):
    return verdicts.BiasVerdict(True, 1.0)

tolerance.judge = engine.judge = _always_pass
verdicts.check_bias = engine.check_bias = _no_bias

def _wrong(inputs, params):
    outs, lses = inputs["outs"], inputs["lses"]
    return {{"out": torch.zeros_like(outs[0]) + 9.0, "lse": lses[0].clone()}}

for key, impl in list(registry._REGISTRY.items()):
    if key == ("lse_merge", "torch"):
        registry._REGISTRY[key] = Impl("lse_merge", "torch", _wrong)
torch.exp = lambda t, *a, **k: t * 0.0
{extra}
def impls():
    return [Impl("lse_merge", "s_garbage", _wrong)]
"""

#: reads what the service keeps: its database, the worker's log, the host's secrets
SNOOP = """
import os
from kassay.impls import Impl

def _snoop(inputs, params):
    found = {{"uid": os.getuid()}}
    for path in {paths!r}:
        try:
            with open(path, "rb") as fh:
                found[path] = len(fh.read(64))
        except OSError as exc:
            found[path] = type(exc).__name__
    raise RuntimeError("READ " + repr(found))

def impls():
    return [Impl("lse_merge", "s_snoop", _snoop)]
"""


#: two impls of one artifact: the first writes garbage into its inputs in place after computing
#: its (right) outputs, the second computes honestly from the inputs it is lent
SCRIBBLE = """
from kassay.impls import Impl
from kassay.ops import registry

def _honest(inputs, params):
    return registry._REGISTRY[("lse_merge", "torch")].run(inputs, params)

def _scribble(inputs, params):
    out = {k: v.clone() for k, v in _honest(inputs, params).items()}
    for t in inputs.values():
        if t.is_floating_point():
            t.fill_(7.0)
    return out

def impls():
    return [Impl("lse_merge", "s_scribble", _scribble), Impl("lse_merge", "s_honest", _honest)]
"""


def _outputs(cases: dict[str, Any], impl: str) -> list[tuple[str, float, float]]:
    return [(o["name"], o["max_abs"], o["rel_l2"]) for o in cases[impl].outputs]


def test_code_a_job_brings_cannot_touch_a_verdict(code_stack: CodeStack) -> None:
    """#31: an artifact patching the verdict code, the registry and torch at import. Its garbage
    fails; the built-ins beside it pass with the very numbers they have without it."""
    module = code_stack.tmp / "kassay_subvert.py"
    module.write_text(SUBVERT.format(extra=""))
    with code_stack.client() as kc:
        digest = kc.artifacts.upload(module).digest
        plain = _spec(["torch", "kassay"], [])
        del plain["artifacts"]
        alone = _cases(kc, kc.jobs.wait(kc.jobs.create(plain).id, timeout=120).id)
        job = kc.jobs.wait(
            kc.jobs.create(_spec(["torch", "kassay", "s_garbage"], [digest])).id, timeout=180
        )
        beside = _cases(kc, job.id)
        md = kc.jobs.report(job.id, format="markdown")
        junit = kc.jobs.report(job.id, format="junit")
    assert "lse_merge.s_garbage (sandbox)" in md
    assert '<property name="ran_in" value="sandbox"' in junit
    assert beside["s_garbage"].status == "failed", beside["s_garbage"].message
    assert beside["s_garbage"].ran_in == "sandbox"
    assert "max_abs" in beside["s_garbage"].message
    for impl in ("torch", "kassay"):
        assert beside[impl].status == "passed", beside[impl].message
        assert beside[impl].ran_in == "trusted"
        assert _outputs(beside, impl) == _outputs(alone, impl)
    # the job's code was timed where it ran, and says so
    timing = beside["s_garbage"].timing
    assert timing is not None and timing["median_ms"] > 0


def test_an_impl_writing_into_its_inputs_changes_no_other_impls_inputs(
    code_stack: CodeStack,
) -> None:
    """Inputs are lent afresh for every call (kassay.worker.exchange.transports): garbage one impl
    writes into them in place never reaches the next impl. Its own second run (the determinism
    check) sees it, so the scribbler fails: impls must not modify their inputs."""
    module = code_stack.tmp / "kassay_scribble.py"
    module.write_text(SCRIBBLE)
    with code_stack.client() as kc:
        digest = kc.artifacts.upload(module).digest
        spec = _spec(["torch", "s_scribble", "s_honest"], [digest], K=[2, 3])
        job = kc.jobs.wait(kc.jobs.create(spec).id, timeout=180)
        report = kc.jobs.report(job.id)
    assert len(report.cases) == 6
    for case in report.cases:
        if case.impl == "s_scribble":
            assert case.status == "failed" and "second run" in case.message, case.message
        else:
            assert case.status == "passed", (case.impl, case.message)
        if case.ran_in == "sandbox":  # a CPU worker's transport
            assert case.environment["tensor_transport"] == "files", case.environment
    honest = [_outputs({"x": c}, "x") for c in report.cases if c.impl == "s_honest"]
    torch_ = [_outputs({"x": c}, "x") for c in report.cases if c.impl == "torch"]
    assert honest == torch_


def test_code_a_job_brings_reads_nothing_of_the_service(code_stack: CodeStack) -> None:
    worker_log = code_stack.worker.log
    database = code_stack.tmp / "k.db"
    paths = [str(database), str(worker_log), "/etc/shadow"]
    module = code_stack.tmp / "kassay_snoop.py"
    module.write_text(SNOOP.format(paths=paths))
    with code_stack.client() as kc:
        digest = kc.artifacts.upload(module).digest
        job = kc.jobs.wait(kc.jobs.create(_spec(["torch", "s_snoop"], [digest])).id, timeout=180)
        cases = _cases(kc, job.id)
    msg = cases["s_snoop"].message
    assert cases["s_snoop"].status == "error" and "READ" in msg, msg
    for path in paths:
        assert f"'{path}': 'PermissionError'" in msg or f"'{path}': 'FileNotFoundError'" in msg, msg
    if os.geteuid() == 0:  # a user of its own: another sandbox's processes do not count
        uid = int(re.search(r"'uid': (\d+)", msg).group(1))
        assert uid >= SANDBOX_UID, msg
