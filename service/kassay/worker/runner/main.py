"""The impl runner: the only process that runs the code a job brings (its artifacts).

    python -m kassay.worker.runner.sandbox --config JSON -- \\
        PYTHON -m kassay.worker.runner.main --device cpu --workdir DIR [--exchange DIR] \\
        --artifact-path DIR ...

Started inside the sandbox (kassay.worker.runner.sandbox) by the trusted executor of a group with
artifacts (kassay.worker.executor.remote_impls), it loads the artifacts' impls and computes, on request,
one impl's outputs from inputs the executor lends it (kassay.worker.exchange.transports: CUDA IPC
on a GPU, shared-memory files on a CPU). It never sees the float64 reference, the built-in impls' results or any verdict: those stay in
the executor, which judges copies of the outputs it takes back. Whatever the
code does at import or run time (patching the engine, the registry, torch) stays in this
process.

It also times the call here (the engine's timing loop: device time on CUDA) and measures its
peak memory: figures from the sandbox, labelled so in every report.

Messages over stdin/stdout (kassay.worker.frames), executor -> runner:
    {"type": "call", "op", "impl", "params": dict, "transport": "files" | "cuda-ipc",
     "inputs": {name: header}, "timing": TimingPolicy dump | null, "capture_key": str}
    {"type": "exit"}
runner -> executor:
    {"type": "ready", "impls": [{"op", "name", "description", "nondeterministic"}],
     "artifact_errors": [str]}
    {"type": "outputs", "outputs": {name: header}, "second": {name: header} | null,
     "timing": TimingStats dump | null, "timing_error": str, "peak_bytes": int | null,
     "ms": float}
    {"type": "error", "error": str}           the impl raised
    {"type": "transport", "error": str}       the inputs cannot be mapped (then files)
    {"type": "fatal", "error": str}           start-up failed
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from typing import Any

from kassay.worker.executor.main import (
    FATAL_EXIT_CODE,
    _die_with_parent,
    load_artifacts,
    wants_interpreter,
)
from kassay.worker.frames import Channel


class Runner:
    def __init__(self, device: str, workdir: str, exchange: str, artifact_paths: list[str]) -> None:
        import torch

        from kassay.impls import list_impls, load
        from kassay.validate.env import resolve_device

        self.torch = torch
        self.device = resolve_device(device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.workdir = workdir
        self.exchange_root = exchange or workdir
        self.exchanges: dict[str, Any] = {}
        load()
        self.errors = load_artifacts(artifact_paths)
        self.impls = {(i.op, i.name): i for i in list_impls() if i.kind == "artifact"}
        self.calls = 0

    def ready(self) -> dict[str, Any]:
        return {
            "type": "ready",
            "impls": [
                {
                    "op": i.op,
                    "name": i.name,
                    "description": i.description,
                    "nondeterministic": i.nondeterministic,
                }
                for i in self.impls.values()
            ],
            "artifact_errors": self.errors,
        }

    def _exchange(self, transport: str) -> Any:
        from kassay.worker.exchange.transports import CudaIpcExchange, FileExchange

        if transport not in self.exchanges:
            if transport == "cuda-ipc":
                self.exchanges[transport] = CudaIpcExchange(self.device)
            elif transport == "files":
                self.exchanges[transport] = FileExchange(self.exchange_root, self.device)
            else:
                raise ValueError(f"unknown tensor transport {transport!r}")
        return self.exchanges[transport]

    def release(self) -> None:
        """The executor has taken (copied) what the last call lent it."""
        for ex in self.exchanges.values():
            ex.release_lent()

    def call(self, msg: dict[str, Any]) -> dict[str, Any]:
        from kassay.ops import get_op
        from kassay.worker.exchange.transports import TRANSPORT_ERRORS

        impl = self.impls[(msg["op"], msg["impl"])]
        params = get_op(msg["op"]).parse_params(msg["params"])
        ex = self._exchange(str(msg.get("transport", "files")))
        try:
            inputs = ex.take_views(msg["inputs"])
        except TRANSPORT_ERRORS as exc:
            if ex.name == "files":
                raise
            return {"type": "transport", "error": str(exc)}
        try:
            return self._run(impl, params, inputs, ex, msg)
        finally:
            ex.drop_views()  # the executor frees what it lent once this call is answered

    def _run(self, impl: Any, params: Any, inputs: Any, ex: Any, msg: dict[str, Any]) -> Any:
        from kassay.contract.spec import TimingPolicy
        from kassay.validate import interpreter
        from kassay.validate.timing import time_call

        torch = self.torch
        self.calls += 1
        reason = impl.supports(params, self.device)
        if reason:
            return {"type": "unsupported", "reason": reason}
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0
        launched = interpreter.launches()
        t0 = time.perf_counter()
        try:
            outs = impl.run(inputs, params)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        except Exception as exc:  # the impl's failure is its result
            return {
                "type": "error",
                "error": f"{type(exc).__name__}: {exc}{interpreter.where(exc)}",
            }
        ms = (time.perf_counter() - t0) * 1e3
        interpreted = interpreter.launches() - launched
        peak = (
            torch.cuda.max_memory_allocated(self.device) - before
            if self.device.type == "cuda"
            else None
        )
        second: list[dict[str, Any]] = []
        timing = None
        timing_error = ""
        if msg.get("timing") is not None:

            def timed() -> dict[str, Any]:
                res = impl.run(inputs, params)
                if not second:
                    second.append(res)
                return res

            try:
                timing = time_call(
                    timed,
                    self.device,
                    TimingPolicy.model_validate(msg["timing"]),
                    capture_key=str(msg.get("capture_key", "")),
                    ran_ms=ms,
                )
            except Exception as exc:
                timing_error = f"raised while timing: {type(exc).__name__}: {exc}"
        else:
            try:
                second.append(impl.run(inputs, params))
            except Exception as exc:
                timing_error = f"raised on a second run: {type(exc).__name__}: {exc}"
        tag = f"c{self.calls}"
        out_headers = ex.lend(_tensors(outs), f"{tag}-out")
        again = ex.lend(_tensors(second[0]), f"{tag}-again") if second else None
        return {
            "type": "outputs",
            "outputs": out_headers,
            "second": again,
            "timing": timing.model_dump() if timing is not None else None,
            "timing_error": timing_error,
            "peak_bytes": peak,
            "ms": ms,
            "interpreted": interpreted,
        }


def _tensors(outs: Any) -> dict[str, Any]:
    import torch

    if not isinstance(outs, dict):
        raise TypeError(f"the impl returned {type(outs).__name__}, not a dict of tensors")
    return {k: v for k, v in outs.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kassay.worker.runner.main")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--exchange", default="")
    parser.add_argument("--artifact-path", action="append", default=[])
    args = parser.parse_args(argv)
    _die_with_parent(check_parent=False)
    if wants_interpreter(args.device):
        os.environ["TRITON_INTERPRET"] = "1"
    chan = Channel.from_stdio()
    try:
        runner = Runner(args.device, args.workdir, args.exchange, args.artifact_path)
    except Exception as exc:
        traceback.print_exc()
        chan.send({"type": "fatal", "error": f"{type(exc).__name__}: {exc}"})
        return FATAL_EXIT_CODE
    chan.send(runner.ready())
    while True:
        msg = chan.recv()
        runner.release()
        if msg is None or msg.get("type") == "exit":
            return 0
        if msg.get("type") == "call":
            try:
                chan.send(runner.call(msg))
            except Exception as exc:  # outputs that cannot be written, a bad request
                traceback.print_exc()
                chan.send({"type": "error", "error": f"{type(exc).__name__}: {exc}"})


if __name__ == "__main__":
    sys.exit(main())
