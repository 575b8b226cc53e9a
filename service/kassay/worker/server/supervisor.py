"""The supervisor: one executor subprocess per device, a queue of input groups, crash isolation.

Groups from every Run call wait in one FIFO queue and run one at a time on the executor. The
supervisor follows each case: a case that outlives its timeout, or an executor that dies
(segfault, os._exit, a poisoned CUDA context), costs only that case, which is reported `timeout`
or `crashed` with what is known (exit code or signal, the last lines of the executor's stderr).
A fresh executor is started at once and the group goes on with the impls not yet run (the engine
recomputes inputs and reference). Cancelling a run stops its running case at once (the
executor is restarted); draining on shutdown lets the running case finish. Either way the cases
that did not run are handed back as not run.

The executor process and its messages are kassay.worker.server.executor_process; the steps that follow
one group's cases on it are kassay.worker.server.active_group. A group that names artifacts runs on the
same executor, whose sandboxed impl runner for the run (kassay.worker.executor.remote_impls) gets what
the run's lease holds (kassay.worker.server.runner_leases: the artifacts installed from the cache, a
working directory and a user of its own); the lease ends with the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kassay.contract.results import Environment
from kassay.contract.spec import GroupSpec
from kassay.errors import ConflictError, WorkerUnavailableError
from kassay.worker.runner.sandbox import Capabilities, SandboxConfig
from kassay.worker.server.active_group import ActiveGroup, QueuedGroup, RunHandle, RunSink
from kassay.worker.server.artifact_cache import ArtifactCache
from kassay.worker.server.executor_process import (
    ExecutorProcess,
    ExecutorStartError,
    State,
    describe_exit,
    summarize_stderr,
)
from kassay.worker.server.runner_leases import RUNNER_LINGER_S, RunnerLeases

log = logging.getLogger(__name__)

__all__ = [
    "ExecutorProcess",
    "ExecutorStartError",
    "RunHandle",
    "RunSink",
    "State",
    "Supervisor",
    "describe_exit",
    "summarize_stderr",
]


class Supervisor:
    """Owns the executor of one device and runs the queued groups on it, one at a time."""

    def __init__(
        self,
        *,
        device: str,
        worker_id: str,
        enable_test_impls: bool = False,
        case_timeout_s: float = 300.0,
        start_timeout_s: float = 120.0,
        on_serving: Callable[[bool], Awaitable[None]] | None = None,
        artifacts: ArtifactCache | None = None,
        sandbox_config: SandboxConfig | None = None,
    ) -> None:
        self.device = device
        self.worker_id = worker_id
        self.enable_test_impls = enable_test_impls
        self.case_timeout_s = case_timeout_s
        self.start_timeout_s = start_timeout_s
        self.on_serving = on_serving
        #: where artifacts are kept (None: this worker runs no artifacts) and how they run
        self.artifacts = artifacts
        self.sandbox_config = sandbox_config or SandboxConfig(workdir="")
        if device.startswith("cuda"):
            # CUDA does not initialise in a new PID namespace (error 304, seen on the H200)
            self.sandbox_config = dataclasses.replace(self.sandbox_config, pid_namespace=False)
        self.sandbox_caps: Capabilities | None = None
        #: offsets from sandbox_config.uid held by running sandboxes (one user each)
        self.sandbox_uids: set[int] = set()
        #: what the impl runners of code jobs are lent, per run
        self.runners = RunnerLeases(self)
        self.state = State.STARTING
        self.info: dict[str, Any] = {}
        self.ceilings: dict[str, float] | None = None
        self.restarts = 0
        #: told of each impl runner start (started or not, seconds): the worker's metrics
        self.on_runner_start: Callable[[bool, float], None] | None = None
        self.last_error = ""
        self.current_group: str | None = None
        self.current_case: str | None = None
        self.draining = False
        self._executor: ExecutorProcess | None = None
        self._starting: asyncio.Task[ExecutorProcess] | None = None
        self._queue: asyncio.Queue[QueuedGroup] = asyncio.Queue()
        self._runs: dict[str, RunHandle] = {}
        self.interrupt = asyncio.Event()  # set to stop the running group (cancel, drain)
        self._idle = asyncio.Event()
        self._idle.set()
        self._loop_task: asyncio.Task[None] | None = None
        self._active: ActiveGroup | None = None

    # ---------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Start the first executor (raises ExecutorStartError) and the group loop."""
        if self.artifacts is not None:
            self.sandbox_caps = await probe_sandbox()
        await self.ensure_executor()
        self._loop_task = asyncio.ensure_future(self._loop())

    async def drain(self, timeout: float | None = None) -> None:
        """Stop taking groups: the running case finishes, everything else is handed back as not
        run; then the executor exits."""
        self.draining = True
        for item in self._drain_queue():
            self._hand_back(item, "worker shutting down")
        self.interrupt.set()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wait_drained(), timeout)
        await self.close()

    async def _wait_drained(self) -> None:
        while not (self._idle.is_set() and self._queue.empty()):
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        self.draining = True
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(BaseException):
                await self._loop_task
        if self._starting is not None:
            self._starting.cancel()
            with contextlib.suppress(BaseException):
                await self._starting
        if self._executor is not None:
            await self._executor.close()
            self._executor = None
        for item in self._drain_queue():
            self._hand_back(item, "worker shutting down")
        self.runners.release_all()
        self.state = State.STOPPED

    # ------------------------------------------------------------------------------ queries

    @property
    def environment(self) -> Environment | None:
        env = self.info.get("environment")
        return Environment.model_validate(env) if env else None

    async def wait_ready(self, timeout: float) -> None:
        """Wait until the first executor has described the device."""
        deadline = time.monotonic() + timeout
        while not self.info:
            if self.state == State.FAILED:
                raise WorkerUnavailableError(f"the executor cannot start: {self.last_error}")
            if time.monotonic() > deadline:
                raise WorkerUnavailableError("the executor is still starting")
            await asyncio.sleep(0.05)

    def snapshot(self) -> dict[str, Any]:
        exe = self._executor
        return {
            "state": self.state,
            "pid": exe.pid if exe and exe.returncode is None else None,
            "restarts": self.restarts,
            "queued_groups": self._queue.qsize(),
            "current_group": self.current_group,
            "current_case": self.current_case,
            "last_error": self.last_error,
        }

    # --------------------------------------------------------------------------------- runs

    def submit(self, run: RunHandle, groups: list[GroupSpec]) -> None:
        if self.draining:
            raise WorkerUnavailableError("the worker is shutting down")
        if run.run_id in self._runs:
            raise ConflictError(
                f"run {run.run_id!r} is already running on this worker",
                details={"run_id": run.run_id},
            )
        self._runs[run.run_id] = run
        self.runners.enter(run)
        run.pending = len(groups)
        run.groups = [g.group_id for g in groups]
        for g in groups:
            self._queue.put_nowait(QueuedGroup(run, g))
        if not groups:
            self._finish_run(run)

    def cancel(self, run_id: str) -> tuple[bool, int]:
        """Cancel a run: (whether it was active, how many of its groups will not complete)."""
        run = self._runs.get(run_id)
        if run is None or run.cancelled:
            return False, 0
        run.cancelled = True
        pending = run.pending
        for item in self._drain_queue():
            if item.run is run:
                self._hand_back(item, "run cancelled")
            else:
                self._queue.put_nowait(item)
        self.interrupt.set()
        return True, pending

    def _finish_run(self, run: RunHandle) -> None:
        self._runs.pop(run.run_id, None)
        # the job's impl runners end with its last run (after its last group, or now: a
        # cancelled run); else they wait a while for the job's next run
        ended, idle = self.runners.release_run(run)
        for key in ended:
            self._end_runner(key)
        for key in idle:
            asyncio.get_running_loop().call_later(RUNNER_LINGER_S, self._end_idle_runner, key)
        run.sink.finished()

    def _end_runner(self, key: str) -> None:
        if self._executor is not None and self._executor.returncode is None:
            self._executor.send({"type": "end_runner", "key": key})

    def _end_idle_runner(self, key: str) -> None:
        if self.runners.end_idle(key):
            log.info("impl runner %s ended: no run of its job for %g s", key, RUNNER_LINGER_S)
            self._end_runner(key)

    def _group_done(
        self, run: RunHandle, group: GroupSpec, n: int, not_run: list[str], reason: str, t0: float
    ) -> None:
        run.sink.done(group.group_id, n, not_run, reason, time.monotonic() - t0)
        run.pending -= 1
        if run.pending <= 0:
            self._finish_run(run)

    def _hand_back(self, item: QueuedGroup, reason: str) -> None:
        self._group_done(item.run, item.group, 0, item.group.case_ids(), reason, time.monotonic())

    def _drain_queue(self) -> list[QueuedGroup]:
        items = []
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        return items

    def stop_reason(self, run: RunHandle) -> str | None:
        """Why `run` must not go on (the worker drains, the run was cancelled), else None."""
        if self.draining:
            return "worker shutting down"
        if run.cancelled:
            return "run cancelled"
        return None

    # ---------------------------------------------------------------------------- executor

    async def _set_state(self, state: str) -> None:
        self.state = state
        if self.on_serving is not None:
            with contextlib.suppress(Exception):
                await self.on_serving(state in (State.IDLE, State.BUSY))

    async def mark_busy(self) -> None:
        """The executor has a group to run."""
        await self._set_state(State.BUSY)

    async def mark_idle(self) -> None:
        """The group's attempt is over; the executor, if it is still there, waits."""
        if self._executor is not None and self.state == State.BUSY:
            await self._set_state(State.IDLE)

    def sandbox_info(self) -> dict[str, Any]:
        """The kassay.v1.Sandbox fields: whether this worker runs artifacts, and how."""
        if self.artifacts is None or self.sandbox_caps is None:
            return {"artifacts": False, "notes": ["this worker runs no artifacts"]}
        return {"artifacts": True, **self.sandbox_caps.describe(self.sandbox_config)}

    async def spawn_ready(self) -> tuple[ExecutorProcess, dict[str, Any]]:
        """Start an executor and wait for its ready message: (executor, what it reported)."""
        exe = await ExecutorProcess.spawn(
            device=self.device,
            testing=self.enable_test_impls,
            ceilings=self.ceilings,
            worker_id=self.worker_id,
        )
        try:
            msg = await asyncio.wait_for(exe.recv(), self.start_timeout_s)
        except asyncio.TimeoutError:
            await exe.kill()
            raise ExecutorStartError(
                f"the executor did not start within {self.start_timeout_s:g} s"
            ) from None
        if msg is None or msg.get("type") != "ready":
            if msg is None:  # its pipe closed: let it finish dying, to report how it died
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(exe.proc.wait(), 5.0)
            rc = await exe.kill()
            why = msg.get("error") if msg else f"{describe_exit(rc)}; {exe.tail(4)}"
            raise ExecutorStartError(f"the executor failed to start: {why}")
        return exe, dict(msg.get("info") or {})

    async def _spawn_ready(self) -> ExecutorProcess:
        exe, info = await self.spawn_ready()
        if self.ceilings is None:
            self.ceilings = dict(info.get("ceilings") or {})
        self.info = info
        log.info("executor %s ready on %s", exe.pid, info.get("device"))
        return exe

    async def _start_executor(self) -> ExecutorProcess:
        first = not self.info
        await self._set_state(State.STARTING if first else State.RESTARTING)
        attempts = 1 if first else 3
        for attempt in range(attempts):
            try:
                exe = await self._spawn_ready()
            except ExecutorStartError as exc:
                self.last_error = str(exc)
                log.error("%s", exc)
                if attempt + 1 < attempts:
                    await asyncio.sleep(0.5 * (attempt + 1))
                    continue
                await self._set_state(State.FAILED)
                raise
            self._executor = exe
            await self._set_state(State.IDLE)
            watch = asyncio.ensure_future(self._watch(exe))
            watch.add_done_callback(_log_task_error)
            return exe
        raise AssertionError("unreachable")

    async def _watch(self, exe: ExecutorProcess) -> None:
        """Restart an executor that dies while idle (OOM killer, a stray signal); a death
        during a group is handled by the group loop, which sees the pipe close."""
        rc = await exe.proc.wait()
        if self._executor is exe and self.state == State.IDLE and not self.draining:
            log.warning("executor %s died while idle: %s", exe.pid, describe_exit(rc))
            self.last_error = f"executor died while idle: {describe_exit(rc)}"
            await self.lose_executor(exe, kill=False)

    async def ensure_executor(self) -> ExecutorProcess:
        """The running executor, or the one starting (raises ExecutorStartError)."""
        exe = self._executor
        if exe is not None and exe.returncode is None:
            return exe
        if self._starting is None or self._starting.done():  # a finished start is never reused
            self._starting = asyncio.ensure_future(self._start_executor())
        return await asyncio.shield(self._starting)

    def runner_started(self, ok: bool, seconds: float) -> None:
        """An executor started a code job's impl runner (`ok`: it came up) in `seconds`."""
        if self.on_runner_start is not None:
            self.on_runner_start(ok, seconds)

    async def lose_executor(self, exe: ExecutorProcess, *, kill: bool) -> int:
        """Forget a dead (or doomed) executor and start the next one in the background."""
        rc = await exe.kill() if kill else await exe.proc.wait()
        if not kill:
            await exe.flush_stderr()
        if self._executor is exe:
            self._executor = None
        if not self.draining:
            self.restarts += 1
            await self._set_state(State.RESTARTING)
            if self._starting is None or self._starting.done():
                self._starting = asyncio.ensure_future(self._start_executor())
                self._starting.add_done_callback(_log_task_error)
        return rc

    # ----------------------------------------------------------------------------- the loop

    async def _loop(self) -> None:
        while True:
            item = await self._queue.get()
            self._idle.clear()
            try:
                reason = self.stop_reason(item.run)
                if reason is not None:
                    self._hand_back(item, reason)
                else:
                    self._active = ActiveGroup(self, item)
                    self._finish_active(await self._active.execute())
            except asyncio.CancelledError:
                self._finish_active("worker shutting down")
                raise
            except Exception:  # never let one group take the loop down
                log.exception("group %s failed in the supervisor", item.group.group_id)
                self._finish_active("internal error in the worker's supervisor")
            finally:
                self.current_group = self.current_case = None
                if self._queue.empty():
                    self._idle.set()

    def _finish_active(self, reason: str) -> None:
        """Send the GroupDone of the running group (once), handing back what did not run."""
        active, self._active = self._active, None
        if active is None:
            return
        not_run = active.not_run()
        self._group_done(
            active.run,
            active.group,
            active.n_results,
            not_run,
            reason if not_run else "",
            active.t0,
        )


async def probe_sandbox() -> Capabilities:
    """What this host lets the sandbox do (asked of a child process: the probe forks)."""
    import json
    import sys

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kassay.worker.runner.sandbox",
        "--probe",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    try:
        return Capabilities(**json.loads(out))
    except (ValueError, TypeError):
        note = f"the sandbox probe failed: {err.decode(errors='replace')[-300:]}"
        return Capabilities(root=False, landlock_abi=0, namespaces=False, notes=[note])


def _log_task_error(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("executor restart failed: %s", task.exception())
