"""The dispatcher's periodic work (kassay.api.dispatch): renew the leases of the groups this API
runs, requeue groups whose lease ran out (an API that died), fail groups no worker can run, end
jobs past their time cap."""

from __future__ import annotations

import asyncio
import logging
import time

from kassay.api.dispatch.links import Workers
from kassay.api.dispatch.runs import Runs
from kassay.api.metrics import ApiMetrics
from kassay.api.notify import JobNotifier
from kassay.api.store import Store
from kassay.settings import Settings

log = logging.getLogger("kassay.api.dispatcher")


class Sweeper:
    def __init__(
        self,
        store: Store,
        settings: Settings,
        *,
        workers: Workers,
        runs: Runs,
        notifier: JobNotifier,
        metrics: ApiMetrics,
        owner: str,
    ) -> None:
        self.store = store
        self.settings = settings
        self.workers = workers
        self.runs = runs
        self.notifier = notifier
        self.metrics = metrics
        self.owner = owner

    async def loop(self) -> None:
        """Renew the leases of the groups this API runs; requeue groups whose lease ran out."""
        period = max(0.5, min(self.settings.lease_s / 4, 5.0))
        while True:
            try:
                keys = self.workers.running()
                if keys:
                    await asyncio.to_thread(
                        self.store.queue.renew_leases,
                        keys,
                        owner=self.owner,
                        lease_s=self.settings.lease_s,
                    )
                requeued = await asyncio.to_thread(
                    self.store.queue.requeue_expired, max_attempts=self.settings.max_attempts
                )
                await self.fail_unrunnable()
                await self.expire_overdue()
                for job_id, _ in requeued:
                    self.notifier.notify(job_id)
                if requeued:
                    self.metrics.groups_requeued.inc(len(requeued))
                    self.runs.wake()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("lease sweeper")
            await asyncio.sleep(period)

    async def expire_overdue(self) -> None:
        """End the jobs past their time cap and stop their running groups."""
        overdue = await asyncio.to_thread(
            self.store.jobs.overdue_jobs, now=time.time(), max_job_s=self.settings.max_job_s
        )
        for job_id, cap in overdue:
            reason = f"the job ran past its time cap of {cap:g} s"
            log.warning("job %s: %s; ending it", job_id, reason)
            _, running = await asyncio.to_thread(self.store.queue.expire_job, job_id, reason=reason)
            await self.runs.cancel(self.workers.links, running)
            self.notifier.notify(job_id)

    async def fail_unrunnable(self) -> None:
        """Fail the pending groups that no described worker can run. Jobs admitted before any
        worker answered Describe were accepted on trust (the API keeps no impl registry); once
        every configured worker has been described, a group none of them offers would wait
        forever, so its cases end as errors naming what the workers do offer."""
        if not self.workers.all_described():
            return
        pending = await asyncio.to_thread(self.store.queue.pending_groups)
        for job_id, group in pending:
            reason = self.workers.unrunnable_reason(
                group.op, [*group.impls, group.baseline], artifacts=bool(group.artifacts)
            )
            if reason is None:
                continue
            log.warning("group %s of %s cannot run: %s", group.group_id, job_id, reason)
            await asyncio.to_thread(
                self.store.queue.finish_group, job_id, group.group_id, reason=reason
            )
            self.notifier.notify(job_id)
