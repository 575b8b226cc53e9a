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
import sys
import threading
from pathlib import Path
from typing import Any

from kassay.api.embedded import (
    Embedded,
    _check_port,
    _settings,
    plan_gpus,
    visible_gpus,
)


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


def build_serve_parser() -> argparse.ArgumentParser:
    """`kassay serve`'s arguments alone (for callers that build an Embedded themselves)."""
    p = argparse.ArgumentParser(prog="kassay serve")
    _serve_args(p)
    return p


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument(
        "--gpus",
        default=None,
        metavar="all|N|device=I,J",
        help="one worker per GPU (each sees only its own, CUDA_VISIBLE_DEVICES): all visible "
        "GPUs, the first N, or these positions; with no GPU, `all` starts one CPU worker "
        "(default: one worker on --device)",
    )
    p.add_argument(
        "--worker-port",
        type=int,
        default=0,
        help="default: a free port (with --gpus: the first worker's; the next ones follow)",
    )
    p.add_argument("--data-dir", default=".kassay")
    p.add_argument(
        "--enable-test-impls",
        action="store_true",
        help="offer the crash/exit/hang/raise/slowable test impls (for integration tests); the "
        "self-test's mutants and correct alternatives need KASSAY_ENABLE_MUTANTS=true",
    )
    p.add_argument("--log-level", default="warning", help="debug | info | warning | error")


# ------------------------------------------------------------------------------------- api


def _configure_logging(level: str) -> None:
    """Level from --log-level, format from KASSAY_LOG_FORMAT (kassay.logs)."""
    from kassay.logs import configure
    from kassay.settings import get_settings

    configure(level, get_settings().log_format)


def cmd_api(args: argparse.Namespace) -> int:
    import uvicorn

    from kassay.api.app import create_app

    _configure_logging(args.log_level)
    settings = _settings(workers=args.worker, database_url=args.database_url)
    from kassay.api.store.migrate import SchemaError, check_url

    try:  # refuse a database behind this kassay's schema before serving anything
        check_url(settings.database_url)
    except SchemaError as exc:
        print(f"kassay api: {exc}", file=sys.stderr)
        return 2
    app = create_app(settings)
    # log_config None: uvicorn's loggers go through kassay's (kassay.logs); the access log is
    # kassay's own (kassay.access: structured fields in the JSON format)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        log_config=None,
    )
    return 0


# ----------------------------------------------------------------------------------- serve


def _embedded(args: argparse.Namespace, command: str) -> Embedded | None:
    """The embedded stack --gpus asks for (None, after saying why, when it cannot be had)."""
    if args.gpus is None:
        return Embedded(args)
    visible = visible_gpus()
    if not visible and args.gpus.strip() == "all":
        # a CPU machine (or no driver): still a working kassay, on the CPU
        print(
            f"kassay {command}: --gpus all: no GPU visible (no NVIDIA driver, or "
            "CUDA_VISIBLE_DEVICES hides them); starting one CPU worker",
            file=sys.stderr,
            flush=True,
        )
        args.device = "cpu"
        return Embedded(args)
    try:
        gpus = plan_gpus(args.gpus, visible)
    except ValueError as exc:
        print(f"kassay {command}: {exc}", file=sys.stderr)
        return None
    return Embedded(args, gpus=gpus)


def cmd_serve(args: argparse.Namespace) -> int:
    _configure_logging(args.log_level)
    problem = _check_port(args.host, args.port)
    if problem:
        print(f"kassay serve: {problem}", file=sys.stderr)
        return 2
    emb = _embedded(args, "serve")
    if emb is None:
        return 2
    emb.start_workers()
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
    emb = _embedded(args, "demo")
    if emb is None:
        return 2
    emb.start_workers()
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
