"""`kassay worker`: serve the kassay.v1.Worker gRPC service for one device.

    kassay worker --listen HOST:PORT --device cpu|cuda|cuda:N|auto
                  [--enable-test-impls] [--case-timeout S] [--worker-id ID]

Flags override the KASSAY_* settings (KASSAY_WORKER_LISTEN, KASSAY_DEVICE,
KASSAY_ENABLE_TEST_IMPLS, KASSAY_CASE_TIMEOUT_S, ...). The token and TLS files come from the
environment only (KASSAY_WORKER_TOKEN, KASSAY_WORKER_TLS_CERT/KEY/CLIENT_CA): a command line is
visible to every user of the host. Without a token or mTLS the worker listens on loopback only
(unless KASSAY_WORKER_ALLOW_UNAUTHENTICATED=true). Heavy imports (grpc, torch) happen inside
the command so that `kassay --help` stays fast.
"""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "worker",
        help="run a gRPC worker (one executor on one device)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--listen",
        default=None,
        help="HOST:PORT to listen on (default: KASSAY_WORKER_LISTEN, 127.0.0.1:50051;"
        " port 0 picks a free one)",
    )
    p.add_argument("--device", default=None, help="auto | cpu | cuda | cuda:N (default: auto)")
    p.add_argument(
        "--enable-test-impls",
        action="store_true",
        default=None,
        help="offer the crash/exit/hang/raise test impls (for integration tests)",
    )
    p.add_argument(
        "--case-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds a case may run before its executor is killed (default 300)",
    )
    p.add_argument("--worker-id", default=None, help="name reported in results and Describe")
    p.add_argument(
        "--metrics-listen",
        default=None,
        metavar="HOST:PORT",
        help="serve Prometheus /metrics there (default: KASSAY_WORKER_METRICS_LISTEN; none)",
    )
    p.add_argument(
        "--no-artifacts",
        dest="artifacts",
        action="store_false",
        default=None,
        help="run no code that jobs bring (default: run it sandboxed; KASSAY_WORKER_ARTIFACTS)",
    )
    p.set_defaults(func=_cmd_worker)


def _cmd_worker(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import sys

    from pydantic import ValidationError

    from kassay.settings import Settings

    overrides: dict[str, Any] = {
        "worker_listen": args.listen,
        "device": args.device,
        "enable_test_impls": args.enable_test_impls,
        "case_timeout_s": args.case_timeout,
        "worker_id": args.worker_id,
        "worker_artifacts": args.artifacts,
        "worker_metrics_listen": args.metrics_listen,
    }
    try:
        settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        for err in exc.errors():
            print(f"kassay worker: {'.'.join(map(str, err['loc']))}: {err['msg']}", file=sys.stderr)
        return 2
    from kassay.logs import configure

    configure(logging.INFO, settings.log_format)
    from kassay.worker.runner.sandbox import SandboxConfig
    from kassay.worker.server.service import WorkerConfig, serve

    artifact_dir = settings.artifact_dir or settings.data_dir / "artifacts"
    config = WorkerConfig(
        listen=settings.worker_listen,
        device=settings.device,
        worker_id=settings.worker_id,
        enable_test_impls=settings.enable_test_impls,
        case_timeout_s=settings.case_timeout_s,
        start_timeout_s=settings.executor_start_timeout_s,
        shutdown_grace_s=settings.worker_shutdown_grace_s,
        token=settings.worker_token.get_secret_value() if settings.worker_token else None,
        allow_unauthenticated=settings.worker_allow_unauthenticated,
        tls_cert=settings.worker_tls_cert,
        tls_key=settings.worker_tls_key,
        tls_client_ca=settings.worker_tls_client_ca,
        enable_mutants=settings.enable_mutants,
        max_run_groups=settings.max_run_groups,
        max_queued_groups=settings.max_queued_groups,
        max_group_impls=settings.max_group_impls,
        max_timing_budget_s=settings.max_timing_budget_s,
        artifact_dir=str(artifact_dir.resolve()) if settings.worker_artifacts else None,
        max_artifact_bytes=settings.max_artifact_bytes,
        metrics_listen=settings.worker_metrics_listen,
        keepalive_s=settings.grpc_keepalive_s,
        sandbox=SandboxConfig(
            workdir="",
            cpu_s=settings.sandbox_cpu_s,
            nofile=settings.sandbox_nofile,
            nproc=settings.sandbox_nproc,
            data_bytes=settings.sandbox_memory_bytes or _half_memory(),
            uid=settings.sandbox_uid,
        ),
    )
    return asyncio.run(serve(config))


def _half_memory() -> int:
    """Half of the host's memory: the default host-memory limit of sandboxed code."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError):
        return 0
