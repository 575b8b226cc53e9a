"""The executor process as the supervisor holds it: start-up of `python -m kassay.worker.executor.main`
on a device, the framed messages over its pipes (length-prefixed JSON, see
kassay.worker.frames), its stderr (forwarded, and its last lines kept for crash
reports), and its end (asked to exit, or killed with everything it started).

A message that breaks the protocol (not JSON, too large) counts as the executor's death: it is
killed and the running case reported `crashed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from collections import deque
from typing import Any

from kassay.contract.spec import GroupSpec
from kassay.worker.executor.main import wants_interpreter
from kassay.worker.frames import Channel, ProtocolError

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
    """One `python -m kassay.worker.executor.main` child and its protocol pipes."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self.poisoned: str | None = None
        self.pending: asyncio.Future[dict[str, Any] | None] | None = None  # the read under way
        self.protocol_error: str | None = None
        self._stderr_task = asyncio.ensure_future(self._pump_stderr())

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    @classmethod
    async def spawn(
        cls,
        *,
        device: str,
        testing: bool,
        ceilings: dict[str, float] | None,
        worker_id: str,
    ) -> ExecutorProcess:
        """Start an executor."""
        args = [
            sys.executable,
            "-m",
            "kassay.worker.executor.main",
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
        else:
            # Segments that grow and shrink page by page: a small long-lived allocation does not
            # pin a whole multi-GiB segment, so empty_cache() returns what a group left behind
            env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
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
            body = await self.proc.stdout.readexactly(Channel.frame_size(head))
            return Channel.decode(body)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        except ProtocolError as exc:  # a broken (or hostile) executor: it is done for
            self.protocol_error = str(exc)
            self.stderr_tail.append(f"kassay: the executor broke the protocol: {exc}")
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            return None

    async def next_event(
        self, deadline: float, interrupt: asyncio.Event | None
    ) -> tuple[str, dict[str, Any] | None]:
        """What comes first before `deadline` (time.monotonic()): ('msg', m) for a message,
        ('eof', None) when the pipe closed, ('interrupt', None) when `interrupt` is set (None:
        not interruptible), ('timeout', None)."""
        # One read at a time, never cancelled: a frame is read whole or not at all.
        if self.pending is None:
            self.pending = asyncio.ensure_future(self.recv())
        recv = self.pending
        waits: set[asyncio.Future[Any]] = {recv}
        intr: asyncio.Future[Any] | None = None
        if interrupt is not None:
            intr = asyncio.ensure_future(interrupt.wait())
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
            self.pending = None
            msg = recv.result()
            return ("eof", None) if msg is None else ("msg", msg)
        return ("interrupt", None) if done else ("timeout", None)

    def send(self, msg: dict[str, Any]) -> bool:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(Channel.encode(msg))
        except (BrokenPipeError, ConnectionError, RuntimeError):
            return False
        return True

    def send_run(
        self,
        group: GroupSpec,
        *,
        include_mutants: bool,
        runner: dict[str, Any] | None = None,
        end_runners: list[str] | None = None,
    ) -> bool:
        """Ask the executor to run `group` (with its run's runner lease, for a group with
        artifacts, and the runners to end after it); False when its pipe is closed."""
        msg: dict[str, Any] = {
            "type": "run",
            "group": group.model_dump(),
            "include_mutants": include_mutants,
        }
        if runner is not None:
            msg["runner"] = runner
        if end_runners:
            msg["end_runners"] = end_runners
        return self.send(msg)

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
