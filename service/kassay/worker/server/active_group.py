"""One input group on the executor, case by case.

The supervisor hands a queued group to an `ActiveGroup`, which sends the impls not yet run to the
executor and follows its messages: a case starts, a case's result arrives, the group fails as a
whole, the group is done. What the executor cannot report is reported here: a case that outlives
its timeout (`timeout`), an executor that dies (`crashed`, with its exit and its last stderr
lines), a group whose inputs or reference failed (`error`). After a crash or a timeout the next
attempt, on a fresh executor, goes on with the impls not yet run. A group that names artifacts runs on the
same executor, with its run's runner lease (kassay.worker.server.runner_leases): the executor runs the
artifacts' impls in the run's sandboxed impl runner, ended after the run's last group.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from kassay.contract.results import CaseResult, Environment, Status
from kassay.contract.spec import GroupSpec, case_id
from kassay.validate.case_result import case_result
from kassay.worker.server.executor_process import ExecutorProcess, ExecutorStartError, describe_exit
from kassay.worker.server.runner_leases import GroupRefused, RunnerLeases

log = logging.getLogger(__name__)


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
    #: the job the run is part of: its runs share the job's impl runners on this worker
    job_id: str = ""
    #: nothing of the job was left to dispatch: its runners end with this run
    job_last: bool = True
    include_mutants: bool = False
    case_timeout_s: float | None = None
    pending: int = 0
    cancelled: bool = False
    groups: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.job_id:  # a run without a job is a job of its own
            self.job_id = f"run:{self.run_id}"


class RunHost(Protocol):
    """What a running group needs of the supervisor: its executor, the runner leases of code
    jobs, the worker's id, case and start-up timeouts, the state it shows in Describe, whether
    to stop (cancel, drain), where to count an impl runner's start."""

    worker_id: str
    device: str
    info: dict[str, Any]
    case_timeout_s: float
    start_timeout_s: float
    runners: RunnerLeases
    current_group: str | None
    current_case: str | None
    draining: bool
    interrupt: asyncio.Event

    @property
    def environment(self) -> Environment | None: ...

    def stop_reason(self, run: RunHandle) -> str | None: ...

    async def ensure_executor(self) -> ExecutorProcess: ...

    async def lose_executor(self, exe: ExecutorProcess, *, kill: bool) -> int: ...

    async def mark_busy(self) -> None: ...

    async def mark_idle(self) -> None: ...

    def runner_started(self, ok: bool, seconds: float) -> None: ...


@dataclass
class QueuedGroup:
    """A group of a run, waiting for the executor."""

    run: RunHandle
    group: GroupSpec


class ActiveGroup:
    """The group on the executor now: its progress (results sent, impls left) and the steps that
    follow each case."""

    def __init__(self, sup: RunHost, item: QueuedGroup) -> None:
        self.sup = sup
        self.item = item
        self.run = item.run
        self.group = item.group
        self.remaining = list(item.group.impls)
        self.n_results = 0
        self.t0 = time.monotonic()
        self.timeout = self.run.case_timeout_s or sup.case_timeout_s
        self.attempt = 0
        # The attempt under way: the impl running now (None while the executor prepares the
        # group or between cases) and when the clock of the next step started.
        self.current: str | None = None
        self.started_at = self.t0
        self.deadline = self.t0 + self.timeout

    # --------------------------------------------------------------------------- the group

    async def execute(self) -> str:
        """Run the group's impls, over as many executors as crashes need. Returns why impls
        were left without a result ('' when every impl has one)."""
        self.sup.current_group = self.group.group_id
        not_run_reason = ""
        while self.remaining:
            reason = self.sup.stop_reason(self.run)
            if reason is not None:
                not_run_reason = reason
                break
            if not await self._attempt():
                break
        if self.remaining and not not_run_reason:
            not_run_reason = self.sup.stop_reason(self.run) or "not run"
        return not_run_reason

    def not_run(self) -> list[str]:
        """The case ids still without a result."""
        return [case_id(self.group.group_id, i) for i in self.remaining]

    async def _attempt(self) -> bool:
        """Send the impls not yet run to the executor and follow them until the attempt ends.
        False when no executor can be had (the impls left are then reported `error`)."""
        runner: dict[str, Any] | None = None
        try:
            if self.group.artifacts:
                lease = await self.sup.runners.lease(self.run, list(self.group.artifacts))
                runner = lease.message()
            exe = await self.sup.ensure_executor()
        except ExecutorStartError as exc:
            self._report_remaining("error", f"executor unavailable: {exc}")
            return False
        except GroupRefused as exc:
            status: Status = "crashed" if exc.status == "crashed" else "error"
            self._report_remaining(status, str(exc))
            return False
        self.attempt += 1
        self.sup.interrupt.clear()
        if self.sup.stop_reason(self.run):
            return True  # execute() sees the reason and stops
        sub = self.group.model_copy(update={"impls": list(self.remaining)})
        # the job's last group on this worker ends its impl runners when it is done, before
        # the run is said to be over
        last = self.sup.runners.ending_with(self.run) if self.run.pending <= 1 else []
        if not exe.send_run(
            sub, include_mutants=self.run.include_mutants, runner=runner, end_runners=last
        ):
            await self.sup.lose_executor(exe, kill=True)
            return True
        await self.sup.mark_busy()
        await self._follow(exe)
        await self.sup.mark_idle()
        return True

    async def _follow(self, exe: ExecutorProcess) -> None:
        """Handle the executor's events until the attempt ends: every impl reported, the group
        failed, the executor died or was killed (timeout, cancel)."""
        self._restart_clock(time.monotonic())
        self.current = None
        over = False
        while not over:
            # Cancelling a run stops it at once; draining lets the running case finish.
            interruptible = not (self.sup.draining and self.current is not None)
            kind, msg = await exe.next_event(
                self.deadline, self.sup.interrupt if interruptible else None
            )
            now = time.monotonic()
            if kind == "interrupt":
                over = await self._on_interrupt(exe)
            elif kind == "timeout":
                await self._on_timeout(exe, now)
                over = True
            elif kind == "eof":
                await self._on_executor_died(exe, now)
                over = True
            else:
                assert msg is not None
                over = await self._on_message(exe, msg, now)

    # ------------------------------------------------------------------- executor events

    async def _on_interrupt(self, exe: ExecutorProcess) -> bool:
        """The run was cancelled or the worker drains (or another run was cancelled: then go
        on). True when the attempt ends here (the executor is killed)."""
        if self.sup.stop_reason(self.run) is None:
            self.sup.interrupt.clear()
            return False
        if self.current is not None and not self.run.cancelled:
            return False  # draining: the running case may finish
        await self.sup.lose_executor(exe, kill=True)
        return True

    async def _on_timeout(self, exe: ExecutorProcess, now: float) -> None:
        """The running case (or the group's preparation) outlived the timeout: kill the
        executor and report it (or every impl left) `timeout`."""
        await self.sup.lose_executor(exe, kill=True)
        if self.current is not None:
            self._report_synthetic(
                self.current,
                "timeout",
                f"case exceeded its timeout of {self.timeout:g} s; the executor was "
                "killed and restarted",
                now - self.started_at,
            )
        else:
            self._report_remaining(
                "timeout",
                f"preparing the group (inputs, reference, baseline) exceeded "
                f"the case timeout of {self.timeout:g} s",
                now - self.started_at,
            )

    async def _on_executor_died(self, exe: ExecutorProcess, now: float) -> None:
        """The executor's pipe closed: report the running case (or every impl left, unless the
        executor said its CUDA context was poisoned after a result) `crashed`."""
        poisoned = exe.poisoned
        broke = exe.protocol_error
        rc = await self.sup.lose_executor(exe, kill=broke is not None)
        died = (
            f"the executor broke the protocol ({broke}) and was killed"
            if broke
            else f"the executor died: {describe_exit(rc)}"
        )
        tail = exe.tail()
        if tail:
            died += f"; stderr: {tail}"
        if self.current is not None:
            self._report_synthetic(self.current, "crashed", died, now - self.started_at)
        elif poisoned is None:
            self._report_remaining("crashed", f"{died} (while preparing the group)")

    async def _on_message(self, exe: ExecutorProcess, msg: dict[str, Any], now: float) -> bool:
        """One message of the executor (see kassay.worker.executor.main). True when the attempt
        ends with it."""
        mtype = msg.get("type")
        if mtype == "runner_starting":  # the impl runner's start runs on the start-up clock
            self.started_at, self.deadline = now, now + self.sup.start_timeout_s
        elif mtype == "runner_ready":
            self._restart_clock(now)
            seconds = msg.get("seconds")
            self.sup.runner_started(
                msg.get("ok") is not False,
                float(seconds) if isinstance(seconds, (int, float)) else now - self.started_at,
            )
        elif mtype == "started":
            self._case_started(str(msg.get("case_id")), now)
        elif mtype == "result":
            return await self._case_finished(exe, msg.get("result") or {}, now)
        elif mtype == "poisoned":
            exe.poisoned = str(msg.get("reason", ""))
            log.warning("executor %s: CUDA context poisoned: %s", exe.pid, exe.poisoned)
        elif mtype == "group_error":
            self._report_remaining(
                "error", f"the group could not run: {msg.get('error')}", now - self.t0
            )
            return True
        elif mtype == "group_done":
            self._report_remaining("error", "the engine returned no result for this case")
            return True
        return False

    def _case_started(self, cid: str, now: float) -> None:
        """A case begins: its timeout runs from now."""
        impl = cid.rsplit(":", 1)[-1]
        if cid != case_id(self.group.group_id, impl) or impl not in self.remaining:
            log.warning("executor %s started %r, not a case of this group", self.attempt, cid)
            return
        self.current = impl
        self.sup.current_case = cid
        self._restart_clock(now)
        self.run.sink.started(cid, self.group.group_id, self.current, self.attempt)

    async def _case_finished(self, exe: ExecutorProcess, raw: dict[str, Any], now: float) -> bool:
        """The engine's result of the running case. True when the attempt ends here: the run
        stops and impls are left (the executor is killed rather than left to run them)."""
        try:
            res = CaseResult.model_validate(raw)
        except ValueError as exc:
            log.warning("an executor sent a result that is not one: %s", exc)
            return False
        if res.group_id != self.group.group_id or res.impl not in self.remaining:
            # only this group's open cases are the executor's to report (a sandboxed one can
            # send anything)
            log.warning("an executor sent a result for %r, not an open case", res.case_id)
            return False
        res.case_id = case_id(self.group.group_id, res.impl)
        if res.worker is None:
            res.worker = self.sup.worker_id
        self._report(res)
        self.current = self.sup.current_case = None
        self._restart_clock(now)
        if self.remaining and self.sup.stop_reason(self.run) is not None:
            await self.sup.lose_executor(exe, kill=True)
            return True
        return False

    # ----------------------------------------------------------------------------- results

    def _restart_clock(self, now: float) -> None:
        self.started_at, self.deadline = now, now + self.timeout

    def _report(self, res: CaseResult) -> None:
        self.run.sink.result(res)
        self.n_results += 1
        if res.impl in self.remaining:
            self.remaining.remove(res.impl)

    def _report_synthetic(
        self, impl: str, status: Status, message: str, duration_s: float = 0.0
    ) -> None:
        """Report a result the engine could not produce (crash, timeout, group failure)."""
        sup = self.sup
        self._report(
            case_result(
                self.group,
                impl,
                status,
                message,
                duration_s=duration_s,
                worker=sup.worker_id,
                device=sup.info.get("device", sup.device),
                environment=sup.environment,
            )
        )

    def _report_remaining(self, status: Status, message: str, duration_s: float = 0.0) -> None:
        for impl in list(self.remaining):
            self._report_synthetic(impl, status, message, duration_s)
