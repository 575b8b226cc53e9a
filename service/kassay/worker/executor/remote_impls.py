"""The trusted executor's side of code a job brings: a sandboxed impl runner and its proxies.

The device's executor is trusted (it makes the inputs and the float64 reference, runs the
built-in impls and judges every output). For a run (a job's share of this worker) that brings
artifacts it starts one impl runner (kassay.worker.runner.main) inside the sandbox
(kassay.worker.runner.sandbox), which loads the artifacts and serves every group of that run; each
artifact impl the runner reports becomes a proxy (kind `artifact`, `Impl.remote`), registered
for the length of one group (kassay.ops.registry.scoped), so the engine asks the runner for
that impl's outputs, timing and memory and judges what comes back. Only JSON (kassay.worker.frames) and raw tensors
cross: nothing the runner sends is executed or unpickled
here, and nothing it does can reach this process's engine, registry or torch.

Tensors cross by CUDA IPC on a GPU worker and through shared-memory files on a CPU one
(kassay.worker.exchange.transports); a GPU worker whose runner cannot map IPC memory (a driver or
container that refuses it) falls back to files, says so on stderr (the worker's log) and goes on.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections import deque
from typing import Any

import torch

from kassay.ops.registry import Impl, RemoteRun
from kassay.worker.exchange import cuda_ipc
from kassay.worker.exchange.transports import (
    TRANSPORT_ERRORS,
    CudaIpcExchange,
    Exchange,
    FileExchange,
)
from kassay.worker.frames import Channel, ProtocolError

#: outputs may take this many times the inputs' bytes (plus OUTPUT_SLACK): flce's gradients
#: are as large as its inputs, lse_merge's outputs smaller
OUTPUT_FACTOR = 8
OUTPUT_SLACK = 64 << 20
#: a runner that died this many times (each a crashed case) is not started again for its run:
#: the rest of its impls' cases fail at once instead of paying a start each
MAX_RUNNER_DEATHS = 3
#: the runner's last stderr lines kept to say why it did not start
STDERR_TAIL_LINES = 60


class RunnerGone(RuntimeError):
    """The impl runner died or broke the protocol: the case is an error of the job's code."""


class RemoteImpls:
    """One sandboxed impl runner and the proxies of its impls."""

    def __init__(
        self,
        device: torch.device,
        workdir: str,
        sandbox_json: str,
        artifact_paths: list[str],
        *,
        label: str = "",
    ) -> None:
        self.device = device
        self.workdir = workdir
        #: how messages name this runner's code ("artifacts 0123abcd4567, ...")
        self.label = label or "the job's artifacts"
        config = json.loads(sandbox_json)
        # the runner reads its artifacts and nothing of the service (kassay.worker.runner.sandbox)
        config["readable"] = [*config.get("readable", []), *artifact_paths]
        # tensor files go to the folder the worker made writable for them (/dev/shm), if any
        self.files = FileExchange(next(iter(config.get("writable") or []), workdir), device)
        self.exchange: Exchange = self.files
        if device.type == "cuda":
            why = cuda_ipc.available(device)
            if why:
                print(
                    f"kassay: CUDA IPC unavailable ({why}); tensor files instead", file=sys.stderr
                )
            else:
                self.exchange = CudaIpcExchange(device)
        sandbox_json = json.dumps(config)
        self.args = [
            sys.executable,
            "-m",
            "kassay.worker.runner.sandbox",
            "--config",
            sandbox_json,
            "--",
            sys.executable,
            "-m",
            "kassay.worker.runner.main",
            "--device",
            str(device),
            "--workdir",
            workdir,
            "--exchange",
            self.files.root,
        ]
        for path in artifact_paths:
            self.args += ["--artifact-path", path]
        self.impls: list[Impl] = []
        self.errors: list[str] = []
        #: why the runner could not start (then it has no impls), else None
        self.start_error: str | None = None
        self.deaths = 0
        self._n = 0
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self.alive = False
        try:
            hello = self._start()
        except (RunnerGone, OSError) as exc:
            # the artifacts' code broke at import: their impls are missing (a group naming one
            # says why), the built-ins beside them still run
            self.start_error = self._why_not_started(exc)
            self.kill()
            return
        self.errors = [_short_paths(str(e))[:2000] for e in hello.get("artifact_errors") or []]
        self.errors = self.errors[:64]
        for item in hello.get("impls") or []:
            op, name = str(item.get("op", ""))[:100], str(item.get("name", ""))[:100]
            self.impls.append(
                Impl(
                    op,
                    name,
                    _not_here,
                    str(item.get("description", ""))[:500],
                    kind="artifact",
                    nondeterministic=bool(item.get("nondeterministic")),
                    remote=self._caller(op, name),
                )
            )

    def _why_not_started(self, exc: BaseException) -> str:
        """The runner's own first error (its stderr's exception line), else how it ended."""
        self._drain_stderr()
        first = exception_line(list(self.stderr_tail))
        how = str(exc).removeprefix("the impl runner did not start: ")
        return f"{first} ({how})" if first and first not in how else how

    def _start(self) -> dict[str, Any]:
        """Start the runner; its hello (the impls it loaded)."""
        self.proc = subprocess.Popen(
            self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        # its stderr goes on to the executor's (the supervisor forwards that to the worker's
        # log); its last lines stay here, to say why it did not start
        self.stderr_tail.clear()
        self._stderr = threading.Thread(
            target=self._pump_stderr, args=(self.proc.stderr,), daemon=True
        )
        self._stderr.start()
        self.chan = Channel(self.proc.stdout, self.proc.stdin)  # type: ignore[arg-type]
        self.alive = True
        hello = self._recv()
        if hello.get("type") != "ready":
            raise RunnerGone(f"the impl runner did not start: {hello.get('error', hello)}")
        return hello

    def _pump_stderr(self, stream: Any) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")[:2000]
            self.stderr_tail.append(line)
            with contextlib.suppress(Exception):
                sys.stderr.write(f"[impl runner] {line}\n")
                sys.stderr.flush()

    def _drain_stderr(self) -> None:
        thread = getattr(self, "_stderr", None)
        if thread is not None:
            thread.join(timeout=2.0)

    def _recv(self) -> dict[str, Any]:
        try:
            msg = self.chan.recv()
        except ProtocolError as exc:
            self.kill()
            raise RunnerGone(f"the impl runner broke the protocol: {exc}") from None
        if msg is None:
            self.alive = False
            code = self.proc.wait()
            how = f"exited with code {code}"
            if code < 0:
                with contextlib.suppress(ValueError):
                    how = f"killed by {signal.Signals(-code).name}"
            raise RunnerGone(f"the impl runner (the job's code) {how}")
        return msg

    def _caller(self, op: str, name: str) -> Any:
        def call(
            inputs: dict[str, torch.Tensor],
            params: Any,
            timing: dict[str, Any] | None,
            capture_key: str,
        ) -> RemoteRun:
            return self.call(op, name, inputs, params, timing, capture_key)

        return call

    def _ask(
        self,
        op: str,
        name: str,
        inputs: dict[str, torch.Tensor],
        params: Any,
        timing: dict[str, Any] | None,
        capture_key: str,
    ) -> dict[str, Any]:
        """Lend fresh copies of the inputs (what an impl writes into them stays with it), ask
        for one call, and take the inputs back once the runner answered."""
        self._n += 1
        try:
            headers = self.exchange.lend(inputs, f"in{self._n}")
            self.chan.send(
                {
                    "type": "call",
                    "op": op,
                    "impl": name,
                    "params": params.model_dump(),
                    "transport": self.exchange.name,
                    "inputs": headers,
                    "timing": timing,
                    "capture_key": capture_key,
                }
            )
            return self._recv()
        finally:
            self.exchange.release_lent()

    def call(
        self,
        op: str,
        name: str,
        inputs: dict[str, torch.Tensor],
        params: Any,
        timing: dict[str, Any] | None,
        capture_key: str,
    ) -> RemoteRun:
        """One case of impl `name`; a runner that died (a crash of the job's code) is reported
        as crashed and started afresh for the next case."""
        try:
            if not self.alive:
                if self.deaths >= MAX_RUNNER_DEATHS:
                    return RemoteRun(
                        error=f"the impl runner of {self.label} died {self.deaths} times in "
                        "this job and is not started again",
                        crashed=True,
                    )
                self._start()
            msg = self._ask(op, name, inputs, params, timing, capture_key)
            if msg.get("type") == "transport" and self.exchange is not self.files:
                # the runner cannot map what this side lends: files from now on
                print(
                    f"kassay: the impl runner refused CUDA IPC ({msg.get('error')}); "
                    "tensor files instead",
                    file=sys.stderr,
                )
                self.exchange.close()
                self.exchange = self.files
                msg = self._ask(op, name, inputs, params, timing, capture_key)
            kind = msg.get("type")
            if kind == "unsupported":
                return RemoteRun(unsupported=str(msg.get("reason", ""))[:2000] or "unsupported")
            if kind != "outputs":
                return RemoteRun(error=str(msg.get("error", f"unexpected reply {kind!r}"))[:4000])
            cap = OUTPUT_FACTOR * sum(t.numel() * t.element_size() for t in inputs.values())
            cap += OUTPUT_SLACK
            try:
                outs = self.exchange.take_copies(msg.get("outputs"), cap)
                again = msg.get("second")
                second = self.exchange.take_copies(again, cap) if again is not None else None
            except TRANSPORT_ERRORS as exc:
                return RemoteRun(error=f"the sandbox handed back no usable outputs: {exc}")
            finally:
                self.exchange.forget(msg.get("outputs"))
                self.exchange.forget(msg.get("second"))
            timing_dump = msg.get("timing")
            peak = msg.get("peak_bytes")
            ms = msg.get("ms")
            interpreted = msg.get("interpreted")
            return RemoteRun(
                outputs=outs,
                second=second,
                timing=timing_dump if isinstance(timing_dump, dict) else None,
                timing_error=str(msg.get("timing_error") or "")[:2000],
                peak_bytes=peak if isinstance(peak, int) and peak >= 0 else None,
                ms=float(ms) if isinstance(ms, (int, float)) else 0.0,
                interpreted=interpreted if isinstance(interpreted, int) else 0,
            )
        except (RunnerGone, OSError) as exc:
            self.kill()
            self.deaths += 1
            return RemoteRun(error=str(exc), crashed=True)

    def kill(self) -> None:
        self.alive = False
        proc = getattr(self, "proc", None)
        if proc is None:
            return
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(Exception):
            proc.wait(timeout=5)

    def close(self) -> None:
        """End the runner (asked to exit; killed after 5 s) and its tensor exchange."""
        proc = getattr(self, "proc", None)
        if proc is not None and self.alive:
            with contextlib.suppress(Exception):
                self.chan.send({"type": "exit"})
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        self.kill()
        self.exchange.close()
        if self.files is not self.exchange:
            self.files.close()


_TRACEBACK = "Traceback (most recent call last):"
_PATH = re.compile(r"/[^\s'\",:()\[\]]+")


def exception_line(lines: list[str], limit: int = 500) -> str:
    """The first error a process's stderr tells: the exception line that ends its first
    traceback (else its last line that names an error), with host paths cut to the package's
    own part (`short_path`), at most `limit` characters; '' when there is none."""
    lines = [ln.rstrip() for ln in lines if ln.strip()]
    found = ""
    for i, line in enumerate(lines):
        if line.startswith(_TRACEBACK):
            found = next((ln for ln in lines[i + 1 :] if not ln.startswith(" ")), "")
            break
    if not found:
        found = next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln), "")
    return _short_paths(found.strip())[:limit]


def _short_paths(text: str) -> str:
    return _PATH.sub(lambda m: short_path(m.group(0)), text)


def short_path(path: str) -> str:
    """A host path as the package's own part: from the top-level package folder down
    (`kassay/__init__.py`), or after site-packages; any other path keeps its last part."""
    parts = path.split("/")
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1 :]) or path
    folder = os.path.dirname(path)
    top = None
    while folder not in ("", "/") and os.path.isfile(os.path.join(folder, "__init__.py")):
        top, folder = folder, os.path.dirname(folder)
    if top is not None:
        return os.path.relpath(path, os.path.dirname(top))
    return ".../" + parts[-1] if len(parts) > 2 else path


def _not_here(_inputs: Any, _params: Any) -> Any:
    raise RuntimeError("an artifact impl runs only in its sandbox (Impl.remote)")
