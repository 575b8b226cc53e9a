"""The trusted executor's side of code a job brings: a sandboxed impl runner and its proxies.

The executor of a group with artifacts is trusted (it makes the inputs and the float64
reference, runs the built-in impls and judges every output). It starts the impl runner
(kassay.worker.impl_runner) inside the sandbox (kassay.worker.sandbox), which loads the
artifacts; each artifact impl the runner reports is registered here as a proxy (kind
`artifact`, `Impl.remote`), so the engine asks the runner for that impl's outputs, timing and
memory and judges what comes back. Only JSON (kassay.worker.channel) and raw tensors
cross: nothing the runner sends is executed or unpickled
here, and nothing it does can reach this process's engine, registry or torch.

Tensors cross by CUDA IPC on a GPU worker and through shared-memory files on a CPU one
(kassay.worker.tensor_exchange); a GPU worker whose runner cannot map IPC memory (a driver or
container that refuses it) falls back to files, says so on stderr (the worker's log) and goes on.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from typing import Any

import torch

from kassay.impls.registry import Impl, RemoteRun, register
from kassay.worker import cuda_ipc
from kassay.worker.channel import Channel, ProtocolError
from kassay.worker.tensor_exchange import (
    TRANSPORT_ERRORS,
    CudaIpcExchange,
    Exchange,
    FileExchange,
)

#: outputs may take this many times the inputs' bytes (plus OUTPUT_SLACK): flce's gradients
#: are as large as its inputs, lse_merge's outputs smaller
OUTPUT_FACTOR = 8
OUTPUT_SLACK = 64 << 20


class RunnerGone(RuntimeError):
    """The impl runner died or broke the protocol: the case is an error of the job's code."""


class RemoteImpls:
    """One sandboxed impl runner and the proxies of its impls."""

    def __init__(
        self, device: torch.device, workdir: str, sandbox_json: str, artifact_paths: list[str]
    ) -> None:
        self.device = device
        self.workdir = workdir
        config = json.loads(sandbox_json)
        # the runner reads its artifacts and nothing of the service (kassay.worker.sandbox)
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
            "kassay.worker.sandbox",
            "--config",
            sandbox_json,
            "--",
            sys.executable,
            "-m",
            "kassay.worker.impl_runner",
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
        self._n = 0
        try:
            hello = self._start()
        except (RunnerGone, OSError) as exc:
            # the artifacts' code broke at import: their impls are missing (a group naming one
            # says why), the built-ins beside them still run
            self.errors = [f"the artifacts' impl runner did not start: {exc}"]
            return
        self.errors = [str(e)[:2000] for e in hello.get("artifact_errors") or []][:64]
        for item in hello.get("impls") or []:
            op, name = str(item.get("op", "")), str(item.get("name", ""))
            impl = Impl(
                op,
                name,
                _not_here,
                str(item.get("description", ""))[:500],
                kind="artifact",
                nondeterministic=bool(item.get("nondeterministic")),
                remote=self._caller(op, name),
            )
            try:
                register(impl, replace=False)
            except ValueError as exc:  # a name already taken here (the runner refuses it too)
                self.errors.append(str(exc))
                continue
            self.impls.append(impl)

    def _start(self) -> dict[str, Any]:
        """Start the runner; its hello (the impls it loaded)."""
        # stderr is the executor's: the supervisor forwards it to the worker's log
        self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.chan = Channel(self.proc.stdout, self.proc.stdin)  # type: ignore[arg-type]
        self.alive = True
        hello = self._recv()
        if hello.get("type") != "ready":
            raise RunnerGone(f"the impl runner did not start: {hello.get('error', hello)}")
        return hello

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
            return RemoteRun(error=str(exc), crashed=True)

    def kill(self) -> None:
        self.alive = False
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=5)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.chan.send({"type": "exit"})
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
        self.exchange.close()


def _not_here(_inputs: Any, _params: Any) -> Any:
    raise RuntimeError("an artifact impl runs only in its sandbox (Impl.remote)")
