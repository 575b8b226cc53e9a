"""What the supervisor lends the impl runner of a job that brings code: one lease per (job,
artifact set) on this worker's device.

A group that names artifacts runs on the device's shared executor like any other group; the
artifacts' impls run in one sandboxed impl runner that the executor starts for the job's first
such group and keeps for its later ones (kassay.worker.executor.remote_impls): Python, torch, the CUDA
context and the artifacts' imports are paid once per job, not once per group. The API sends a
job's groups in several runs (a few groups each, KASSAY_DISPATCH_BATCH); the runs of one job
(RunRequest.job_id) share its lease. The lease holds what that runner is given: the artifacts
installed from the cache, a working directory of its own (also its HOME and TMPDIR; its tensor
exchange folder in /dev/shm where there is one), a user of its own (as root) and the sandbox's
config. It ends with the job: after the group of the job's last run (RunRequest.job_last) when
no other run of the job is on the worker (a run counts from its arrival, before its groups
start: the job's runs come on separate calls and the last may arrive first); else, once none is, after RUNNER_LINGER_S without a
new run of the job (the job's rest went to another worker, or was cancelled). The executor ends
the runner, the supervisor removes both folders and frees the user. Never shared between jobs:
the trust boundary is the job.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from kassay.worker.runner.sandbox import exchange_dir

if TYPE_CHECKING:
    from kassay.worker.runner.sandbox import Capabilities, SandboxConfig
    from kassay.worker.server.artifact_cache import ArtifactCache


class GroupRefused(Exception):
    """The group cannot run at all: its cases get `status` with this message."""

    def __init__(self, message: str, *, status: str = "error") -> None:
        super().__init__(message)
        self.status = status


class LeaseHost(Protocol):
    """What leases need of the supervisor: the artifact cache, the sandbox's settings and the
    users its running sandboxes hold."""

    artifacts: ArtifactCache | None
    sandbox_config: SandboxConfig
    sandbox_caps: Capabilities | None
    sandbox_uids: set[int]


#: how long a job's runner waits for the job's next run once none of its runs is on the worker
#: and its last was not said to be the job's last (the API sends the next run before the one
#: in flight ends, dispatch depth 2: this covers a slow round trip, not an idle job)
RUNNER_LINGER_S = 30.0


class JobRun(Protocol):
    """What leases need of a run (kassay.worker.server.active_group.RunHandle)."""

    run_id: str
    job_id: str
    job_last: bool


@dataclass
class RunnerLease:
    key: str
    job_id: str
    #: the runs of the job on this worker that use it
    runs: set[str]
    #: digest -> the artifact's unpacked folder
    paths: dict[str, str]
    workdir: str
    exchange: str
    offset: int
    config: SandboxConfig

    def message(self) -> dict[str, Any]:
        """The `runner` field of the executor's run message (kassay.worker.executor.main)."""
        return {"key": self.key, "artifacts": self.paths, "sandbox": self.config.to_json()}


class RunnerLeases:
    """The leases of the jobs on one supervisor."""

    def __init__(self, host: LeaseHost) -> None:
        self.host = host
        self.leases: dict[str, RunnerLease] = {}
        #: job id -> the ids of its runs on this worker, from their arrival (`enter`) to their
        #: end: a run that arrived holds its job's runners before any of its groups started
        self.job_runs: dict[str, set[str]] = {}
        #: the jobs one of whose runs here was said to be the job's last
        self.last_jobs: set[str] = set()

    @staticmethod
    def key(job_id: str, digests: list[str]) -> str:
        return f"{job_id}/{'+'.join(sorted(digests))}"

    def enter(self, run: JobRun) -> None:
        """`run` arrived on the worker. The API sends a job's runs back to back on separate
        calls, so the job's last run can arrive (and finish) before an earlier one starts:
        until every run of the job here is over, its runners stay."""
        self.job_runs.setdefault(run.job_id, set()).add(run.run_id)
        if run.job_last:
            self.last_jobs.add(run.job_id)

    async def lease(self, run: JobRun, digests: list[str]) -> RunnerLease:
        """The job's lease for these artifacts, made on the first use by any run of the job
        (GroupRefused when an artifact cannot be installed); `run` holds it until it ends."""
        key = self.key(run.job_id, digests)
        if key not in self.leases:
            paths = await self._install(digests)
            if key not in self.leases:  # not made meanwhile
                self.leases[key] = self._make(key, run.job_id, paths)
        lease = self.leases[key]
        lease.runs.add(run.run_id)
        if run.job_last:
            self.last_jobs.add(run.job_id)
        return lease

    def _make(self, key: str, job_id: str, paths: dict[str, str]) -> RunnerLease:
        offset = self._free_offset()
        uid = self.host.sandbox_config.uid + offset
        workdir, xchg = self._fresh_workdir(uid)
        caps = self.host.sandbox_caps
        config = replace(
            self.host.sandbox_config,
            workdir=workdir,
            # the tensor exchange (kassay.worker.exchange.transports), where it is not the workdir
            writable=[x for x in [xchg] if x != workdir],
            uid=uid,
            # only what the host was seen to allow (a container may refuse namespaces)
            namespaces=bool(caps and caps.namespaces) and self.host.sandbox_config.namespaces,
            landlock=bool(caps and caps.landlock_abi) and self.host.sandbox_config.landlock,
        )
        return RunnerLease(key, job_id, set(), paths, workdir, xchg, offset, config)

    def _others(self, run: JobRun) -> set[str]:
        """The other runs of `run`'s job on the worker: arrived and not over, or holding one of
        its leases."""
        held = [le.runs for le in self.leases.values() if le.job_id == run.job_id]
        return set(self.job_runs.get(run.job_id, set())).union(*held) - {run.run_id}

    def _alone(self, run: JobRun) -> bool:
        return not self._others(run)

    def _job_ends(self, run: JobRun) -> bool:
        return self._alone(run) and (run.job_last or run.job_id in self.last_jobs)

    def ending_with(self, run: JobRun) -> list[str]:
        """The leases that end when `run` does: no other run of the job is on the worker, and
        it or one before it was the job's last."""
        if not self._job_ends(run):
            return []
        return [k for k, le in self.leases.items() if le.job_id == run.job_id]

    def release_run(self, run: JobRun) -> tuple[list[str], list[str]]:
        """`run` is over: (the keys of the job's leases that end now, removed; the keys that
        wait for the job's next run, `end_idle` after RUNNER_LINGER_S). Both empty while
        another run of the job is on the worker."""
        ends = self._job_ends(run)
        if self._others(run):
            self.job_runs.get(run.job_id, set()).discard(run.run_id)
            for lease in self.leases.values():
                lease.runs.discard(run.run_id)
            return [], []
        for lease in self.leases.values():
            lease.runs.discard(run.run_id)
        self.job_runs.pop(run.job_id, None)
        self.last_jobs.discard(run.job_id)
        keys = [k for k, le in self.leases.items() if le.job_id == run.job_id]
        if not ends:
            return [], keys
        for key in keys:
            self._remove(key)
        return keys, []

    def end_idle(self, key: str) -> bool:
        """End the lease if still no run holds it (True: the executor must end its runner)."""
        lease = self.leases.get(key)
        if lease is None or lease.runs or self.job_runs.get(lease.job_id):
            return False
        self._remove(key)
        return True

    def release_all(self) -> list[str]:
        self.job_runs.clear()
        self.last_jobs.clear()
        keys = list(self.leases)
        for key in keys:
            self._remove(key)
        return keys

    def _remove(self, key: str) -> None:
        lease = self.leases.pop(key)
        shutil.rmtree(lease.workdir, ignore_errors=True)
        shutil.rmtree(lease.exchange, ignore_errors=True)
        self.host.sandbox_uids.discard(lease.offset)

    async def _install(self, digests: list[str]) -> dict[str, str]:
        cache = self.host.artifacts
        if cache is None:
            raise GroupRefused("this worker does not run artifacts")
        from kassay.worker.server.artifact_cache import ArtifactRefused

        paths = {}
        for digest in digests:
            try:
                paths[digest] = str(await asyncio.to_thread(cache.install, digest))
            except ArtifactRefused as exc:
                raise GroupRefused(exc.message) from None
        return paths

    def _free_offset(self) -> int:
        """The lowest offset from the sandbox's base uid that no running sandbox of this worker
        holds: RLIMIT_NPROC counts per user across the host, so each runner gets its own."""
        taken = self.host.sandbox_uids
        offset = next(i for i in range(len(taken) + 1) if i not in taken)
        taken.add(offset)
        return offset

    def _fresh_workdir(self, uid: int) -> tuple[str, str]:
        path = tempfile.mkdtemp(prefix="kassay-sandbox-")
        xchg = exchange_dir(path)
        if xchg != path:
            os.mkdir(xchg, 0o700)
        caps = self.host.sandbox_caps
        if caps is not None and caps.root:
            os.chown(path, uid, uid)
            if xchg != path:
                os.chown(xchg, uid, uid)
        return path, xchg
