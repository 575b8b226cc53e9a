"""The worker's gRPC server: kassay.v1.Worker, grpc.health.v1 and server reflection on one port.

Health (service "" and "kassay.v1.Worker") is SERVING while the executor is up, NOT_SERVING while
it starts or restarts and for good once shutdown begins. SIGTERM/SIGINT drain the worker: new Run
calls are refused (UNAVAILABLE), the running case finishes, every other case of the queued groups
is handed back in GroupDone.not_run, the streams end, then the process exits 0.

Who may call it and what a call may ask are kassay.worker.server.access (token, TLS/mTLS, loopback
unless authenticated) and WorkerService._limits (the worker's own caps on a Run, whatever the
caller is).

Artifacts (code a job brings) arrive through PutArtifact, are checked against their sha256 and
kept in the artifact cache; groups that name them run only in sandboxed executors
(kassay.worker.runner.sandbox), and Describe says what that sandbox stops on this host.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from kassay import __version__
from kassay.contract import keepalive
from kassay.contract import wire as convert
from kassay.contract.results import CaseResult
from kassay.contract.spec import CONVERGENCE_REGIME, MAX_ARTIFACTS, GroupSpec
from kassay.contract.v1 import worker_pb2 as pb
from kassay.contract.v1 import worker_pb2_grpc
from kassay.errors import (
    ConflictError,
    InvalidSpecError,
    ResourceError,
    UnknownImplError,
    WorkerUnavailableError,
)
from kassay.ops import params_model
from kassay.worker.runner.sandbox import SandboxConfig
from kassay.worker.server.access import TokenInterceptor, exposure_problem, server_credentials
from kassay.worker.server.artifact_cache import ArtifactCache
from kassay.worker.server.interceptor import ErrorInterceptor
from kassay.worker.server.metrics import WorkerMetrics
from kassay.worker.server.supervisor import ExecutorStartError, RunHandle, Supervisor

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Worker"].full_name
#: longest run id and group id a Run may carry
MAX_ID_CHARS = 256


@dataclass
class WorkerConfig:
    listen: str = "127.0.0.1:50051"
    device: str = "auto"
    worker_id: str | None = None
    enable_test_impls: bool = False
    case_timeout_s: float = 300.0
    start_timeout_s: float = 120.0
    shutdown_grace_s: float = 30.0
    # who may talk to it (kassay.worker.server.access)
    token: str | None = None
    allow_unauthenticated: bool = False
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    # what one Run may ask, whatever the caller says
    enable_mutants: bool = False
    max_run_groups: int = 64
    max_queued_groups: int = 4096
    max_group_impls: int = 65
    max_timing_budget_s: float = 60.0
    #: the artifact cache; None: this worker runs no artifacts
    artifact_dir: str | None = None
    max_artifact_bytes: int = 64 * 2**20
    sandbox: SandboxConfig | None = None
    #: HOST:PORT of the Prometheus /metrics endpoint (None: none)
    metrics_listen: str | None = None
    #: the API's ping interval (kassay.contract.keepalive): pings that often are accepted
    keepalive_s: float = keepalive.DEFAULT_INTERVAL_S


class _StreamSink:
    """Turns supervisor events into kassay.v1.CaseEvent messages on a queue for one Run call."""

    def __init__(self, run_id: str, metrics: WorkerMetrics | None = None) -> None:
        self.run_id = run_id
        self.metrics = metrics
        self.queue: asyncio.Queue[pb.CaseEvent | None] = asyncio.Queue()
        self.seq = 0
        self.finished_flag = False

    def _put(self, **kw: Any) -> None:
        self.seq += 1
        self.queue.put_nowait(pb.CaseEvent(run_id=self.run_id, seq=self.seq, **kw))

    def started(self, case_id: str, group_id: str, impl: str, attempt: int) -> None:
        self._put(
            started=pb.CaseStarted(case_id=case_id, group_id=group_id, impl=impl, attempt=attempt)
        )

    def result(self, result: CaseResult) -> None:
        self._put(result=convert.result_to_proto(result))
        if self.metrics is not None:
            self.metrics.observe(result)

    def done(
        self, group_id: str, n_results: int, not_run: list[str], reason: str, duration_s: float
    ) -> None:
        self._put(
            done=pb.GroupDone(
                group_id=group_id,
                n_results=n_results,
                not_run=not_run,
                reason=reason,
                duration_s=duration_s,
            )
        )

    def finished(self) -> None:
        self.finished_flag = True
        self.queue.put_nowait(None)


class WorkerService(worker_pb2_grpc.WorkerServicer):
    """kassay.v1.Worker over one Supervisor."""

    def __init__(
        self, supervisor: Supervisor, config: WorkerConfig, metrics: WorkerMetrics | None = None
    ) -> None:
        self.sup = supervisor
        self.config = config
        self.metrics = metrics
        self.draining = False

    # ------------------------------------------------------------------------------ Describe

    async def Describe(
        self, request: pb.DescribeRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeResponse:
        await self.sup.wait_ready(self.config.start_timeout_s)
        info = self.sup.info
        resp = pb.DescribeResponse(
            worker_id=self.sup.worker_id,
            device=info.get("device", ""),
            device_name=info.get("device_name", ""),
            memory_total_bytes=int(info.get("memory_total_bytes", 0)),
            memory_free_bytes=int(info.get("memory_free_bytes", 0)),
            test_impls_enabled=self.config.enable_test_impls,
            case_timeout_s=self.config.case_timeout_s,
            version=__version__,
            max_run_groups=self.config.max_run_groups,
        )
        env = self.sup.environment
        if env is not None:
            convert.environment_to_proto(env, resp.environment)
        ceilings = self.sup.ceilings or {}
        resp.ceilings.SetInParent()
        for key in ("matmul_tflops", "copy_gbps"):
            if key in ceilings:
                setattr(resp.ceilings, key, float(ceilings[key]))
        resp.ceilings.all.update({k: float(v) for k, v in ceilings.items()})
        for op in info.get("ops", []):
            if not self.config.enable_mutants:  # the worker runs none: do not offer them
                op = {**op, "impls": [m for m in op["impls"] if m["kind"] != "mutant"]}
            convert.fill(resp.ops.add(), op)
        snap = self.sup.snapshot()
        snap["state"] = pb.ExecutorState.Value(f"EXECUTOR_STATE_{snap['state']}")
        convert.fill(resp.executor, snap)
        convert.fill(resp.sandbox, self.sup.sandbox_info())
        return resp

    # ----------------------------------------------------------------------------- Artifacts

    def _cache(self) -> ArtifactCache:
        if self.sup.artifacts is None:
            raise ConflictError("this worker runs no artifacts (started without them)")
        return self.sup.artifacts

    async def ArtifactStatus(
        self, request: pb.ArtifactStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.ArtifactStatusResponse:
        cache = self._cache()
        # As many as one Run's groups can name: a cap of the worker's own, like Run's.
        cap = MAX_ARTIFACTS * self.config.max_run_groups
        if len(request.digests) > cap:
            raise InvalidSpecError(
                f"digests: {len(request.digests)} asked at once; this worker answers at most {cap}",
                details={"errors": [{"loc": ["digests"], "msg": "too many digests"}]},
            )
        missing = await asyncio.to_thread(cache.missing, list(request.digests))
        return pb.ArtifactStatusResponse(missing=missing)

    async def PutArtifact(
        self, request_iterator: AsyncIterator[pb.ArtifactChunk], context: grpc.aio.ServicerContext
    ) -> pb.ArtifactInfo:
        cache = self._cache()
        first = await anext(aiter(request_iterator), None)
        if first is None or not first.digest:
            raise InvalidSpecError("the first chunk of an artifact must name its digest")
        if first.size > cache.max_bytes:
            raise InvalidSpecError(
                f"artifact {first.digest[:12]} has {first.size} bytes; the limit is "
                f"{cache.max_bytes}"
            )
        # The chunks are gathered here (at most max_bytes) and hashed and written in a thread.
        chunks = [first.data]
        size = len(first.data)
        async for chunk in request_iterator:
            size += len(chunk.data)
            if size > cache.max_bytes:
                raise InvalidSpecError(f"artifact {first.digest[:12]} is over its limit")
            chunks.append(chunk.data)
        n, existed = await asyncio.to_thread(cache.put, first.digest, first.filename, chunks)
        return pb.ArtifactInfo(digest=first.digest, size=n, existed=existed)

    # ----------------------------------------------------------------------------------- Run

    def _check_groups(self, groups: list[GroupSpec], include_mutants: bool) -> None:
        """Op, regime and impl names against what the executor reported it can run."""
        ops = {o["name"]: o for o in self.sup.info.get("ops", [])}
        seen: set[str] = set()
        for i, g in enumerate(groups):
            loc: list[Any] = ["groups", i]
            if g.group_id in seen:
                raise InvalidSpecError(
                    f"groups.{i}.group_id: {g.group_id!r} appears twice in this run",
                    details={"errors": [{"loc": [*loc, "group_id"], "msg": "duplicate"}]},
                )
            seen.add(g.group_id)
            op = ops.get(g.op)
            if op is None:
                raise InvalidSpecError(
                    f"groups.{i}.op: this worker has no op {g.op!r}",
                    details={
                        "errors": [{"loc": [*loc, "op"], "msg": "unknown op"}],
                        "allowed": sorted(ops),
                    },
                )
            if g.artifacts:
                if self.sup.artifacts is None:
                    raise ConflictError(
                        f"groups.{i}.artifacts: this worker runs no artifacts",
                        details={"errors": [{"loc": [*loc, "artifacts"], "msg": "no artifacts"}]},
                    )
                missing = self.sup.artifacts.missing(g.artifacts)
                if missing:
                    raise ConflictError(
                        f"groups.{i}.artifacts: this worker does not hold "
                        f"{', '.join(missing)}; send them with PutArtifact first",
                        details={"errors": [{"loc": [*loc, "artifacts"], "msg": "missing"}]},
                    )
            if g.convergence is not None:
                if not g.regime.startswith(CONVERGENCE_REGIME):
                    raise InvalidSpecError(
                        f"groups.{i}.regime: a convergence group's regime starts with "
                        f"{CONVERGENCE_REGIME!r}",
                        details={"errors": [{"loc": [*loc, "regime"], "msg": "not convergence"}]},
                    )
            elif g.regime not in op["regimes"]:
                raise InvalidSpecError(
                    f"groups.{i}.regime: op {g.op!r} has no regime {g.regime!r}; known "
                    f"regimes: {', '.join(op['regimes'])}",
                    details={
                        "errors": [{"loc": [*loc, "regime"], "msg": "unknown regime"}],
                        "allowed": op["regimes"],
                    },
                )
            known = [m["name"] for m in op["impls"] if include_mutants or m["kind"] != "mutant"]
            if len(set(g.impls)) != len(g.impls):
                raise InvalidSpecError(
                    f"groups.{i}.impls: an impl is listed twice",
                    details={"errors": [{"loc": [*loc, "impls"], "msg": "duplicate impl"}]},
                )
            if g.artifacts:  # its impls may come from the artifacts: checked once they load
                continue
            for field, names in (("impls", g.impls), ("baseline", [g.baseline])):
                for name in names:
                    if name not in known:
                        raise UnknownImplError(
                            f"groups.{i}.{field}: unknown impl {name!r} for op {g.op!r}; "
                            f"known impls: {', '.join(known)}",
                            details={
                                "errors": [{"loc": [*loc, field], "msg": f"unknown impl {name!r}"}],
                                "op": g.op,
                                "allowed": known,
                            },
                        )

    def _limits(self, request: pb.RunRequest) -> None:
        """The worker's own caps on a Run, checked before anything is parsed or queued: the
        API bounds what it sends, but the worker does not rely on its caller for that."""
        cfg = self.config

        def refuse(loc: list[Any], msg: str, text: str) -> InvalidSpecError:
            return InvalidSpecError(text, details={"errors": [{"loc": loc, "msg": msg}]})

        if not request.groups:
            raise refuse(["groups"], "empty", "groups: a run needs at least one group")
        if len(request.groups) > cfg.max_run_groups:
            raise refuse(
                ["groups"],
                "too many groups",
                f"groups: {len(request.groups)} groups in one run; this worker takes at most "
                f"{cfg.max_run_groups} (KASSAY_MAX_RUN_GROUPS)",
            )
        if len(request.run_id) > MAX_ID_CHARS:
            raise refuse(["run_id"], "too long", f"run_id: at most {MAX_ID_CHARS} characters")
        if len(request.job_id) > MAX_ID_CHARS:
            raise refuse(["job_id"], "too long", f"job_id: at most {MAX_ID_CHARS} characters")
        if request.HasField("case_timeout_s") and not request.case_timeout_s >= 0:
            raise refuse(["case_timeout_s"], "negative", "case_timeout_s: must not be negative")
        for i, g in enumerate(request.groups):
            if len(g.group_id) > MAX_ID_CHARS:
                raise refuse(
                    ["groups", i, "group_id"],
                    "too long",
                    f"groups.{i}.group_id: at most {MAX_ID_CHARS} characters",
                )
            if len(g.impls) > cfg.max_group_impls:
                raise refuse(
                    ["groups", i, "impls"],
                    "too many impls",
                    f"groups.{i}.impls: {len(g.impls)} impls; this worker runs at most "
                    f"{cfg.max_group_impls} per group (KASSAY_MAX_GROUP_IMPLS)",
                )
        queued = int(self.sup.snapshot().get("queued_groups", 0))
        if queued + len(request.groups) > cfg.max_queued_groups:
            raise ResourceError(
                f"the worker's queue is full ({queued} groups queued, at most "
                f"{cfg.max_queued_groups}); try again later",
                details={"queued_groups": queued, "max_queued_groups": cfg.max_queued_groups},
            )

    def _within_budget(self, groups: list[GroupSpec]) -> list[GroupSpec]:
        """Timing budgets cut to the worker's limit (the case's other settings untouched)."""
        cap = self.config.max_timing_budget_s
        return [
            g
            if g.timing.budget_s <= cap
            else g.model_copy(update={"timing": g.timing.model_copy(update={"budget_s": cap})})
            for g in groups
        ]

    async def Run(
        self, request: pb.RunRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.CaseEvent]:
        if self.draining:
            raise WorkerUnavailableError("the worker is shutting down")
        self._limits(request)
        groups = convert.groups_from_proto(request.groups, params_model=params_model)
        groups = self._within_budget(groups)
        # Mutants only where this worker offers them; a caller cannot switch them on.
        include_mutants = request.include_mutants and self.config.enable_mutants
        await self.sup.wait_ready(self.config.start_timeout_s)
        self._check_groups(groups, include_mutants)
        run_id = request.run_id or f"run-{uuid.uuid4().hex[:12]}"
        sink = _StreamSink(run_id, self.metrics)
        # A run may shorten the worker's case timeout, never lengthen it.
        timeout = min(
            request.case_timeout_s or self.config.case_timeout_s, self.config.case_timeout_s
        )
        handle = RunHandle(
            run_id=run_id,
            # a run without a job is a job of its own: its code runners end with it
            job_id=request.job_id,
            job_last=request.job_last or not request.job_id,
            sink=sink,
            include_mutants=include_mutants,
            case_timeout_s=timeout,
        )
        self.sup.submit(handle, groups)
        try:
            while True:
                event = await sink.queue.get()
                if event is None:
                    return
                yield event
        finally:
            if not sink.finished_flag:  # the client went away: stop spending the device on it
                self.sup.cancel(run_id)

    # -------------------------------------------------------------------------------- Cancel

    async def Cancel(
        self, request: pb.CancelRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelResponse:
        if not request.run_id:
            raise InvalidSpecError(
                "run_id: required", details={"errors": [{"loc": ["run_id"], "msg": "empty"}]}
            )
        found, n = self.sup.cancel(request.run_id)
        return pb.CancelResponse(found=found, cancelled_groups=n)


def _default_worker_id(port: int) -> str:
    return f"{socket.gethostname()}:{port}"


async def serve(config: WorkerConfig, *, ready: asyncio.Event | None = None) -> int:
    """Run the worker until SIGTERM/SIGINT; returns the process exit code."""
    health = health_aio.HealthServicer()
    for name in ("", SERVICE_NAME):
        await health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def on_serving(ok: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if ok
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", SERVICE_NAME):
            await health.set(name, status)

    mtls = config.tls_client_ca is not None
    problem = exposure_problem(
        config.listen,
        token=config.token,
        mtls=mtls,
        allow_unauthenticated=config.allow_unauthenticated,
    )
    if problem:
        print(f"kassay worker: {problem}", file=sys.stderr, flush=True)
        return 2
    interceptors: list[grpc.aio.ServerInterceptor] = [ErrorInterceptor()]
    if config.token:
        interceptors.insert(0, TokenInterceptor(config.token))
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", 64 * 2**20),
            ("grpc.max_send_message_length", 64 * 2**20),
            *keepalive.server_options(config.keepalive_s),
        ],
    )
    try:
        creds = server_credentials(config.tls_cert, config.tls_key, config.tls_client_ca)
        if creds is None:
            port = server.add_insecure_port(config.listen)
        else:
            port = server.add_secure_port(config.listen, creds)
    except OSError as exc:
        log.error("cannot read the TLS files: %s", exc)
        return 1
    except RuntimeError as exc:
        log.error("cannot listen on %s: %s", config.listen, exc)
        return 1
    worker_id = config.worker_id or _default_worker_id(port)
    sup = Supervisor(
        device=config.device,
        worker_id=worker_id,
        enable_test_impls=config.enable_test_impls,
        case_timeout_s=config.case_timeout_s,
        start_timeout_s=config.start_timeout_s,
        on_serving=on_serving,
        artifacts=(
            ArtifactCache(Path(config.artifact_dir), max_bytes=config.max_artifact_bytes)
            if config.artifact_dir
            else None
        ),
        sandbox_config=config.sandbox,
    )
    metrics = WorkerMetrics(restarts=lambda: sup.restarts, device=config.device)
    sup.on_runner_start = metrics.observe_runner_start
    stop_metrics: Any = None
    if config.metrics_listen:
        try:
            metrics_port, stop_metrics = metrics.serve(config.metrics_listen)
        except (OSError, ValueError) as exc:
            log.error("cannot serve metrics on %s: %s", config.metrics_listen, exc)
            await server.stop(grace=None)
            return 1
        print(
            f"kassay worker metrics on http://{config.metrics_listen.rsplit(':', 1)[0]}:"
            f"{metrics_port}/metrics",
            flush=True,
        )
    service = WorkerService(sup, config, metrics)
    worker_pb2_grpc.add_WorkerServicer_to_server(service, server)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        (
            SERVICE_NAME,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        server,
    )
    await server.start()
    host = config.listen.rsplit(":", 1)[0]
    guard = "mTLS" if mtls else "TLS" if creds is not None else "plaintext"
    guard += ", token required" if config.token else ", no token"
    print(
        f"kassay worker {worker_id} listening on {host}:{port} (device {config.device}; {guard})",
        flush=True,
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        # Not available off the main thread or on Windows: then Ctrl-C / kill end it abruptly.
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)

    t0 = time.monotonic()
    importer = asyncio.ensure_future(asyncio.to_thread(importlib.import_module, "kassay.ops"))
    starter = asyncio.ensure_future(sup.start())
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait({starter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if not starter.done():  # asked to stop while the executor was still starting
        starter.cancel()
    elif starter.exception() is not None:
        err = starter.exception()
        print(f"kassay worker: {err}", flush=True)
        await sup.close()
        await server.stop(grace=1)
        return 1 if isinstance(err, ExecutorStartError) else 2
    else:
        await importer
        print(
            f"kassay worker ready: {sup.info.get('device')} "
            f"({sup.info.get('device_name')}), executor pid {sup.snapshot()['pid']}, "
            f"started in {time.monotonic() - t0:.1f} s",
            flush=True,
        )
        if ready is not None:
            ready.set()
        await stopper

    print("kassay worker: shutting down (finishing the running case)", flush=True)
    service.draining = True
    await health.enter_graceful_shutdown()
    await sup.drain(timeout=config.shutdown_grace_s)
    await server.stop(grace=5.0)
    if stop_metrics is not None:
        stop_metrics()
    print("kassay worker: stopped", flush=True)
    return 0
