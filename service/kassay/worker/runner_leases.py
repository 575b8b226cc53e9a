"""What the supervisor lends the impl runner of a run that brings code: one lease per (run,
artifact set) on this worker's device.

A group that names artifacts runs on the device's shared executor like any other group; the
artifacts' impls run in one sandboxed impl runner that the executor starts for the run's first
such group and keeps for its later ones (kassay.worker.remote_impls): Python, torch, the CUDA
context and the artifacts' imports are paid once per job, not once per group. The lease holds
what that runner is given: the artifacts installed from the cache, a working directory of its
own (also its HOME and TMPDIR; its tensor exchange folder in /dev/shm where there is one), a
user of its own (as root) and the sandbox's config. It ends with the run: the executor ends the
runner after the run's last group, and the supervisor removes both folders and frees the
user. Never shared between runs: the trust boundary is the job.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from kassay.worker.sandbox import exchange_dir

if TYPE_CHECKING:
    from kassay.worker.artifacts import ArtifactCache
    from kassay.worker.sandbox import Capabilities, SandboxConfig


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


@dataclass
class RunnerLease:
    key: str
    run_id: str
    #: digest -> the artifact's unpacked folder
    paths: dict[str, str]
    workdir: str
    exchange: str
    offset: int
    config: SandboxConfig

    def message(self) -> dict[str, Any]:
        """The `runner` field of the executor's run message (kassay.worker.executor)."""
        return {"key": self.key, "artifacts": self.paths, "sandbox": self.config.to_json()}


class RunnerLeases:
    """The leases of the runs on one supervisor."""

    def __init__(self, host: LeaseHost) -> None:
        self.host = host
        self.leases: dict[str, RunnerLease] = {}

    @staticmethod
    def key(run_id: str, digests: list[str]) -> str:
        return f"{run_id}/{'+'.join(sorted(digests))}"

    async def lease(self, run_id: str, digests: list[str]) -> RunnerLease:
        """The run's lease for these artifacts, made on first use (GroupRefused when an
        artifact cannot be installed)."""
        key = self.key(run_id, digests)
        if key in self.leases:
            return self.leases[key]
        paths = await self._install(digests)
        if key in self.leases:  # made meanwhile
            return self.leases[key]
        offset = self._free_offset()
        uid = self.host.sandbox_config.uid + offset
        workdir, xchg = self._fresh_workdir(uid)
        caps = self.host.sandbox_caps
        config = replace(
            self.host.sandbox_config,
            workdir=workdir,
            # the tensor exchange (kassay.worker.tensor_exchange), where it is not the workdir
            writable=[x for x in [xchg] if x != workdir],
            uid=uid,
            # only what the host was seen to allow (a container may refuse namespaces)
            namespaces=bool(caps and caps.namespaces) and self.host.sandbox_config.namespaces,
            landlock=bool(caps and caps.landlock_abi) and self.host.sandbox_config.landlock,
        )
        lease = RunnerLease(key, run_id, paths, workdir, xchg, offset, config)
        self.leases[key] = lease
        return lease

    def of_run(self, run_id: str) -> list[str]:
        return [k for k, lease in self.leases.items() if lease.run_id == run_id]

    def release_run(self, run_id: str) -> list[str]:
        """End the run's leases: their folders removed, their users free. Returns their keys
        (the executor must end those runners, if it has not)."""
        keys = self.of_run(run_id)
        for key in keys:
            lease = self.leases.pop(key)
            shutil.rmtree(lease.workdir, ignore_errors=True)
            shutil.rmtree(lease.exchange, ignore_errors=True)
            self.host.sandbox_uids.discard(lease.offset)
        return keys

    def release_all(self) -> None:
        for run_id in {lease.run_id for lease in self.leases.values()}:
            self.release_run(run_id)

    async def _install(self, digests: list[str]) -> dict[str, str]:
        cache = self.host.artifacts
        if cache is None:
            raise GroupRefused("this worker does not run artifacts")
        from kassay.worker.artifacts import ArtifactRefused

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
