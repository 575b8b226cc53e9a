"""The dispatcher: sends queued input groups to the workers over gRPC and stores what comes back.

One task per worker address: the addresses KASSAY_WORKERS lists, and those its `dns:///name:port`
entries resolve to now (kassay.api.worker_discovery; resolved again every KASSAY_WORKER_RESOLVE_S:
a new address gets a link and a task, an address gone from the name is retired: it takes no new
group, its running groups finish or come back as they would from any worker, then its link goes). While the worker answers Describe it is `up`: the task
leases the oldest pending group the worker can run (one group at a time per worker device),
sends it in one `Run` call and stores each CaseResult as it streams in. A lease is a row in the
store renewed while the group runs; a group whose lease ran out (its API process died) is
requeued by any dispatcher's sweeper, which is how a restarted API resumes a job.

A worker lost mid-group (the stream breaks, or it sends nothing for `stall_s`) is marked down and
its group is requeued with only the cases that have no result yet; after `max_attempts` those
cases become `error: worker lost`. A worker that refuses a group (INVALID_ARGUMENT ...) fails
that group's cases with the worker's message, without retrying.

Groups that name artifacts (code a job brings) go only to workers whose Describe says they run
artifacts; before such a Run the worker is sent the artifacts it does not hold yet (ArtifactStatus,
then PutArtifact in chunks; the worker checks each against its sha256).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from kassay.api.metrics import ApiMetrics
from kassay.api.notify import JobNotifier
from kassay.api.schemas import WorkerInfo
from kassay.api.store import Claim, Store
from kassay.api.worker_discovery import Resolver, WorkerDirectory
from kassay.settings import Settings
from kassay.worker import keepalive

log = logging.getLogger("kassay.api.dispatcher")

# gRPC codes after which the group is retried elsewhere (the worker or the link failed);
# any other code means the worker refused the group itself.
_TRANSIENT = frozenset(
    {
        "UNAVAILABLE",
        "DEADLINE_EXCEEDED",
        "CANCELLED",
        "UNKNOWN",
        "INTERNAL",
        "ABORTED",
        "RESOURCE_EXHAUSTED",
    }
)

_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]
#: bytes per PutArtifact message (well under gRPC's default 4 MiB message limit)
ARTIFACT_CHUNK_BYTES = 1 << 20


class WorkerLost(Exception):
    """The worker stopped answering while running a group."""


@dataclass
class WorkerLink:
    """One worker address and what its last Describe said."""

    address: str
    found_by: str | None = None  # the DNS name this address came from (None: listed as is)
    retired: bool = False  # gone from its DNS name: takes no new group
    state: str = "unknown"  # unknown | up | down
    channel: Any = None
    stub: Any = None
    device: str | None = None
    device_name: str | None = None
    memory_bytes: int | None = None
    memory_free_bytes: int | None = None
    max_run_groups: int | None = None  # the worker's cap on groups per Run
    ops: dict[str, list[str]] = field(default_factory=dict)
    impl_kinds: dict[str, dict[str, str]] = field(default_factory=dict)  # op -> impl -> kind
    environment: dict[str, Any] | None = None
    sandbox: dict[str, Any] | None = None  # what its Describe says of the artifact sandbox
    last_seen: float | None = None
    last_error: str | None = None
    running: dict[str, tuple[str, str]] = field(default_factory=dict)  # run_id -> (job, group)
    calls: dict[str, Any] = field(default_factory=dict)  # run_id -> grpc call

    def impl_names(self) -> set[str]:
        return {name for impls in self.ops.values() for name in impls}

    @property
    def accepts_code(self) -> bool:
        return bool(self.sandbox and self.sandbox.get("artifacts"))

    def info(self) -> WorkerInfo:
        return WorkerInfo(
            address=self.address,
            state=self.state,
            device=self.device,
            device_name=self.device_name,
            memory_bytes=self.memory_bytes,
            ops=self.ops,
            impl_kinds=self.impl_kinds,
            running=[f"{j}/{g}" for j, g in self.running.values()],
            last_seen=(
                datetime.fromtimestamp(self.last_seen, timezone.utc) if self.last_seen else None
            ),
            last_error=self.last_error,
            environment=self.environment,
            sandbox=self.sandbox,
            found_by=self.found_by,
        )


class Dispatcher:
    """Feeds the store's queue to the workers; see the module docstring."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        *,
        notifier: JobNotifier,
        metrics: ApiMetrics,
        resolver: Resolver | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.notifier = notifier
        self.metrics = metrics
        self.owner = "api-" + secrets.token_hex(6)
        self.directory = WorkerDirectory(settings.workers, resolver)
        # the plain addresses from the start; those of DNS names once start() has resolved them
        self.links = [WorkerLink(a) for a in self.directory.static_addresses()]
        self._tasks: list[asyncio.Task[None]] = []
        self._link_tasks: dict[int, asyncio.Task[None]] = {}  # id(link) -> its worker loop
        self._credentials: Any = None
        self._wake = asyncio.Event()
        self._stopping = False
        self._cancelled_runs: set[str] = set()
        self._envs_seen: set[tuple[str, str, str, str]] = set()

    # ---------------------------------------------------------------- catalog (admission)

    def impls_for(self, op: str) -> set[str] | None:
        described = [link for link in self.links if link.ops]
        if not described:
            return None
        return {name for link in described for name in link.ops.get(op, [])}

    def all_described(self) -> bool:
        """Every configured worker has answered Describe at least once since start."""
        return bool(self.links) and all(link.ops for link in self.links)

    def accepts_code(self) -> bool | None:
        """Whether a described worker runs artifacts (None: no worker described yet)."""
        described = [link for link in self.links if link.ops]
        if not described:
            return None
        return any(link.accepts_code for link in described)

    def unrunnable_reason(
        self, op: str, impls: list[str], *, artifacts: bool = False
    ) -> str | None:
        """Why no worker can run a group of `op` with these impls (None when one can). Only
        meaningful once every worker has been described. A group with artifacts needs a worker
        that runs them (its impl names are checked by that worker, after loading them)."""
        if artifacts:
            if any(link.accepts_code and op in link.ops for link in self.links):
                return None
            return f"no worker runs artifacts (code jobs) for op {op!r}"
        if any(set(impls) <= set(link.ops.get(op, [])) for link in self.links):
            return None
        offered = sorted({name for link in self.links for name in link.ops.get(op, [])})
        missing = sorted(set(impls) - set(offered))
        if missing:
            return (
                f"no worker offers impl{'s' if len(missing) > 1 else ''} "
                f"{', '.join(repr(m) for m in missing)} for op {op!r}; "
                f"the workers offer: {', '.join(offered) or '(none)'}"
            )
        return f"no single worker offers all of {', '.join(impls)} for op {op!r}"

    def max_memory(self) -> int | None:
        """The most device memory a described worker has free for kassay (measured when its
        executor started, so it leaves out what other processes hold); its total where the
        worker reported no free figure."""
        sizes = [
            link.memory_free_bytes or link.memory_bytes
            for link in self.links
            if link.memory_free_bytes or link.memory_bytes
        ]
        return max(s for s in sizes if s) if sizes else None

    def workers_up(self) -> int:
        return sum(1 for link in self.links if link.state == "up" and not link.retired)

    def workers_info(self) -> list[WorkerInfo]:
        return [link.info() for link in self.links]

    # ------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        from kassay.api.worker_channel import channel_credentials

        self._credentials = channel_credentials(self.settings)  # TLS and the token (or None)
        for link in self.links:
            self._open(link)
        if self.directory.dynamic:
            await self.refresh_workers()
            self._tasks.append(asyncio.create_task(self._rediscover(), name="worker discovery"))
        self._tasks.append(asyncio.create_task(self._sweeper(), name="lease sweeper"))

    def _open(self, link: WorkerLink) -> None:
        """The link's channel and its worker loop."""
        from kassay.api.worker_channel import open_channel
        from kassay.v1 import worker_pb2_grpc

        link.channel = open_channel(
            link.address,
            self.settings,
            [*keepalive.client_options(self.settings.grpc_keepalive_s), *_CHANNEL_OPTIONS],
            self._credentials,
            server_name=link.found_by,
        )
        link.stub = worker_pb2_grpc.WorkerStub(link.channel)
        task = asyncio.create_task(self._worker_loop(link), name=f"worker {link.address}")
        key = id(link)
        self._link_tasks[key] = task

        def forget(_task: asyncio.Task[None]) -> None:
            self._link_tasks.pop(key, None)

        task.add_done_callback(forget)

    async def refresh_workers(self) -> None:
        """Resolve the DNS entries again: open links to new addresses, retire vanished ones."""
        found = await self.directory.resolve()
        active = {link.address: link for link in self.links if not link.retired}
        for address, name in found.items():
            if address not in active:
                link = WorkerLink(address, found_by=name)
                self.links.append(link)
                if not self._stopping:
                    self._open(link)
                log.info("worker %s found (%s)", address, name or "listed")
        for address, link in active.items():
            if address not in found:
                log.info("worker %s is gone from %s: retiring it", address, link.found_by)
                link.retired = True
                self._wake.set()  # its loop may sit idle waiting for work
        if found.keys() - active.keys() or active.keys() - found.keys():
            self.wake()

    async def _rediscover(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.settings.worker_resolve_s)
            try:
                await self.refresh_workers()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("worker discovery")

    async def _retire(self, link: WorkerLink) -> None:
        """A retired link whose runs are over: close its channel and forget it."""
        if link in self.links:
            self.links.remove(link)
        if link.channel is not None:
            with contextlib.suppress(Exception):
                await link.channel.close(grace=None)

    async def stop(self) -> None:
        """Stop dispatching. The groups running now go back to the queue (without counting an
        attempt); an API killed outright leaves leases that run out instead."""
        self._stopping = True
        running = [key for link in self.links for key in link.running.values()]
        tasks = [*self._tasks, *self._link_tasks.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        for job_id, group_id in running:  # hand them back now rather than at lease expiry
            with contextlib.suppress(Exception):
                await asyncio.to_thread(
                    self.store.release_group, job_id, group_id, owner=self.owner
                )
        for link in self.links:
            if link.channel is not None:
                await link.channel.close(grace=None)

    def wake(self) -> None:
        """A job was stored: idle worker tasks look at the queue now."""
        self._wake.set()

    async def _idle(self, timeout: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)
        self._wake.clear()

    # ------------------------------------------------------------------------- workers

    async def describe(self, link: WorkerLink) -> bool:
        """Refresh what the worker offers; False (and the link down) when it does not answer."""
        from kassay.v1 import worker_pb2 as pb

        try:
            resp = await link.stub.Describe(pb.DescribeRequest(), timeout=5.0)
        except Exception as exc:
            if link.state != "down":
                log.warning("worker %s is down: %s", link.address, _rpc_text(exc))
            link.state = "down"
            link.last_error = _rpc_text(exc)
            return False
        link.device = resp.device
        link.device_name = resp.device_name
        link.memory_bytes = int(resp.memory_total_bytes) or None
        link.memory_free_bytes = int(resp.memory_free_bytes) or None
        link.max_run_groups = int(resp.max_run_groups) or None
        mutants = self.settings.enable_mutants
        # the self-test's corpora (mutants, correct alternatives) only where the API offers them
        offered = [
            (op.name, i)
            for op in resp.ops
            for i in op.impls
            if mutants or i.kind not in ("mutant", "alternative")
        ]
        link.ops = {op.name: [] for op in resp.ops}
        link.impl_kinds = {}
        for op_name, i in offered:
            link.ops[op_name].append(i.name)
            link.impl_kinds.setdefault(op_name, {})[i.name] = i.kind
        if resp.HasField("sandbox"):
            from kassay.wire import read

            link.sandbox = read(resp.sandbox)
        else:
            link.sandbox = None
        if resp.HasField("environment"):
            from kassay.wire import environment_from_proto

            with contextlib.suppress(Exception):
                link.environment = environment_from_proto(resp.environment).model_dump(mode="json")
        if link.state != "up":
            log.info("worker %s is up (%s)", link.address, resp.device_name or resp.device)
        link.state = "up"
        link.last_seen = time.time()
        link.last_error = None
        return True

    async def _worker_loop(self, link: WorkerLink) -> None:
        """Claim groups for one worker and run them, keeping up to `dispatch_depth` runs open
        at once: the worker executes one group at a time and queues the next, so claiming,
        storing and settling overlap with execution instead of adding to every group."""
        poll = self.settings.worker_poll_s
        depth = self.settings.dispatch_depth
        last_describe = 0.0
        inflight: set[asyncio.Task[None]] = set()
        try:
            while not self._stopping:
                if link.retired:
                    # gone from its DNS name: no new group; what it runs finishes (or comes
                    # back, if the worker went with its record) as it would anywhere
                    if inflight:
                        await asyncio.wait(inflight)
                    await self._retire(link)
                    return
                try:
                    if inflight and (len(inflight) >= depth or link.state != "up"):
                        await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
                        continue
                    if link.state != "up" or time.monotonic() - last_describe > 5 * poll:
                        last_describe = time.monotonic()
                        if not await self.describe(link):
                            await asyncio.sleep(poll)
                            continue
                    claims = await asyncio.to_thread(
                        self.store.claim_groups,
                        min(self.settings.dispatch_batch, link.max_run_groups or 64),
                        worker=link.address,
                        owner=self.owner,
                        lease_s=self.settings.lease_s,
                        impls=link.impl_names() or None,
                        code=link.accepts_code,
                        share=self.workers_up(),
                    )
                    if not claims:
                        await self._idle(poll)
                        continue
                    if link.retired:  # retired while claiming: hand the claims straight back
                        for c in claims:
                            await asyncio.to_thread(
                                self.store.release_group,
                                c.job_id,
                                c.group.group_id,
                                owner=self.owner,
                            )
                        self.wake()
                        continue
                    task = asyncio.create_task(self._run(link, claims))
                    inflight.add(task)
                    task.add_done_callback(inflight.discard)
                    task.add_done_callback(_log_failure)
                except asyncio.CancelledError:
                    raise
                except Exception:  # keep the loop alive whatever one group did
                    log.exception("dispatch loop of %s", link.address)
                    await asyncio.sleep(poll)
        finally:
            for task in list(inflight):
                task.cancel()
            if inflight:
                await asyncio.gather(*inflight, return_exceptions=True)

    # ---------------------------------------------------------------------------- runs

    async def _run(self, link: WorkerLink, claims: list[Claim]) -> None:
        """Run some groups of one job in one Run call; each group is settled as soon as the
        worker reports it done, the rest by how the stream ended."""
        from kassay.v1 import worker_pb2 as pb
        from kassay.wire import group_to_proto

        job_id = claims[0].job_id
        first = claims[0]
        # The random tail keeps run ids unguessable from what reads show (job and group ids).
        run_id = (
            f"{job_id}/{first.group.group_id}/{first.attempt}+{len(claims)}/{secrets.token_hex(8)}"
        )
        self.metrics.groups_dispatched.inc(len(claims))
        log.info(
            "%d group(s) of %s -> %s (first %s, attempt %d)",
            len(claims),
            job_id,
            link.address,
            first.group.group_id,
            first.attempt,
        )
        try:
            request = pb.RunRequest(
                run_id=run_id,
                groups=[group_to_proto(c.group) for c in claims],
                include_mutants=self.settings.enable_mutants,
            )
        except Exception as exc:  # admission should have refused it; never leave it leased
            log.exception("group(s) of %s cannot be sent to a worker", job_id)
            for c in claims:
                await self._settle(
                    job_id, c.group.group_id, "refused", f"cannot be sent to a worker: {exc}"
                )
            return
        digests = list(dict.fromkeys(d for c in claims for d in c.group.artifacts))
        if digests:
            try:
                await self._send_artifacts(link, digests)
            except Exception as exc:
                code = _rpc_code(exc)
                why = f"could not send the artifacts to {link.address}: {_rpc_text(exc)}"
                log.warning("%s", why)
                settled = "lost" if code in _TRANSIENT or code is None else "refused"
                for c in claims:
                    await self._settle(job_id, c.group.group_id, settled, why)
                return
        call = link.stub.Run(request)
        open_groups = {c.group.group_id for c in claims}
        for gid in open_groups:
            link.running[f"{run_id}|{gid}"] = (job_id, gid)
        link.calls[run_id] = call
        outcome: str = "lost"
        reason = ""
        try:
            while True:
                try:
                    event = await asyncio.wait_for(call.read(), self.settings.stall_s)
                except asyncio.TimeoutError:
                    call.cancel()
                    raise WorkerLost(
                        f"no word from the worker for {self.settings.stall_s:g} s"
                    ) from None
                if event is _eof():
                    outcome = "done"
                    break
                link.last_seen = time.time()
                which = event.WhichOneof("event")
                if which == "result":
                    await self._store_result(job_id, event.result)
                elif which == "done" and event.done.group_id in open_groups:
                    gid = event.done.group_id
                    open_groups.discard(gid)
                    link.running.pop(f"{run_id}|{gid}", None)
                    done_outcome = "handed_back" if event.done.not_run else "done"
                    await self._settle(job_id, gid, done_outcome, event.done.reason)
        except asyncio.CancelledError:
            if run_id not in self._cancelled_runs:
                raise
            outcome = "cancelled"
        except WorkerLost as exc:
            reason = str(exc)
            link.state = "down"
            link.last_error = reason
        except Exception as exc:
            code = _rpc_code(exc)
            reason = _rpc_text(exc)
            if code in _TRANSIENT or code is None:
                state = await asyncio.to_thread(
                    self.store.group_state, job_id, first.group.group_id
                )
                if run_id in self._cancelled_runs or state == "cancelled":
                    outcome = "cancelled"
                else:
                    link.state = "down"
                    link.last_error = reason
            else:
                outcome = "refused"
        finally:
            for c in claims:
                link.running.pop(f"{run_id}|{c.group.group_id}", None)
            link.calls.pop(run_id, None)
            self._cancelled_runs.discard(run_id)
        for gid in sorted(open_groups):  # groups the stream ended without reporting done
            await self._settle(job_id, gid, outcome, reason)

    async def _send_artifacts(self, link: WorkerLink, digests: list[str]) -> None:
        """Make sure the worker holds these artifacts: send those it lacks, in chunks."""
        from kassay.v1 import worker_pb2 as pb

        status = await link.stub.ArtifactStatus(
            pb.ArtifactStatusRequest(digests=digests), timeout=30.0
        )
        for digest in status.missing:
            record = await asyncio.to_thread(self.store.artifacts.require, digest)
            data = await asyncio.to_thread(self.store.artifacts.data, digest)

            def chunks(data: bytes = data, record: Any = record) -> Any:
                step = ARTIFACT_CHUNK_BYTES
                for i in range(0, max(len(data), 1), step):
                    head = {"digest": record.digest, "filename": record.filename} if i == 0 else {}
                    yield pb.ArtifactChunk(size=len(data), data=data[i : i + step], **head)

            info = await link.stub.PutArtifact(chunks(), timeout=300.0)
            log.info("artifact %s (%d bytes) -> %s", digest[:12], info.size, link.address)

    async def _store_result(self, job_id: str, msg: Any) -> None:
        from kassay.wire import result_from_proto

        result = result_from_proto(msg)
        seq = await asyncio.to_thread(self.store.record_result, job_id, result)
        if seq is None:
            return
        self.metrics.case_results.labels(result.status).inc()
        self.metrics.case_seconds.labels(result.op).observe(result.duration_s)
        env = result.environment
        if env is not None:
            # One write per (job, worker device), not per case: the store deduplicates too,
            # but only after a read-modify-write transaction.
            key = (job_id, env.hostname, env.device, env.device_name)
            if key not in self._envs_seen:
                await asyncio.to_thread(
                    self.store.add_environment, job_id, env.model_dump(mode="json")
                )
                self._envs_seen.add(key)
                if len(self._envs_seen) > 10_000:
                    self._envs_seen.clear()
        self.notifier.notify(job_id)

    async def _settle(self, job_id: str, group_id: str, outcome: str, reason: str) -> None:
        """Close a run: finish the group, requeue it, or fail what is left of it."""
        max_attempts = self.settings.max_attempts
        if outcome == "done":
            await asyncio.to_thread(self.store.finish_group, job_id, group_id)
        elif outcome in ("lost", "handed_back"):
            why = reason or "the worker stopped answering"
            log.warning("group %s of %s: %s; requeueing", group_id, job_id, why)
            if outcome == "handed_back":
                max_attempts += 1  # a worker shutting down is not the group's fault
            requeued = await asyncio.to_thread(
                self.store.requeue_group, job_id, group_id, reason=why, max_attempts=max_attempts
            )
            if requeued:
                self.metrics.groups_requeued.inc()
                self.wake()
        elif outcome == "refused":
            await asyncio.to_thread(
                self.store.finish_group,
                job_id,
                group_id,
                reason=f"the worker refused the group: {reason}",
            )
        self.notifier.notify(job_id)

    async def cancel_runs(self, keys: list[tuple[str, str]]) -> None:
        """Stop the runs of cancelled groups: tell their workers, then drop the streams."""
        from kassay.v1 import worker_pb2 as pb

        wanted = set(keys)
        for link in self.links:
            runs = {slot.split("|", 1)[0] for slot, key in link.running.items() if key in wanted}
            for run_id in runs:
                with contextlib.suppress(Exception):
                    await link.stub.Cancel(pb.CancelRequest(run_id=run_id), timeout=5.0)
                call = link.calls.get(run_id)
                if call is not None:
                    self._cancelled_runs.add(run_id)
                    call.cancel()

    async def _sweeper(self) -> None:
        """Renew the leases of the groups this API runs; requeue groups whose lease ran out."""
        period = max(0.5, min(self.settings.lease_s / 4, 5.0))
        while not self._stopping:
            try:
                keys = [key for link in self.links for key in link.running.values()]
                if keys:
                    await asyncio.to_thread(
                        self.store.renew_leases,
                        keys,
                        owner=self.owner,
                        lease_s=self.settings.lease_s,
                    )
                requeued = await asyncio.to_thread(
                    self.store.requeue_expired, max_attempts=self.settings.max_attempts
                )
                await self._fail_unrunnable()
                await self._expire_overdue()
                for job_id, _ in requeued:
                    self.notifier.notify(job_id)
                if requeued:
                    self.metrics.groups_requeued.inc(len(requeued))
                    self.wake()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("lease sweeper")
            await asyncio.sleep(period)

    async def _expire_overdue(self) -> None:
        """End the jobs past their time cap and stop their running groups."""
        overdue = await asyncio.to_thread(
            self.store.overdue_jobs, now=time.time(), max_job_s=self.settings.max_job_s
        )
        for job_id, cap in overdue:
            reason = f"the job ran past its time cap of {cap:g} s"
            log.warning("job %s: %s; ending it", job_id, reason)
            _, running = await asyncio.to_thread(self.store.expire_job, job_id, reason=reason)
            await self.cancel_runs(running)
            self.notifier.notify(job_id)

    async def _fail_unrunnable(self) -> None:
        """Fail the pending groups that no described worker can run. Jobs admitted before any
        worker answered Describe were accepted on trust (the API keeps no impl registry); once
        every configured worker has been described, a group none of them offers would wait
        forever, so its cases end as errors naming what the workers do offer."""
        if not self.all_described():
            return
        pending = await asyncio.to_thread(self.store.pending_groups)
        for job_id, group in pending:
            reason = self.unrunnable_reason(
                group.op, [*group.impls, group.baseline], artifacts=bool(group.artifacts)
            )
            if reason is None:
                continue
            log.warning("group %s of %s cannot run: %s", group.group_id, job_id, reason)
            await asyncio.to_thread(self.store.finish_group, job_id, group.group_id, reason=reason)
            self.notifier.notify(job_id)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("group run failed", exc_info=task.exception())


def _eof() -> Any:
    import grpc

    return grpc.aio.EOF


def _rpc_code(exc: BaseException) -> str | None:
    code = getattr(exc, "code", None)
    if callable(code):
        with contextlib.suppress(Exception):
            return str(code().name)
    return None


def _rpc_text(exc: BaseException) -> str:
    details = getattr(exc, "details", None)
    code = _rpc_code(exc)
    if callable(details) and code:
        with contextlib.suppress(Exception):
            return f"{code}: {details()}"
    return f"{type(exc).__name__}: {exc}"
