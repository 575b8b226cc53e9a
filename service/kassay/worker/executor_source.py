"""Where a group's executor comes from.

- `SharedExecutor`: the supervisor's long-lived executor of the device (built-ins, peers and
  installed plugins); restarted by the supervisor after a crash.
- `SandboxedExecutor`: for a group that names artifacts, a fresh executor inside the sandbox
  (kassay.worker.sandbox) that loads them, in a fresh working directory; a crash costs a fresh
  one; it is discarded, with its working directory, when the group ends. Artifact code never
  runs in the worker process, nor in the shared executor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Any, Protocol

from kassay.validate.spec import GroupSpec
from kassay.worker.executor_process import ExecutorProcess, ExecutorStartError
from kassay.worker.sandbox import exchange_dir

if TYPE_CHECKING:
    from kassay.worker.artifacts import ArtifactCache
    from kassay.worker.sandbox import Capabilities, SandboxConfig


class ExecutorHost(Protocol):
    """What an executor source needs of whoever owns the device's executors (the supervisor):
    its shared executor, the artifact cache and the sandbox's settings and users."""

    artifacts: ArtifactCache | None
    sandbox_config: SandboxConfig
    sandbox_caps: Capabilities | None
    sandbox_uids: set[int]

    async def ensure_executor(self) -> ExecutorProcess: ...

    async def lose_executor(self, exe: ExecutorProcess, *, kill: bool) -> int: ...

    async def spawn_ready(self, **extra: Any) -> tuple[ExecutorProcess, dict[str, Any]]: ...


log = logging.getLogger(__name__)


class GroupRefused(Exception):
    """The group cannot run at all: its cases get `status` with this message."""

    def __init__(self, message: str, *, status: str = "error") -> None:
        super().__init__(message)
        self.status = status


class ExecutorSource(Protocol):
    async def acquire(self) -> ExecutorProcess:
        """An executor ready to run the group (raises ExecutorStartError or GroupRefused)."""

    async def lose(self, exe: ExecutorProcess, *, kill: bool) -> int:
        """The executor died (or must: `kill`); returns its exit status."""

    async def close(self) -> None:
        """The group is over."""


class SharedExecutor:
    """The supervisor's executor."""

    def __init__(self, sup: ExecutorHost) -> None:
        self.sup = sup

    async def acquire(self) -> ExecutorProcess:
        return await self.sup.ensure_executor()

    async def lose(self, exe: ExecutorProcess, *, kill: bool) -> int:
        return await self.sup.lose_executor(exe, kill=kill)

    async def close(self) -> None:
        return None


class SandboxedExecutor:
    """A sandboxed executor per attempt of one group with artifacts (see the module
    docstring)."""

    def __init__(
        self, sup: ExecutorHost, group: GroupSpec, *, include_mutants: bool = False
    ) -> None:
        self.sup = sup
        self.group = group
        self.include_mutants = include_mutants
        self.exe: ExecutorProcess | None = None
        self.workdir: str | None = None
        self.exchange = ""  # the tensor exchange folder (the workdir or one in /dev/shm)
        self._paths: dict[str, str] | None = None
        self._offset: int | None = None

    async def _install(self) -> dict[str, str]:
        """digest -> unpacked folder, installing on first use (GroupRefused when one cannot
        be)."""
        cache = self.sup.artifacts
        if cache is None:
            raise GroupRefused("this worker does not run artifacts")
        from kassay.worker.artifacts import ArtifactRefused

        paths = {}
        for digest in self.group.artifacts:
            try:
                paths[digest] = str(await asyncio.to_thread(cache.install, digest))
            except ArtifactRefused as exc:
                raise GroupRefused(exc.message) from None
        return paths

    def _fresh_workdir(self, uid: int) -> str:
        path = tempfile.mkdtemp(prefix="kassay-sandbox-")
        xchg = self.exchange = exchange_dir(path)
        if xchg != path:
            os.mkdir(xchg, 0o700)
        caps = self.sup.sandbox_caps
        if caps is not None and caps.root:
            os.chown(path, uid, uid)
            if xchg != path:
                os.chown(xchg, uid, uid)
        return path

    def _uid(self) -> int:
        """A user of this sandbox's own (the base uid + the lowest offset no running sandbox
        of this worker holds): RLIMIT_NPROC counts per user across the host."""
        if self._offset is None:
            taken = self.sup.sandbox_uids
            self._offset = next(i for i in range(len(taken) + 1) if i not in taken)
            taken.add(self._offset)
        return self.sup.sandbox_config.uid + self._offset

    def _release_uid(self) -> None:
        if self._offset is not None:
            self.sup.sandbox_uids.discard(self._offset)
            self._offset = None

    def _drop_workdir(self) -> None:
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            shutil.rmtree(self.exchange, ignore_errors=True)
            self.workdir = None

    async def acquire(self) -> ExecutorProcess:
        if self._paths is None:
            self._paths = await self._install()
        await self._discard()
        uid = self._uid()
        self.workdir = self._fresh_workdir(uid)
        from dataclasses import replace

        caps = self.sup.sandbox_caps
        config = replace(
            self.sup.sandbox_config,
            workdir=self.workdir,
            # the tensor exchange (kassay.worker.tensor_exchange), where it is not the workdir
            writable=[x for x in [self.exchange] if x != self.workdir],
            uid=uid,
            # only what the host was seen to allow (a container may refuse namespaces)
            namespaces=bool(caps and caps.namespaces) and self.sup.sandbox_config.namespaces,
            landlock=bool(caps and caps.landlock_abi) and self.sup.sandbox_config.landlock,
        )
        short = ", ".join(d[:12] for d in self.group.artifacts)
        try:
            exe, info = await self.sup.spawn_ready(sandbox=config, artifacts=self._paths)
        except ExecutorStartError as exc:
            self._drop_workdir()
            raise GroupRefused(
                f"the sandboxed executor for artifacts {short} did not start: {exc}",
                status="crashed",
            ) from None
        self.exe = exe
        self._check_impls(info, short)
        return exe

    def _check_impls(self, info: dict[str, Any], short: str) -> None:
        """Every impl the group names must exist once the artifacts are loaded."""
        ops = {o["name"]: o for o in info.get("ops", [])}
        found = [
            i["name"]
            for i in ops.get(self.group.op, {}).get("impls", [])
            if self.include_mutants or i.get("kind") != "mutant"
        ]
        missing = [n for n in [*self.group.impls, self.group.baseline] if n not in found]
        if missing:
            errors: list[Any] = list(info.get("artifact_errors") or [])
            raise GroupRefused(
                f"unknown impl{'s' if len(missing) > 1 else ''} "
                f"{', '.join(repr(m) for m in dict.fromkeys(missing))} for op "
                f"{self.group.op!r} after loading artifacts {short}; impls found: "
                f"{', '.join(found) or '(none)'}"
                + (f"; not loaded: {'; '.join(map(str, errors))}" if errors else "")
            )

    async def lose(self, exe: ExecutorProcess, *, kill: bool) -> int:
        rc = await exe.kill() if kill else await exe.proc.wait()
        if not kill:
            await exe.flush_stderr()
        if self.exe is exe:
            self.exe = None
        self._drop_workdir()
        return rc

    async def _discard(self) -> None:
        exe, self.exe = self.exe, None
        if exe is not None:
            with contextlib.suppress(Exception):
                await exe.kill()
        self._drop_workdir()

    async def close(self) -> None:
        await self._discard()
        self._release_uid()
