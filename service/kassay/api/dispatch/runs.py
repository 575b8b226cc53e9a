"""One Run call: groups sent to a worker, their results stored as they stream in, each group
settled (finished, requeued, failed) by how its run ended (kassay.api.dispatch)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from kassay.api.dispatch.links import WorkerLink, WorkerLost, rpc_code, rpc_text
from kassay.api.metrics import ApiMetrics
from kassay.api.notify import JobNotifier
from kassay.api.store import Claim, Store
from kassay.settings import Settings

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

#: bytes per PutArtifact message (well under gRPC's default 4 MiB message limit)
ARTIFACT_CHUNK_BYTES = 1 << 20


class Runs:
    """The runs of one dispatcher (`owner`); `wake` tells its idle worker loops to look at the
    queue again (a group was requeued)."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        *,
        notifier: JobNotifier,
        metrics: ApiMetrics,
        owner: str,
        wake: Callable[[], None],
    ) -> None:
        self.store = store
        self.settings = settings
        self.notifier = notifier
        self.metrics = metrics
        self.owner = owner
        self.wake = wake
        self._cancelled_runs: set[str] = set()
        self._envs_seen: set[tuple[str, str, str, str]] = set()

    async def run(self, link: WorkerLink, claims: list[Claim]) -> None:
        """Run some groups of one job in one Run call; each group is settled as soon as the
        worker reports it done, the rest by how the stream ended."""
        from kassay.contract.v1 import worker_pb2 as pb
        from kassay.contract.wire import group_to_proto

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
        # a code job's runs share the worker's impl runner of its artifacts; with nothing of
        # the job left to dispatch when its last group was claimed, the runner ends with this
        # run instead of waiting for more
        brings_code = any(c.group.artifacts for c in claims)
        last = brings_code and claims[-1].job_pending_after == 0
        try:
            request = pb.RunRequest(
                run_id=run_id,
                groups=[group_to_proto(c.group) for c in claims],
                include_mutants=self.settings.enable_mutants,
                job_id=job_id,
                job_last=last,
            )
        except Exception as exc:  # admission should have refused it; never leave it leased
            log.exception("group(s) of %s cannot be sent to a worker", job_id)
            for c in claims:
                await self.settle(
                    job_id, c.group.group_id, "refused", f"cannot be sent to a worker: {exc}"
                )
            return
        digests = list(dict.fromkeys(d for c in claims for d in c.group.artifacts))
        if digests:
            try:
                await self.send_artifacts(link, digests)
            except Exception as exc:
                code = rpc_code(exc)
                why = f"could not send the artifacts to {link.address}: {rpc_text(exc)}"
                log.warning("%s", why)
                settled = "lost" if code in _TRANSIENT or code is None else "refused"
                for c in claims:
                    await self.settle(job_id, c.group.group_id, settled, why)
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
                    await self.store_result(job_id, event.result)
                elif which == "done" and event.done.group_id in open_groups:
                    gid = event.done.group_id
                    open_groups.discard(gid)
                    link.running.pop(f"{run_id}|{gid}", None)
                    done_outcome = "handed_back" if event.done.not_run else "done"
                    await self.settle(job_id, gid, done_outcome, event.done.reason)
        except asyncio.CancelledError:
            if run_id not in self._cancelled_runs:
                raise
            outcome = "cancelled"
        except WorkerLost as exc:
            reason = str(exc)
            link.state = "down"
            link.last_error = reason
        except Exception as exc:
            code = rpc_code(exc)
            reason = rpc_text(exc)
            if code in _TRANSIENT or code is None:
                state = await asyncio.to_thread(
                    self.store.queue.group_state, job_id, first.group.group_id
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
            await self.settle(job_id, gid, outcome, reason)

    async def send_artifacts(self, link: WorkerLink, digests: list[str]) -> None:
        """Make sure the worker holds these artifacts: send those it lacks, in chunks."""
        from kassay.contract.v1 import worker_pb2 as pb

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

    async def store_result(self, job_id: str, msg: Any) -> None:
        from kassay.contract.wire import result_from_proto

        result = result_from_proto(msg)
        seq = await asyncio.to_thread(self.store.results.record_result, job_id, result)
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
                    self.store.results.add_environment, job_id, env.model_dump(mode="json")
                )
                self._envs_seen.add(key)
                if len(self._envs_seen) > 10_000:
                    self._envs_seen.clear()
        self.notifier.notify(job_id)

    async def settle(self, job_id: str, group_id: str, outcome: str, reason: str) -> None:
        """Close a run: finish the group, requeue it, or fail what is left of it."""
        max_attempts = self.settings.max_attempts
        if outcome == "done":
            await asyncio.to_thread(self.store.queue.finish_group, job_id, group_id)
        elif outcome in ("lost", "handed_back"):
            why = reason or "the worker stopped answering"
            log.warning("group %s of %s: %s; requeueing", group_id, job_id, why)
            if outcome == "handed_back":
                max_attempts += 1  # a worker shutting down is not the group's fault
            requeued = await asyncio.to_thread(
                self.store.queue.requeue_group,
                job_id,
                group_id,
                reason=why,
                max_attempts=max_attempts,
            )
            if requeued:
                self.metrics.groups_requeued.inc()
                self.wake()
        elif outcome == "refused":
            await asyncio.to_thread(
                self.store.queue.finish_group,
                job_id,
                group_id,
                reason=f"the worker refused the group: {reason}",
            )
        self.notifier.notify(job_id)

    async def cancel(self, links: list[WorkerLink], keys: list[tuple[str, str]]) -> None:
        """Stop the runs of cancelled groups: tell their workers, then drop the streams."""
        from kassay.contract.v1 import worker_pb2 as pb

        wanted = set(keys)
        for link in links:
            runs = {slot.split("|", 1)[0] for slot, key in link.running.items() if key in wanted}
            for run_id in runs:
                with contextlib.suppress(Exception):
                    await link.stub.Cancel(pb.CancelRequest(run_id=run_id), timeout=5.0)
                call = link.calls.get(run_id)
                if call is not None:
                    self._cancelled_runs.add(run_id)
                    call.cancel()


def _eof() -> Any:
    import grpc

    return grpc.aio.EOF
