"""The process launcher of `kassay serve` and `kassay demo`: the best device, the GPUs a host
offers and one local worker subprocess per device (`Embedded`), supervised and restarted, with
the API's uvicorn server in this process. kassay.cli.api parses the commands and calls it."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kassay.ports import free_port

_log = logging.getLogger("kassay.serve")


def _settings(**overrides: Any) -> Any:
    """Settings from the environment with the command line's values (None: not given) over
    them."""
    from kassay.settings import Settings

    return Settings(**{k: v for k, v in overrides.items() if v is not None})


def best_device(requested: str) -> str:
    """`auto` → cuda:0 when a CUDA device is usable, else cpu."""
    if requested != "auto":
        return requested
    import shutil

    if shutil.which("nvidia-smi") is None:
        return "cpu"
    try:
        import torch

        return "cuda:0" if torch.cuda.is_available() else "cpu"
    except Exception:
        return "cpu"


def visible_gpus(env: Mapping[str, str] | None = None) -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries: that variable's own list
    when it is set, else one index per device NVML counts; [] without a driver or NVML. (The
    device enumeration: the one place tests replace to lay out workers for GPUs they lack.)"""
    environ: Mapping[str, str] = os.environ if env is None else env
    if "CUDA_VISIBLE_DEVICES" in environ:
        entries = [e.strip() for e in environ["CUDA_VISIBLE_DEVICES"].split(",")]
        # CUDA stops at the first invalid entry; "-1" (or nothing) hides every device
        out: list[str] = []
        for entry in entries:
            if not entry or entry.startswith("-"):
                break
            out.append(entry)
        return out
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [str(i) for i in range(int(pynvml.nvmlDeviceGetCount()))]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no binding, no driver, no device
        return []


def plan_gpus(spec: str, visible: list[str]) -> list[str]:
    """`--gpus` → the CUDA_VISIBLE_DEVICES value of each worker, one GPU each.

    `all`: every visible GPU; `N`: the first N (a count, as `docker run --gpus N`);
    `device=0,2` or `0,2`: those (positions among the visible GPUs, as CUDA numbers them; one
    GPU alone is `device=1`). Raises ValueError when they are not there."""
    spec = spec.strip()
    if spec == "all":
        return list(visible)
    if spec.isdigit():
        n = int(spec)
        if n < 1:
            raise ValueError(f"--gpus {n}: a count of at least 1 (GPU {n} alone: device={n})")
        if n > len(visible):
            raise ValueError(f"--gpus {n}: {len(visible)} GPU(s) visible")
        return visible[:n]
    listed = spec.removeprefix("device=")
    try:
        picks = [int(p) for p in listed.split(",") if p.strip()]
    except ValueError:
        raise ValueError(f"--gpus {spec!r}: write all, a count, or positions like 0,2") from None
    if not picks or len(set(picks)) != len(picks):
        raise ValueError(f"--gpus {spec!r}: each GPU once")
    bad = [p for p in picks if not 0 <= p < len(visible)]
    if bad:
        raise ValueError(f"--gpus {spec!r}: no GPU {bad[0]} ({len(visible)} visible)")
    return [visible[p] for p in picks]


@dataclass
class LocalWorker:
    """One worker subprocess of `kassay serve`: its device, its port and the GPU it sees."""

    device: str
    port: int
    log: Path
    cuda_visible: str | None = None  # CUDA_VISIBLE_DEVICES for it (None: inherited)
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restarts: int = 0
    backoff: float = 1.0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


class Embedded:
    """The API (uvicorn in this process) plus its worker subprocesses: one on the best device
    present, or one per GPU with --gpus."""

    def __init__(self, args: argparse.Namespace, *, gpus: list[str] | None = None) -> None:
        """`gpus`: the CUDA_VISIBLE_DEVICES value of each worker (plan_gpus); None: one
        worker on --device."""
        self.args = args
        self.data_dir = Path(args.data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.url = f"http://{args.host}:{args.port}"
        first_port = getattr(args, "worker_port", 0) or 0
        if gpus:
            # each worker sees one GPU, as its cuda:0
            self.workers = [
                LocalWorker(
                    "cuda:0",
                    first_port + i if first_port else free_port(),
                    self.data_dir / f"worker-gpu{gpu}.log",
                    cuda_visible=gpu,
                )
                for i, gpu in enumerate(gpus)
            ]
        else:
            self.workers = [
                LocalWorker(
                    best_device(args.device),
                    first_port or free_port(),
                    self.data_dir / "worker.log",
                )
            ]
        self.server: Any = None
        self._stopping = threading.Event()
        self._watchdog: threading.Thread | None = None
        # The local workers take calls only with this token (other users of the host can reach
        # their loopback ports); it reaches them through their environment, not their argv.
        self.worker_token = os.environ.get("KASSAY_WORKER_TOKEN") or secrets.token_urlsafe(32)

    # The single-worker names older callers use.
    @property
    def worker(self) -> subprocess.Popen[bytes] | None:
        return self.workers[0].proc

    @property
    def device(self) -> str:
        return self.workers[0].device

    @property
    def worker_addr(self) -> str:
        return self.workers[0].address

    @property
    def worker_restarts(self) -> int:
        return sum(w.restarts for w in self.workers)

    def start_workers(self) -> None:
        for w in self.workers:
            self.start_worker(w)

    def start_worker(self, w: LocalWorker | None = None) -> None:
        w = w or self.workers[0]
        cmd = [
            sys.executable,
            "-m",
            "kassay.cli",
            "worker",
            "--listen",
            w.address,
            "--device",
            w.device,
        ]
        if self.args.enable_test_impls:
            cmd.append("--enable-test-impls")
        env = {**os.environ, "KASSAY_WORKER_TOKEN": self.worker_token}
        if w.cuda_visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = w.cuda_visible
            env["KASSAY_WORKER_ID"] = f"{socket.gethostname()}:gpu{w.cuda_visible}"
        with open(w.log, "ab") as log:
            w.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent
            )
        w.started = time.monotonic()

    def supervise_worker(self) -> None:
        """Restart each worker whenever it exits (killed, crashed), with a backoff that doubles
        from 1 s to 30 s and starts over once a worker has lived a minute; the API requeues the
        groups it was running. Runs until stop_worker()."""

        def watch() -> None:
            due: dict[int, float] = {}  # worker index -> when to restart it
            while not self._stopping.wait(0.5):
                for i, w in enumerate(self.workers):
                    proc = w.proc
                    if proc is None or proc.poll() is None:  # poll() also reaps a dead child
                        continue
                    now = time.monotonic()
                    if i not in due:
                        lived = now - w.started
                        if lived > 60:
                            w.backoff = 1.0
                        _log.warning(
                            "the worker on %s exited (%s) after %.0f s; restarting it in %.0f s",
                            w.address,
                            _exit_text(proc.returncode),
                            lived,
                            w.backoff,
                        )
                        due[i] = now + w.backoff
                    if now >= due[i] and not self._stopping.is_set():
                        del due[i]
                        w.restarts += 1
                        self.start_worker(w)
                        w.backoff = min(w.backoff * 2, 30.0)

        self._watchdog = threading.Thread(target=watch, name="worker-watchdog", daemon=True)
        self._watchdog.start()

    def make_server(self) -> Any:
        import uvicorn

        from kassay.api.app import create_app

        settings = _settings(
            workers=[w.address for w in self.workers],
            database_url=os.environ.get("KASSAY_DATABASE_URL")
            or f"sqlite:///{self.data_dir / 'kassay.db'}",
            data_dir=self.data_dir,
            enable_test_impls=True if self.args.enable_test_impls else None,
            worker_token=self.worker_token,
            # one machine: its user may bring code (sandboxed) unless told otherwise
            allow_code=None if "KASSAY_ALLOW_CODE" in os.environ else True,
        )
        config = uvicorn.Config(
            create_app(settings),
            host=self.args.host,
            port=self.args.port,
            log_level=self.args.log_level,
            access_log=False,
            log_config=None,
        )
        self.server = _quiet_server_class()(config)  # uvicorn imported on first use
        return self.server

    def banner(self) -> str:
        lines = [
            "kassay serving",
            f"  API        {self.url}",
            f"  dashboard  {self.url}/",
            f"  docs       {self.url}/docs",
            f"  metrics    {self.url}/metrics",
        ]
        for w in self.workers:
            gpu = f", GPU {w.cuda_visible}" if w.cuda_visible is not None else ""
            lines.append(f"  worker     grpc://{w.address} ({w.device}{gpu}; log {w.log})")
        lines.append(f"  database   {self.data_dir / 'kassay.db'}")
        return "\n".join(lines)

    def stop_worker(self) -> None:
        """Stop every worker: SIGTERM to all at once (each drains), SIGKILL after 15 s."""
        self._stopping.set()
        if self._watchdog is not None:
            self._watchdog.join(timeout=5)
        procs = [w.proc for w in self.workers if w.proc is not None and w.proc.poll() is None]
        for proc in procs:
            proc.terminate()
        deadline = time.monotonic() + 15
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def wait_ready(self, timeout: float = 300.0) -> bool:
        """Poll /readyz until the API and all its workers are up."""
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(w.proc is not None and w.proc.poll() is not None for w in self.workers):
                return False
            try:
                r = httpx.get(f"{self.url}/readyz", timeout=2.0)
                if r.status_code == 200 and r.json().get("workers_up", 0) >= len(self.workers):
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        return False


def _quiet_server_class() -> Any:
    import uvicorn

    class QuietServer(uvicorn.Server):
        """uvicorn re-raises the SIGTERM/SIGINT it caught once it has shut down, which would kill
        `kassay serve` before it stops its worker (the worker then died only by its parent-death
        signal, and serve's exit status said "killed"). Here the signal is consumed: the caller
        stops the worker and exits 0, as `kassay worker` does after a drain."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                yield
                self.signals_caught = list(self._captured_signals)
                self._captured_signals.clear()

    return QuietServer


def _die_with_parent() -> None:
    """In the worker child (Linux): get SIGTERM when `kassay serve` dies, even by SIGKILL, so
    no worker is left re-parented to init. (The signal follows the thread that started the
    child: the watchdog's restarts live until stop_worker() ends that thread.)"""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _check_port(host: str, port: int) -> str | None:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            return f"cannot listen on {host}:{port}: {exc.strerror}"
    return None
