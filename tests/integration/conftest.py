"""Real processes on free loopback ports: CPU workers (`kassay worker ... --enable-test-impls`)
and the API (`kassay api`) over a real SQLite file, talked to through the SDK. Every process is
the installed console script in a user's environment (tests/users.py), working in the test's
own folder."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from users import KASSAY, user_env

from kassay.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
WRITE_TOKEN = "itest-write"
READ_TOKEN = "itest-read"
#: the workers' per-case timeout: the `hang` test impl must hit it quickly
CASE_TIMEOUT_S = 6.0


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return user_env(extra)


@dataclass
class Proc:
    """A started process, its log file and how to stop it."""

    name: str
    args: list[str]
    log: Path
    env: dict[str, str]
    popen: subprocess.Popen[bytes] | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def start(self) -> Proc:
        with open(self.log, "ab") as fh:
            self.popen = subprocess.Popen(
                [*KASSAY, *self.args],
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.log.parent,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL: no clean-up at all."""
        if self.alive():
            assert self.popen is not None
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(timeout=10)

    def stop(self) -> None:
        if not self.alive():
            return
        assert self.popen is not None
        self.popen.terminate()
        try:
            self.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=10)

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def start_worker(
    tmp: Path,
    *,
    port: int | None = None,
    name: str = "worker",
    host: str = "127.0.0.1",
    env: dict[str, str] | None = None,
    case_timeout_s: float = CASE_TIMEOUT_S,
) -> Proc:
    """A CPU worker; `env` adds environment (KASSAY_* settings: the token, TLS files, caps)."""
    port = port or free_port()
    proc = Proc(
        name,
        [
            "worker",
            "--listen",
            f"{host}:{port}",
            "--device",
            "cpu",
            "--enable-test-impls",
            "--case-timeout",
            str(case_timeout_s),
            "--worker-id",
            name,
        ],
        tmp / f"{name}.log",
        _env(env),
    )
    proc.extra["address"] = f"127.0.0.1:{port}"
    return proc.start()


def start_api(
    tmp: Path,
    workers: list[str],
    *,
    port: int | None = None,
    name: str = "api",
    db: Path | None = None,
    **settings: str,
) -> Proc:
    port = port or free_port()
    env = _env(
        {
            "KASSAY_WORKERS": ",".join(workers),
            "KASSAY_DATABASE_URL": f"sqlite:///{db or tmp / 'k.db'}",
            "KASSAY_WORKER_POLL_S": "0.5",
            **{f"KASSAY_{k.upper()}": v for k, v in settings.items()},
        }
    )
    proc = Proc(name, ["api", "--port", str(port), "--log-level", "info"], tmp / f"{name}.log", env)
    proc.extra["url"] = f"http://127.0.0.1:{port}"
    return proc.start()


def wait_ready(api: Proc, *procs: Proc, timeout: float = 180.0, workers_up: int = 1) -> None:
    """Until the API says ready with `workers_up` workers up."""
    deadline = time.monotonic() + timeout
    url = api.extra["url"]
    last = ""
    while time.monotonic() < deadline:
        for p in (api, *procs):
            if not p.alive():
                pytest.fail(f"{p.name} exited early:\n{p.tail()}")
        try:
            r = httpx.get(f"{url}/readyz", timeout=2.0)
            last = r.text
            if r.status_code == 200 and r.json().get("workers_up", 0) >= workers_up:
                return
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.3)
    pytest.fail(f"not ready after {timeout}s: {last}\n{api.tail()}")


@dataclass
class Stack:
    api: Proc
    workers: list[Proc]

    @property
    def url(self) -> str:
        return self.api.extra["url"]

    def stop(self) -> None:
        for p in (self.api, *self.workers):
            p.stop()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One CPU worker and one API (write and read tokens configured, reads open)."""
    tmp = tmp_path_factory.mktemp("stack")
    worker = start_worker(tmp)
    api = start_api(
        tmp,
        [worker.extra["address"]],
        api_tokens=WRITE_TOKEN,
        read_tokens=READ_TOKEN,
        max_body_bytes="200000",
    )
    st = Stack(api, [worker])
    try:
        wait_ready(api, worker)
        yield st
    finally:
        st.stop()


@pytest.fixture
def client(stack: Stack) -> Iterator[object]:
    from kassay_client import Client

    with Client(stack.url, token=WRITE_TOKEN, timeout=30) as c:
        yield c


@dataclass(frozen=True)
class Procs:
    """What tests that start their own processes use (a fixture, so tests need no import of
    this conftest)."""

    tmp: Path
    write_token: str = WRITE_TOKEN
    read_token: str = READ_TOKEN

    def worker(self, name: str = "worker", **kw: object) -> Proc:
        return start_worker(self.tmp, name=name, **kw)  # type: ignore[arg-type]

    def api(self, workers: list[Proc | str], **kw: object) -> Proc:
        """An API for these workers (processes, or KASSAY_WORKERS entries as they are)."""
        entries = [w if isinstance(w, str) else w.extra["address"] for w in workers]
        return start_api(self.tmp, entries, **kw)  # type: ignore[arg-type]

    def wait_ready(self, api: Proc, *procs: Proc, workers_up: int = 1) -> None:
        wait_ready(api, *procs, workers_up=workers_up)

    def serve(
        self,
        *,
        port: int,
        name: str = "serve",
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
    ) -> Proc:
        """`kassay serve` (API + its own CPU worker) over a database in this test's folder;
        `extra` arguments instead of `--device cpu`, `env` added to the usual environment
        (KASSAY_* settings), `args` more command-line options."""
        proc = Proc(
            name,
            [
                "serve",
                "--port",
                str(port),
                *(extra if extra is not None else ["--device", "cpu"]),
                "--data-dir",
                str(self.tmp / f"{name}-data"),
                *args,
            ],
            self.tmp / f"{name}.log",
            _env({"KASSAY_WORKER_POLL_S": "0.5", **(env or {})}),
        )
        proc.extra["url"] = f"http://127.0.0.1:{port}"
        return proc.start()

    @staticmethod
    def free_port() -> int:
        return free_port()

    @staticmethod
    def env(extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment the started processes get (a user's: tests/users.py)."""
        return _env(extra)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    yield Procs(tmp_path)


@pytest.fixture(scope="module")
def module_procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Procs]:
    """Procs for processes a whole test module shares."""
    yield Procs(tmp_path_factory.mktemp("module"))


@pytest.fixture
def read_token() -> str:
    return READ_TOKEN
