"""The executor: the child process that owns the device and runs input groups through the engine.

    python -m kassay.worker.executor.main --device cpu [--enable-test-impls] [--ceilings JSON]

The supervisor (kassay.worker.server.supervisor) starts one per device and talks to it over the child's
stdin/stdout with length-prefixed JSON objects (see `Channel`; JSON, not pickle: the worker
must be able to read what a sandboxed executor sends without running any of it); on start-up
the child moves the protocol off fds 0/1 and points fd 1 at stderr, so whatever an impl prints
cannot corrupt it.

A group that names artifacts comes with its run's runner lease (kassay.worker.server.runner_leases:
the artifacts' unpacked folders, the sandbox's config): the executor never loads them; it
starts one impl runner inside the sandbox for the run (kassay.worker.executor.remote_impls), on the
first group that needs it, and keeps it for the run's later groups; the runner loads the
artifacts and computes their outputs, which this executor judges. The runner ends with the
run's last group (`end_runners`) or when the supervisor says so (`end_runner`: a cancelled
run), and with this process.

Messages, supervisor -> executor:
    {"type": "run", "group": GroupSpec dump, "include_mutants": bool,
     "runner": {"key", "artifacts": {digest: folder}, "sandbox": SandboxConfig JSON} | absent,
     "end_runners": [key, ...] (after this group) | absent}
    {"type": "end_runner", "key": str}
    {"type": "exit"}
executor -> supervisor:
    {"type": "ready", "info": {...}}             once, after imports and device set-up
    {"type": "fatal", "error": str}              start-up failed (then exits 2)
    {"type": "runner_starting"} | {"type": "runner_ready", "ok", "seconds"}   around an impl
                                          runner's start (ok: it started; seconds it took)
    {"type": "started", "case_id": str}          before each case
    {"type": "result", "result": CaseResult dump}
    {"type": "poisoned", "reason": str}          the CUDA context is unusable (then exits 3)
    {"type": "group_done"} | {"type": "group_error", "error": str}

A segfault, a hang or os._exit in an impl takes only this process down; the supervisor notices
(EOF or its timeout), reports the case, and starts a fresh executor.

Only the standard library is imported at module level: on the CPU TRITON_INTERPRET must be set
before torch or triton is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
import traceback
from typing import Any

from kassay.worker.frames import Channel

POISONED_EXIT_CODE = 3
FATAL_EXIT_CODE = 2
# Substrings of errors after which a CUDA context cannot be trusted (sticky errors).
_CUDA_POISON = (
    "CUDA error",
    "illegal memory access",
    "device-side assert",
    "AcceleratorError",
    "CUBLAS_STATUS_EXECUTION_FAILED",
    "unspecified launch failure",
)


def wants_interpreter(device: str) -> bool:
    """Whether Triton must run under its interpreter for this device name."""
    return device == "cpu" or (device == "auto" and shutil.which("nvidia-smi") is None)


# ------------------------------------------------------------------------------ device info


def _memory(device: Any) -> tuple[int, int]:
    import torch

    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(total), int(free)
    page = os.sysconf("SC_PAGE_SIZE")
    return page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES")


def _minimal_params(op: Any, dtype: str | None) -> Any:
    """The smallest valid params of `op` in `dtype` (required ints set to 2)."""
    raw: dict[str, Any] = {}
    for name, field in op.params_model.model_fields.items():
        if field.is_required():
            raw[name] = 2
    if dtype is not None:
        raw["dtype"] = dtype
    return op.parse_params(raw)


def _dtypes(op: Any) -> list[str]:
    from typing import get_args

    field = op.params_model.model_fields.get("dtype")
    return [str(a) for a in get_args(field.annotation)] if field is not None else []


def describe_ops(device: Any, *, include_testing: bool) -> list[dict[str, Any]]:
    """Ops and impls with what each supports on `device`: the impl's supports() on the minimal
    params of every dtype (cheap; params-dependent limits beyond that are not known here)."""
    from kassay.impls import list_impls
    from kassay.ops import all_ops

    ops = []
    for op in all_ops():
        dtypes = _dtypes(op)
        impls = []
        for impl in list_impls(op.name, include_mutants=True, include_testing=include_testing):
            support = []
            choices: list[str | None] = list(dtypes) or [None]
            for dt in choices:
                try:
                    reason = impl.supports(_minimal_params(op, dt), device)
                except Exception as exc:  # a predicate that raises says "not known"
                    reason = f"supports() raised {type(exc).__name__}: {exc}"
                support.append({"dtype": dt or "", "supported": not reason, "reason": reason or ""})
            impls.append(
                {
                    "name": impl.name,
                    "kind": impl.kind,
                    "description": impl.description,
                    "bug": impl.bug,
                    "is_baseline": impl.name == "torch",
                    "device_supported": any(s["supported"] for s in support),
                    "dtypes": support,
                }
            )
        ops.append(
            {
                "name": op.name,
                "description": op.description,
                "regimes": list(op.regimes),
                "dtypes": dtypes,
                "impls": impls,
            }
        )
    return ops


# ------------------------------------------------------------------------------------- main


class Executor:
    """The child's state: the resolved device and the engine entry point."""

    def __init__(
        self,
        chan: Channel,
        device_name: str,
        *,
        testing: bool,
        ceilings: dict[str, float] | None,
        worker_id: str | None,
    ) -> None:
        import torch

        from kassay.impls import load_with_corpora
        from kassay.validate import engine
        from kassay.validate.ceilings import measure_ceilings
        from kassay.validate.env import environment, resolve_device

        self.chan = chan
        self.torch = torch
        self.engine = engine
        self.testing = testing
        self.worker_id = worker_id
        self.device = resolve_device(device_name)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        load_with_corpora(testing=testing)
        #: the impl runners of the runs with artifacts, by lease key (kassay.worker.executor.remote_impls)
        self.runners: dict[str, Any] = {}
        # Measured once per worker: a restarted executor reuses its predecessor's figures so a
        # restart stays well under the 10 s budget.
        if ceilings is None:
            ceilings = measure_ceilings(self.device)
        self.ceilings = ceilings
        env = environment(self.device).model_copy(update={"ceilings": ceilings})
        self.env = env
        total, free = _memory(self.device)
        self.info = {
            "pid": os.getpid(),
            "device": str(self.device),
            "device_name": env.device_name,
            "memory_total_bytes": total,
            "memory_free_bytes": free,
            "environment": env.model_dump(),
            "ceilings": ceilings,
            "ops": describe_ops(self.device, include_testing=testing),
        }

    def _poisoned(self, message: str) -> str | None:
        if self.device.type != "cuda":
            return None
        try:
            self.torch.cuda.synchronize(self.device)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        if any(p in message for p in _CUDA_POISON):
            return message
        return None

    def _runner(self, lease: dict[str, Any]) -> Any:
        """The impl runner of a run's lease, started on first use."""
        key = str(lease["key"])
        if key not in self.runners:
            from kassay.worker.executor.remote_impls import RemoteImpls

            # its start (Python, torch, the artifacts' imports) runs on the start-up clock,
            # not on a case's
            self.chan.send({"type": "runner_starting"})
            t0 = time.perf_counter()

            config = str(lease["sandbox"])
            paths = {str(d): str(p) for d, p in dict(lease["artifacts"]).items()}
            self.runners[key] = RemoteImpls(
                self.device,
                str(json.loads(config)["workdir"]),
                config,
                list(paths.values()),
                label="artifacts " + ", ".join(d[:12] for d in paths),
            )
            runner = self.runners[key]
            seconds = time.perf_counter() - t0
            self.chan.send(
                {"type": "runner_ready", "ok": runner.start_error is None, "seconds": seconds}
            )
            # the worker's log says what a code job's runner cost (bench/code_jobs.py reads it)
            print(
                f"kassay: impl runner of {runner.label} "
                f"{'ready' if runner.start_error is None else 'failed'} in {seconds:.2f} s",
                file=sys.stderr,
            )
        return self.runners[key]

    def end_runner(self, key: str) -> None:
        runner = self.runners.pop(key, None)
        if runner is not None:
            runner.close()

    def run(self, msg: dict[str, Any]) -> None:
        from kassay.contract.spec import GroupSpec
        from kassay.ops.registry import scoped

        group = GroupSpec.model_validate(msg["group"])
        runner = None
        end: dict[str, Any]
        try:
            if group.artifacts:
                # the job's code runs in its own sandboxed process, never in this one
                runner = self._runner(msg["runner"])
        except (KeyError, TypeError, ValueError) as exc:
            end = {"type": "group_error", "error": f"no usable runner lease: {exc!r}"}
        else:
            with scoped(runner.impls if runner is not None else []) as refused:
                end = self._run_group(group, msg, runner, refused)
        # the run's last group: its runners are gone before the run is said to be over
        for key in msg.get("end_runners") or []:
            self.end_runner(str(key))
        self.chan.send(end)
        reason = self._poisoned(str(end.get("error", ""))) if "error" in end else None
        if reason is not None:
            self.chan.send({"type": "poisoned", "reason": reason})
            os._exit(POISONED_EXIT_CODE)

    def _run_group(
        self,
        group: Any,
        msg: dict[str, Any],
        runner: Any,
        refused: dict[tuple[str, str], str],
    ) -> dict[str, Any]:
        """Run the group's impls; the message that ends it (group_done or group_error)."""
        include_mutants = bool(msg.get("include_mutants"))
        missing = {}
        if runner is not None:
            missing = self._missing_impls(group, runner, refused, include_mutants)
            if group.baseline in missing:  # nothing can be judged without the baseline
                missing = {name: missing[group.baseline] for name in group.impls}

        def on_start(case_id: str) -> None:
            self.chan.send({"type": "started", "case_id": case_id})

        def on_result(result: Any) -> None:
            if group.artifacts and result.environment is not None:
                extra: dict[str, Any] = {"artifacts": list(group.artifacts)}
                if result.ran_in == "sandbox" and runner is not None:
                    # how its tensors crossed (kassay.worker.exchange.transports)
                    extra["tensor_transport"] = runner.exchange.name
                result.environment = result.environment.model_copy(update=extra)
            self.chan.send({"type": "result", "result": result.model_dump()})
            reason = self._poisoned(result.message if result.status == "error" else "")
            if reason is not None:
                self.chan.send({"type": "poisoned", "reason": reason})
                os._exit(POISONED_EXIT_CODE)

        if missing:
            from kassay.validate.case_result import case_result

            env = self.env.model_copy(update={"artifacts": list(group.artifacts)})
            for name, why in missing.items():
                on_result(
                    case_result(
                        group,
                        name,
                        "error",
                        why,
                        worker=self.worker_id,
                        device=str(self.device),
                        environment=env,
                    )
                )
        rest = [n for n in group.impls if n not in missing]
        if not rest:
            return {"type": "group_done"}
        try:
            self.engine.run_group(
                group.model_copy(update={"impls": rest}),
                device=self.device,
                include_mutants=include_mutants,
                include_testing=self.testing,
                on_start=on_start,
                on_result=on_result,
                worker=self.worker_id,
                ceilings=self.ceilings,
            )
        except Exception as exc:  # the group cannot run at all (inputs, reference, ...)
            tb = traceback.format_exc(limit=-3)
            return {"type": "group_error", "error": f"{type(exc).__name__}: {exc}", "traceback": tb}
        return {"type": "group_done"}

    def _missing_impls(
        self,
        group: Any,
        runner: Any,
        refused: dict[tuple[str, str], str],
        include_mutants: bool,
    ) -> dict[str, str]:
        """{impl: why} for the impls (and the baseline) a group with artifacts names that
        neither this worker nor the artifacts provide: each fails alone, saying why in the
        words of the artifacts' own error."""
        from kassay.impls import list_impls

        found = [
            i.name
            for i in list_impls(
                group.op, include_mutants=include_mutants, include_testing=self.testing
            )
        ]
        missing: dict[str, str] = {}
        for name in dict.fromkeys([*group.impls, group.baseline]):
            if name in found and (group.op, name) not in refused:
                continue
            if (group.op, name) in refused:
                why = f"impl {name!r} of {runner.label} not loaded: {refused[(group.op, name)]}"
            elif runner.start_error is not None:
                why = (
                    f"impl {name!r} not available: the impl runner of {runner.label} did not "
                    f"start: {runner.start_error}"
                )
            else:
                why = (
                    f"unknown impl {name!r} for op {group.op!r} after loading {runner.label}"
                    + (f": not loaded: {'; '.join(runner.errors)}" if runner.errors else "")
                    + f"; impls found: {', '.join(found) or '(none)'}"
                )
            missing[name] = why[:4000]
        return missing


def load_artifacts(paths: list[str]) -> list[str]:
    """Put the artifacts' folders first on sys.path and register the impls of their
    `kassay.impls` entry points (kind `artifact`). An impl may not take the name of one that
    is already registered (a built-in, a plugin). Returns what failed to load, as messages."""
    import sys
    from importlib import metadata

    from kassay.ops.registry import Impl, list_impls, register

    errors: list[str] = []
    taken = {(i.op, i.name) for i in list_impls(include_mutants=True, include_testing=True)}
    for path in reversed(paths):
        sys.path.insert(0, path)
    for path in paths:
        for dist in metadata.distributions(path=[path]):
            for ep in dist.entry_points.select(group="kassay.impls"):
                where = f"{dist.metadata['Name']}: entry point {ep.name} = {ep.value}"
                try:
                    obj = ep.load()
                    made = obj() if callable(obj) and not isinstance(obj, Impl) else obj
                    items = [made] if isinstance(made, Impl) else list(made or [])
                except Exception as exc:
                    errors.append(f"{where}: {type(exc).__name__}: {exc}")
                    continue
                for impl in items:
                    if not isinstance(impl, Impl):
                        errors.append(f"{where}: returned {type(impl).__name__}, not an Impl")
                    elif (impl.op, impl.name) in taken:
                        errors.append(
                            f"{where}: impl {impl.name!r} of op {impl.op!r} is already taken "
                            "(a built-in or plugin of this worker); rename it"
                        )
                    else:
                        register(_as_artifact(impl), replace=True)
                        taken.add((impl.op, impl.name))
    for err in errors:
        print(f"kassay executor: artifact impl not loaded: {err}", file=sys.stderr)
    return errors


def _as_artifact(impl: Any) -> Any:
    from dataclasses import replace

    return replace(impl, kind="artifact")


def _die_with_parent(*, check_parent: bool = True) -> None:
    """Linux: SIGKILL this process when the worker dies, even mid-case (no orphaned hangs).
    `check_parent`: exit at once if already orphaned (in a sandbox the parent is PID 1 of its
    namespace, which is no orphan)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if check_parent and os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(FATAL_EXIT_CODE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kassay.worker.executor.main")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--enable-test-impls", action="store_true")
    parser.add_argument("--ceilings", default=None, help="JSON of already measured ceilings")
    parser.add_argument("--worker-id", default=None)
    args = parser.parse_args(argv)
    _die_with_parent()
    if wants_interpreter(args.device):
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
    chan = Channel.from_stdio()
    import faulthandler

    faulthandler.enable()  # a segfault leaves a Python traceback on stderr for the supervisor
    try:
        ex = Executor(
            chan,
            args.device,
            testing=args.enable_test_impls,
            ceilings=json.loads(args.ceilings) if args.ceilings else None,
            worker_id=args.worker_id,
        )
    except Exception as exc:
        traceback.print_exc()
        chan.send({"type": "fatal", "error": f"{type(exc).__name__}: {exc}"})
        return FATAL_EXIT_CODE
    chan.send({"type": "ready", "info": ex.info})
    while True:
        msg = chan.recv()
        if msg is None or msg.get("type") == "exit":
            for key in list(ex.runners):
                ex.end_runner(key)
            return 0
        if msg.get("type") == "run":
            ex.run(msg)
        elif msg.get("type") == "end_runner":
            ex.end_runner(str(msg.get("key")))


if __name__ == "__main__":
    sys.exit(main())
