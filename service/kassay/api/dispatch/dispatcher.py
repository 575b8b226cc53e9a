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

The package in layers: `links` (a worker's link, its Describe, the catalog admission reads),
`runs` (one Run call and how each group of it is settled), `sweeper` (leases, expired and
unrunnable groups, overdue jobs), and here the lifecycle and one loop per worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import Any

from kassay.api.dispatch.links import WorkerLink, Workers, describe
from kassay.api.dispatch.runs import Runs
from kassay.api.dispatch.sweeper import Sweeper
from kassay.api.metrics import ApiMetrics
from kassay.api.notify import JobNotifier
from kassay.api.store import Store
from kassay.api.worker_discovery import Resolver, WorkerDirectory
from kassay.contract import keepalive
from kassay.settings import Settings

log = logging.getLogger("kassay.api.dispatcher")

_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


class Dispatcher:
    """Feeds the store's queue to the workers; see the module docstring. `workers` is the
    catalog admission reads (kassay.api.submit.WorkerCatalog)."""

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
        self.workers = Workers([WorkerLink(a) for a in self.directory.static_addresses()])
        self.runs = Runs(
            store, settings, notifier=notifier, metrics=metrics, owner=self.owner, wake=self.wake
        )
        self.sweeper = Sweeper(
            store,
            settings,
            workers=self.workers,
            runs=self.runs,
            notifier=notifier,
            metrics=metrics,
            owner=self.owner,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._link_tasks: dict[int, asyncio.Task[None]] = {}  # id(link) -> its worker loop
        self._credentials: Any = None
        self._wake = asyncio.Event()
        self._stopping = False

    async def cancel_runs(self, keys: list[tuple[str, str]]) -> None:
        """Stop the runs of cancelled groups: tell their workers, then drop the streams."""
        await self.runs.cancel(self.workers.links, keys)

    # ------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        from kassay.api.worker_channel import channel_credentials

        self._credentials = channel_credentials(self.settings)  # TLS and the token (or None)
        for link in self.workers.links:
            self._open(link)
        if self.directory.dynamic:
            await self.refresh_workers()
            self._tasks.append(asyncio.create_task(self._rediscover(), name="worker discovery"))
        self._tasks.append(asyncio.create_task(self.sweeper.loop(), name="lease sweeper"))

    def _open(self, link: WorkerLink) -> None:
        """The link's channel and its worker loop."""
        from kassay.api.worker_channel import open_channel
        from kassay.contract.v1 import worker_pb2_grpc

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
        active = {link.address: link for link in self.workers.links if not link.retired}
        for address, name in found.items():
            if address not in active:
                link = WorkerLink(address, found_by=name)
                self.workers.links.append(link)
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
        if link in self.workers.links:
            self.workers.links.remove(link)
        if link.channel is not None:
            with contextlib.suppress(Exception):
                await link.channel.close(grace=None)

    async def stop(self) -> None:
        """Stop dispatching. The groups running now go back to the queue (without counting an
        attempt); an API killed outright leaves leases that run out instead."""
        self._stopping = True
        running = self.workers.running()
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
                    self.store.queue.release_group, job_id, group_id, owner=self.owner
                )
        for link in self.workers.links:
            if link.channel is not None:
                await link.channel.close(grace=None)

    def wake(self) -> None:
        """A job was stored: idle worker tasks look at the queue now."""
        self._wake.set()

    async def _idle(self, timeout: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)
        self._wake.clear()

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
                        if not await describe(link, enable_mutants=self.settings.enable_mutants):
                            await asyncio.sleep(poll)
                            continue
                    claims = await asyncio.to_thread(
                        self.store.queue.claim_groups,
                        min(self.settings.dispatch_batch, link.max_run_groups or 64),
                        worker=link.address,
                        owner=self.owner,
                        lease_s=self.settings.lease_s,
                        impls=link.impl_names() or None,
                        code=link.accepts_code,
                        share=self.workers.up(),
                    )
                    if not claims:
                        await self._idle(poll)
                        continue
                    if link.retired:  # retired while claiming: hand the claims straight back
                        for c in claims:
                            await asyncio.to_thread(
                                self.store.queue.release_group,
                                c.job_id,
                                c.group.group_id,
                                owner=self.owner,
                            )
                        self.wake()
                        continue
                    task = asyncio.create_task(self.runs.run(link, claims))
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


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("group run failed", exc_info=task.exception())
