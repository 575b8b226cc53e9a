"""`kassay api`, `kassay serve` and `kassay demo`.

- api: the REST front end alone (workers from --worker or KASSAY_WORKERS).
- serve: the embedded default for one machine: the API, one local worker subprocess on the best
  device present (CUDA if any, else CPU) and SQLite under ./.kassay/. The two share a random
  worker token made at start; their link stays on loopback, so it needs no TLS. Jobs may bring
  code (artifacts, run sandboxed) unless KASSAY_ALLOW_CODE=false.
- demo: serve, then submit a spec through the SDK once ready and print the report; exits with
  the client's exit code, or keeps serving with --keep-serving until Ctrl-C.

Heavy imports (fastapi, uvicorn, grpc, torch) stay inside the command functions.
"""

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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_log = logging.getLogger("kassay.serve")


def register(sub: Any) -> None:
    p = sub.add_parser("api", help="run the REST API (dispatches to gRPC workers)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--worker",
        action="append",
        default=None,
        metavar="HOST:PORT",
        help="a worker address (repeat; default: KASSAY_WORKERS)",
    )
    p.add_argument("--database-url", default=None, help="default: KASSAY_DATABASE_URL")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=cmd_api)

    p = sub.add_parser("serve", help="API + one local worker + SQLite under ./.kassay/")
    _serve_args(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("demo", help="serve, submit SPEC through the SDK, print the report")
    _serve_args(p)
    p.add_argument(
        "--keep-serving", action="store_true", help="keep serving after the report until Ctrl-C"
    )
    p.add_argument("spec", help="job spec (YAML or JSON)")
    p.set_defaults(func=cmd_demo)


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--worker-port", type=int, default=0, help="default: a free port")
    p.add_argument("--data-dir", default=".kassay")
    p.add_argument("--enable-test-impls", action="store_true")
    p.add_argument("--log-level", default="warning")


# ------------------------------------------------------------------------------------- api


def _settings(**overrides: Any) -> Any:
    from kassay.settings import Settings

    return Settings(**{k: v for k, v in overrides.items() if v is not None})


def _configure_logging(level: str) -> None:
    import logging

    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def cmd_api(args: argparse.Namespace) -> int:
    import uvicorn

    from kassay.api.app import create_app

    _configure_logging(args.log_level)
    settings = _settings(workers=args.worker, database_url=args.database_url)
    app = create_app(settings)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    return 0


# ----------------------------------------------------------------------------------- serve


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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


class Embedded:
    """The API (uvicorn in this process) plus one worker subprocess."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = best_device(args.device)
        self.worker_port = args.worker_port or free_port()
        self.worker_addr = f"127.0.0.1:{self.worker_port}"
        self.data_dir = Path(args.data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.url = f"http://{args.host}:{args.port}"
        self.worker: subprocess.Popen[bytes] | None = None
        self.server: Any = None
        self.worker_restarts = 0
        self._worker_started = 0.0
        self._stopping = threading.Event()
        self._watchdog: threading.Thread | None = None
        # The local worker takes calls only with this token (other users of the host can reach
        # its loopback port); it reaches the worker through its environment, not its argv.
        self.worker_token = os.environ.get("KASSAY_WORKER_TOKEN") or secrets.token_urlsafe(32)

    def start_worker(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "kassay.cli",
            "worker",
            "--listen",
            self.worker_addr,
            "--device",
            self.device,
        ]
        if self.args.enable_test_impls:
            cmd.append("--enable-test-impls")
        env = {**os.environ, "KASSAY_WORKER_TOKEN": self.worker_token}
        with open(self.data_dir / "worker.log", "ab") as log:
            self.worker = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent
            )
        self._worker_started = time.monotonic()

    def supervise_worker(self) -> None:
        """Restart the worker whenever it exits (killed, crashed), with a backoff that doubles
        from 1 s to 30 s and starts over once a worker has lived a minute; the API requeues the
        groups it was running. Runs until stop_worker()."""

        def watch() -> None:
            backoff = 1.0
            while not self._stopping.wait(0.5):
                proc = self.worker
                if proc is None or proc.poll() is None:  # poll() also reaps a dead child
                    continue
                lived = time.monotonic() - self._worker_started
                if lived > 60:
                    backoff = 1.0
                _log.warning(
                    "the worker exited (%s) after %.0f s; restarting it in %.0f s",
                    _exit_text(proc.returncode),
                    lived,
                    backoff,
                )
                if self._stopping.wait(backoff):
                    return
                self.worker_restarts += 1
                self.start_worker()
                backoff = min(backoff * 2, 30.0)

        self._watchdog = threading.Thread(target=watch, name="worker-watchdog", daemon=True)
        self._watchdog.start()

    def make_server(self) -> Any:
        import uvicorn

        from kassay.api.app import create_app

        settings = _settings(
            workers=[self.worker_addr],
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
        )
        self.server = _quiet_server_class()(config)  # uvicorn imported on first use
        return self.server

    def banner(self) -> str:
        return (
            f"kassay serving\n  API        {self.url}\n  dashboard  {self.url}/\n"
            f"  docs       {self.url}/docs\n  metrics    {self.url}/metrics\n"
            f"  worker     grpc://{self.worker_addr} ({self.device}; log "
            f"{self.data_dir / 'worker.log'})\n  database   {self.data_dir / 'kassay.db'}"
        )

    def stop_worker(self) -> None:
        self._stopping.set()
        if self._watchdog is not None:
            self._watchdog.join(timeout=5)
        if self.worker is None or self.worker.poll() is not None:
            return
        self.worker.terminate()
        try:
            self.worker.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.worker.kill()
            self.worker.wait()

    def wait_ready(self, timeout: float = 300.0) -> bool:
        """Poll /readyz until the API and its worker are up."""
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.worker is not None and self.worker.poll() is not None:
                return False
            try:
                r = httpx.get(f"{self.url}/readyz", timeout=2.0)
                if r.status_code == 200 and r.json().get("workers_up", 0) >= 1:
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


def cmd_serve(args: argparse.Namespace) -> int:
    _configure_logging(args.log_level)
    problem = _check_port(args.host, args.port)
    if problem:
        print(f"kassay serve: {problem}", file=sys.stderr)
        return 2
    emb = Embedded(args)
    emb.start_worker()
    emb.supervise_worker()
    server = emb.make_server()
    print(emb.banner(), flush=True)
    try:
        server.run()
    finally:
        emb.stop_worker()
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    _configure_logging(args.log_level)
    if not Path(args.spec).is_file():
        print(f"kassay demo: no such spec file: {args.spec}", file=sys.stderr)
        return 2
    problem = _check_port(args.host, args.port)
    if problem:
        print(f"kassay demo: {problem}", file=sys.stderr)
        return 2
    emb = Embedded(args)
    emb.start_worker()
    emb.supervise_worker()
    server = emb.make_server()
    result = {"code": 2}

    def submit() -> None:
        from kassay_client.cli import submit_and_report

        try:
            if not emb.wait_ready():
                print(
                    "kassay demo: the API or its worker did not become ready; see "
                    f"{emb.data_dir / 'worker.log'}",
                    file=sys.stderr,
                )
                return
            print(emb.banner(), flush=True)
            result["code"] = submit_and_report(emb.url, args.spec, token=None, print_markdown=True)
            if args.keep_serving:
                print(
                    f"\nstill serving at {emb.url} (dashboard: {emb.url}/); Ctrl-C stops",
                    flush=True,
                )
        finally:
            if not args.keep_serving:
                server.should_exit = True

    thread = threading.Thread(target=submit, name="demo-submit", daemon=True)
    thread.start()
    try:
        server.run()
    finally:
        emb.stop_worker()
    thread.join(timeout=5)
    return result["code"]
