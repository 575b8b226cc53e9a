"""The supervisor: one executor subprocess per device, a queue of input groups, crash isolation.

Groups from every Run call wait in one FIFO queue and run one at a time on the executor. The
supervisor follows each case: a case that outlives its timeout, or an executor that dies
(segfault, os._exit, a poisoned CUDA context), costs only that case, which is reported `timeout`
or `crashed` with what is known (exit code or signal, the last lines of the executor's stderr).
A fresh executor is started at once and the group goes on with the impls not yet run (the engine
recomputes inputs and reference). Cancelling a run stops its running case at once (the
executor is restarted); draining on shutdown lets the running case finish. Either way the cases
that did not run are handed back as not run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kassay.errors import ConflictError, WorkerUnavailableError
from kassay.validate.results import CaseResult, Environment
from kassay.validate.spec import GroupSpec, case_id
from kassay.worker.executor import Channel, wants_interpreter

log = logging.getLogger(__name__)

STDERR_TAIL_LINES = 30


class ExecutorStartError(RuntimeError):
    """The executor did not come up (import error, no such device, start-up timeout)."""


class State:
    """Executor states (the names of kassay.v1.ExecutorState without the prefix)."""

    STARTING = "STARTING"
    IDLE = "IDLE"
    BUSY = "BUSY"
    RESTARTING = "RESTARTING"
    STOPPED = "STOPPED"
    FAILED = "FAILED"


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by signal {-returncode} ({name})"
    return f"exited with code {returncode}"


class ExecutorProcess:
    """One `python -m kassay.worker.executor` child and its protocol pipes."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self.poisoned: str | None = None
        self.pending: asyncio.Future[dict[str, Any] | None] | None = None  # the read under way
        self._stderr_task = asyncio.ensure_future(self._pump_stderr())

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    @classmethod
    async def spawn(
        cls, *, device: str, testing: bool, ceilings: dict[str, float] | None, worker_id: str
    ) -> ExecutorProcess:
        args = [
            sys.executable,
            "-m",
            "kassay.worker.executor",
            "--device",
            device,
            "--worker-id",
            worker_id,
        ]
        if testing:
            args.append("--enable-test-impls")
        if ceilings:
            args += ["--ceilings", json.dumps(ceilings)]
        env = dict(os.environ)
        if wants_interpreter(device):
            env["TRITON_INTERPRET"] = "1"
            # OpenMP threads that spin while they wait burn the cores the worker and the API
            # share with the executor: 9 ms instead of 2 ms of CPU per tiny case on 2 cores.
            env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        env.setdefault("PYTHONUNBUFFERED", "1")
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        return cls(proc)

    async def _pump_stderr(self) -> None:
        """Forward the executor's stderr to ours and keep its last lines for crash reports."""
        assert self.proc.stderr is not None
        out = sys.stderr
        while True:
            line = await self.proc.stderr.readline()
            if not line:
                return
            text = line.decode(errors="replace").rstrip("\n")
            self.stderr_tail.append(text)
            with contextlib.suppress(Exception):
                out.write(f"[executor {self.pid}] {text}\n")
                out.flush()

    async def recv(self) -> dict[str, Any] | None:
        """The next message, or None when the executor's end of the pipe closed."""
        assert self.proc.stdout is not None
        try:
            head = await self.proc.stdout.readexactly(4)
            body = await self.proc.stdout.readexactly(int.from_bytes(head, "big"))
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        import pickle

        return pickle.loads(body)

    def send(self, msg: dict[str, Any]) -> bool:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(Channel.encode(msg))
        except (BrokenPipeError, ConnectionError, RuntimeError):
            return False
        return True

    async def kill(self) -> int:
        """SIGKILL the executor (and anything it started in its session) and reap it."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        rc = await self.proc.wait()
        await self.flush_stderr()
        return rc

    async def flush_stderr(self, timeout: float = 0.5) -> None:
        with contextlib.suppress(asyncio.TimeoutError, Exception):
            await asyncio.wait_for(asyncio.shield(self._stderr_task), timeout)

    async def close(self, timeout: float = 5.0) -> None:
        """Ask the executor to exit; kill it if it does not within `timeout`."""
        if self.proc.returncode is None:
            self.send({"type": "exit"})
            with contextlib.suppress(Exception):
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        await self.kill()

    def tail(self, n: int = 6, limit: int = 1200) -> str:
        """What the executor's last stderr lines say: faulthandler's report (the fatal error
        and the innermost frames) when there is one, else its last lines."""
        return summarize_stderr(list(self.stderr_tail), n)[-limit:]


def summarize_stderr(lines: list[str], n: int = 6) -> str:
    lines = [ln.strip() for ln in lines if ln.strip()]
    fatal = [i for i, ln in enumerate(lines) if ln.startswith("Fatal Python error")]
    if fatal:
        i = fatal[-1]
        frames = [ln.removeprefix("File ") for ln in lines[i + 1 :] if ln.startswith("File ")]
        short = [
            re.sub(r'^"(?:.*/)?([^/"]+)", line (\d+) in (.*)$', r"\1:\2 in \3", f)
            for f in frames[:n]
        ]
        return lines[i] + ("; at " + " < ".join(short) if short else "")
    return " | ".join(lines[-n:])


class RunSink(Protocol):
    """Where the events of one run go (the server turns them into kassay.v1.CaseEvent)."""

    def started(self, case_id: str, group_id: str, impl: str, attempt: int) -> None: ...

    def result(self, result: CaseResult) -> None: ...

    def done(
        self, group_id: str, n_results: int, not_run: list[str], reason: str, duration_s: float
    ) -> None: ...

    def finished(self) -> None: ...


@dataclass
class RunHandle:
    run_id: str
    sink: RunSink
    include_mutants: bool = False
    case_timeout_s: float | None = None
    pending: int = 0
    cancelled: bool = False
    groups: list[str] = field(default_factory=list)


@dataclass
class _Item:
    run: RunHandle
    group: GroupSpec


@dataclass
class _Active:
    """Progress of the group on the executor now."""

    item: _Item
    remaining: list[str]
    t0: float
    n_results: int = 0


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
    ) -> None:
        self.device = device
        self.worker_id = worker_id
        self.enable_test_impls = enable_test_impls
        self.case_timeout_s = case_timeout_s
        self.start_timeout_s = start_timeout_s
        self.on_serving = on_serving
        self.state = State.STARTING
        self.info: dict[str, Any] = {}
        self.ceilings: dict[str, float] | None = None
        self.restarts = 0
        self.last_error = ""
        self.current_group: str | None = None
        self.current_case: str | None = None
        self.draining = False
        self._executor: ExecutorProcess | None = None
        self._starting: asyncio.Task[ExecutorProcess] | None = None
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._runs: dict[str, RunHandle] = {}
        self._interrupt = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._loop_task: asyncio.Task[None] | None = None
        self._active: _Active | None = None

    # ---------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Start the first executor (raises ExecutorStartError) and the group loop."""
        await self._ensure_executor()
        self._loop_task = asyncio.ensure_future(self._loop())

    async def drain(self, timeout: float | None = None) -> None:
        """Stop taking groups: the running case finishes, everything else is handed back as not
        run; then the executor exits."""
        self.draining = True
        for item in self._drain_queue():
            self._hand_back(item, "worker shutting down")
        self._interrupt.set()
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
        run.pending = len(groups)
        run.groups = [g.group_id for g in groups]
        for g in groups:
            self._queue.put_nowait(_Item(run, g))
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
        self._interrupt.set()
        return True, pending

    def _finish_run(self, run: RunHandle) -> None:
        self._runs.pop(run.run_id, None)
        run.sink.finished()

    def _group_done(
        self, run: RunHandle, group: GroupSpec, n: int, not_run: list[str], reason: str, t0: float
    ) -> None:
        run.sink.done(group.group_id, n, not_run, reason, time.monotonic() - t0)
        run.pending -= 1
        if run.pending <= 0:
            self._finish_run(run)

    def _hand_back(self, item: _Item, reason: str) -> None:
        self._group_done(item.run, item.group, 0, item.group.case_ids(), reason, time.monotonic())

    def _drain_queue(self) -> list[_Item]:
        items = []
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        return items

    def _stop_reason(self, run: RunHandle) -> str | None:
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

    async def _spawn_ready(self) -> ExecutorProcess:
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
            rc = await exe.kill()
            why = msg.get("error") if msg else f"{describe_exit(rc)}; {exe.tail(4)}"
            raise ExecutorStartError(f"the executor failed to start: {why}")
        info = msg["info"]
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
            await self._lose_executor(exe, kill=False)

    async def _ensure_executor(self) -> ExecutorProcess:
        exe = self._executor
        if exe is not None and exe.returncode is None:
            return exe
        if self._starting is None or self._starting.done():  # a finished start is never reused
            self._starting = asyncio.ensure_future(self._start_executor())
        return await asyncio.shield(self._starting)

    async def _lose_executor(self, exe: ExecutorProcess, *, kill: bool) -> int:
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
                reason = self._stop_reason(item.run)
                if reason is not None:
                    self._hand_back(item, reason)
                else:
                    await self._run_group(item)
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

    def _synth(
        self, group: GroupSpec, impl: str, status: str, message: str, duration_s: float = 0.0
    ) -> CaseResult:
        """A result the engine could not produce (crash, timeout, group-level failure)."""
        return CaseResult(
            case_id=case_id(group.group_id, impl),
            group_id=group.group_id,
            suite_index=group.suite_index,
            op=group.op,
            impl=impl,
            params=group.params,
            regime=group.regime,
            seed=group.seed,
            dtype=str(group.params.get("dtype", "float32")),
            status=status,  # type: ignore[arg-type]
            message=message,
            duration_s=duration_s,
            worker=self.worker_id,
            device=self.info.get("device", self.device),
            environment=self.environment,
        )

    async def _next(
        self, exe: ExecutorProcess, deadline: float, interruptible: bool
    ) -> tuple[str, dict[str, Any] | None]:
        """('msg', m) | ('eof', None) | ('timeout', None) | ('interrupt', None)."""
        # One read at a time, never cancelled: a frame is read whole or not at all.
        if exe.pending is None:
            exe.pending = asyncio.ensure_future(exe.recv())
        recv = exe.pending
        waits: set[asyncio.Future[Any]] = {recv}
        intr: asyncio.Future[Any] | None = None
        if interruptible:
            intr = asyncio.ensure_future(self._interrupt.wait())
            waits.add(intr)
        try:
            done, _ = await asyncio.wait(
                waits,
                timeout=max(0.0, deadline - time.monotonic()),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            if intr is not None:
                intr.cancel()
        if recv in done:
            exe.pending = None
            msg = recv.result()
            return ("eof", None) if msg is None else ("msg", msg)
        return ("interrupt", None) if done else ("timeout", None)

    async def _run_group(self, item: _Item) -> None:
        run, group = item.run, item.group
        t0 = time.monotonic()
        active = self._active = _Active(item, list(group.impls), t0)
        remaining = active.remaining
        attempt = 0
        timeout = run.case_timeout_s or self.case_timeout_s
        self.current_group = group.group_id
        not_run_reason = ""

        def report(res: CaseResult) -> None:
            run.sink.result(res)
            active.n_results += 1
            if res.impl in remaining:
                remaining.remove(res.impl)

        while remaining:
            reason = self._stop_reason(run)
            if reason is not None:
                not_run_reason = reason
                break
            try:
                exe = await self._ensure_executor()
            except ExecutorStartError as exc:
                for impl in list(remaining):
                    report(self._synth(group, impl, "error", f"executor unavailable: {exc}"))
                break
            attempt += 1
            self._interrupt.clear()
            if self._stop_reason(run):
                continue
            sub = group.model_copy(update={"impls": list(remaining)})
            if not exe.send(
                {"type": "run", "group": sub.model_dump(), "include_mutants": run.include_mutants}
            ):
                await self._lose_executor(exe, kill=True)
                continue
            await self._set_state(State.BUSY)
            current: str | None = None
            started_at = time.monotonic()
            deadline = started_at + timeout
            while True:
                # Cancelling a run stops it at once; draining lets the running case finish.
                interruptible = not (self.draining and current is not None)
                kind, msg = await self._next(exe, deadline, interruptible=interruptible)
                now = time.monotonic()
                if kind == "interrupt":
                    if self._stop_reason(run) is None:
                        self._interrupt.clear()
                        continue
                    if current is not None and not run.cancelled:
                        continue  # draining: the running case may finish
                    await self._lose_executor(exe, kill=True)
                    break
                if kind == "timeout":
                    await self._lose_executor(exe, kill=True)
                    if current is not None:
                        report(
                            self._synth(
                                group,
                                current,
                                "timeout",
                                f"case exceeded its timeout of {timeout:g} s; the executor was "
                                "killed and restarted",
                                now - started_at,
                            )
                        )
                    else:
                        for impl in list(remaining):
                            report(
                                self._synth(
                                    group,
                                    impl,
                                    "timeout",
                                    f"preparing the group (inputs, reference, baseline) exceeded "
                                    f"the case timeout of {timeout:g} s",
                                    now - started_at,
                                )
                            )
                    break
                if kind == "eof":
                    poisoned = exe.poisoned
                    rc = await self._lose_executor(exe, kill=False)
                    died = f"the executor died: {describe_exit(rc)}"
                    tail = exe.tail()
                    if tail:
                        died += f"; stderr: {tail}"
                    if current is not None:
                        report(self._synth(group, current, "crashed", died, now - started_at))
                    elif poisoned is None:
                        for impl in list(remaining):
                            report(
                                self._synth(
                                    group, impl, "crashed", f"{died} (while preparing the group)"
                                )
                            )
                    break
                assert msg is not None
                mtype = msg.get("type")
                if mtype == "started":
                    cid = str(msg["case_id"])
                    current = cid.rsplit(":", 1)[-1]
                    self.current_case = cid
                    started_at, deadline = now, now + timeout
                    run.sink.started(cid, group.group_id, current, attempt)
                elif mtype == "result":
                    res = CaseResult.model_validate(msg["result"])
                    if res.worker is None:
                        res.worker = self.worker_id
                    report(res)
                    current = self.current_case = None
                    started_at, deadline = now, now + timeout
                    if remaining and self._stop_reason(run) is not None:
                        await self._lose_executor(exe, kill=True)
                        break
                elif mtype == "poisoned":
                    exe.poisoned = str(msg.get("reason", ""))
                    log.warning("executor %s: CUDA context poisoned: %s", exe.pid, exe.poisoned)
                elif mtype == "group_error":
                    for impl in list(remaining):
                        report(
                            self._synth(
                                group,
                                impl,
                                "error",
                                f"the group could not run: {msg.get('error')}",
                                now - t0,
                            )
                        )
                    break
                elif mtype == "group_done":
                    for impl in list(remaining):
                        report(
                            self._synth(
                                group, impl, "error", "the engine returned no result for this case"
                            )
                        )
                    break
            if self._executor is not None and self.state == State.BUSY:
                await self._set_state(State.IDLE)
        if remaining and not not_run_reason:
            not_run_reason = self._stop_reason(run) or "not run"
        self._finish_active(not_run_reason)

    def _finish_active(self, reason: str) -> None:
        """Send the GroupDone of the running group (once), handing back what did not run."""
        active, self._active = self._active, None
        if active is None:
            return
        group = active.item.group
        self._group_done(
            active.item.run,
            group,
            active.n_results,
            [case_id(group.group_id, i) for i in active.remaining],
            reason if active.remaining else "",
            active.t0,
        )


def _log_task_error(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("executor restart failed: %s", task.exception())
