"""The gRPC worker as a real process on a loopback port: `kassay worker --device cpu
--enable-test-impls`, talked to over real gRPC (Describe, health, reflection, Run, Cancel, errors
with google.rpc details, SIGTERM)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kassay.ports import free_port as _free_port

grpc = pytest.importorskip("grpc")
pytest.importorskip("grpc_health")
pytest.importorskip("grpc_reflection")
pytest.importorskip("grpc_status")

from google.rpc import error_details_pb2  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc  # noqa: E402
from grpc_status import rpc_status  # noqa: E402
from users import KASSAY, user_env  # noqa: E402

from kassay.contract.v1 import worker_pb2 as pb  # noqa: E402
from kassay.contract.v1 import worker_pb2_grpc  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
SERVICE = "kassay.v1.Worker"
#: each crash/hang restarts the executor; the next case must start within this
RESTART_BUDGET_S = 10.0
#: run the same tests against a GPU worker with KASSAY_TEST_WORKER_DEVICE=cuda
DEVICE = os.environ.get("KASSAY_TEST_WORKER_DEVICE", "cpu")


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    address: str
    log: Path
    channel: Any

    @property
    def stub(self) -> worker_pb2_grpc.WorkerStub:
        return worker_pb2_grpc.WorkerStub(self.channel)

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def _start_worker(tmp: Path) -> Worker:
    port = _free_port()
    env = user_env()
    log = tmp / "worker.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [
                *KASSAY,
                "worker",
                "--listen",
                f"127.0.0.1:{port}",
                "--device",
                DEVICE,
                "--enable-test-impls",
                "--case-timeout",
                "60",
                "--worker-id",
                "itest-worker",
            ],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp,
        )
    address = f"127.0.0.1:{port}"
    w = Worker(proc, address, log, grpc.insecure_channel(address))
    health = health_pb2_grpc.HealthStub(w.channel)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"worker exited with {proc.returncode}:\n{w.tail()}")
        try:
            resp = health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=2)
            if resp.status == health_pb2.HealthCheckResponse.SERVING:
                return w
        except grpc.RpcError:
            pass
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"worker not SERVING after 90 s:\n{w.tail()}")


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    w = _start_worker(tmp_path_factory.mktemp("worker"))
    try:
        yield w
    finally:
        w.channel.close()
        if w.proc.poll() is None:
            w.proc.terminate()
            try:
                w.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait(timeout=10)


def _group(group_id: str, impls: list[str], **params: Any) -> pb.GroupSpec:
    p = {"T": 8, "Hh": 2, "D": 4, "K": 2, "dtype": "float32", **params}
    return pb.GroupSpec(
        group_id=group_id,
        op="lse_merge",
        impls=impls,
        params_json=json.dumps(p),
        timing=pb.TimingPolicy(enabled=True, warmup=0, min_reps=2, max_reps=3, budget_s=0.2),
    )


def d_device(worker: Worker) -> str:
    return str(worker.stub.Describe(pb.DescribeRequest(), timeout=30).device)


def _collect(stream: Any) -> list[tuple[float, pb.CaseEvent]]:
    return [(time.monotonic(), ev) for ev in stream]


def _details(err: grpc.RpcError) -> tuple[Any, Any]:
    status = rpc_status.from_call(err)
    assert status is not None, "no google.rpc.Status in the trailers"
    info, bad = error_details_pb2.ErrorInfo(), error_details_pb2.BadRequest()
    found_info = found_bad = False
    for d in status.details:
        if d.Is(info.DESCRIPTOR):
            d.Unpack(info)
            found_info = True
        elif d.Is(bad.DESCRIPTOR):
            d.Unpack(bad)
            found_bad = True
    return (info if found_info else None), (bad if found_bad else None)


# ------------------------------------------------------------------------------------ tests


def test_health_and_describe(worker: Worker) -> None:
    health = health_pb2_grpc.HealthStub(worker.channel)
    for name in ("", SERVICE):
        resp = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING

    d = worker.stub.Describe(pb.DescribeRequest(), timeout=30)
    assert d.worker_id == "itest-worker" and d.device.startswith(DEVICE)
    assert d.memory_total_bytes > 0 and d.test_impls_enabled
    assert d.environment.torch and d.environment.python and d.environment.kassay
    assert d.ceilings.matmul_tflops > 0 and d.ceilings.copy_gbps > 0
    assert d.executor.state == pb.EXECUTOR_STATE_IDLE and d.executor.pid > 0
    ops = {o.name: o for o in d.ops}
    assert set(ops) == {"flce", "lse_merge"}
    lse = ops["lse_merge"]
    assert "huge" in lse.regimes and "float32" in lse.dtypes
    impls = {i.name: i for i in lse.impls}
    assert impls["torch"].is_baseline and impls["torch"].kind == "builtin"
    assert impls["torch"].device_supported
    for name in ("crash", "hang", "raise"):
        assert impls[name].kind == "testing"
    flce = {i.name: i for i in ops["flce"].impls}
    if "liger" in flce and DEVICE == "cpu":  # a CUDA-only peer says why it cannot run here
        assert not flce["liger"].device_supported
        assert "CUDA" in flce["liger"].dtypes[0].reason


def test_reflection_lists_the_service(worker: Worker) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(worker.channel)
    reqs = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE),
    ]
    listed, files = list(stub.ServerReflectionInfo(iter(reqs), timeout=10))
    names = {s.name for s in listed.list_services_response.service}
    assert {SERVICE, "grpc.health.v1.Health"} <= names
    assert files.file_descriptor_response.file_descriptor_proto


def test_run_isolates_crash_hang_and_raise(worker: Worker) -> None:
    """One group whose impls pass, segfault, hang and raise: each fails alone, with the right
    status, the executor restarts in time, and the group completes."""
    req = pb.RunRequest(
        run_id="itest-crash",
        case_timeout_s=2.0,
        groups=[_group("g-crash", ["torch", "crash", "hang", "raise"])],
    )
    events = _collect(worker.stub.Run(req, timeout=90))
    kinds = [ev.WhichOneof("event") for _, ev in events]
    assert kinds == ["started", "result"] * 4 + ["done"], kinds
    assert [ev.seq for _, ev in events] == list(range(1, len(events) + 1))
    assert all(ev.run_id == "itest-crash" for _, ev in events)

    results = {ev.result.impl: ev.result for _, ev in events if ev.HasField("result")}
    assert {k: r.status for k, r in results.items()} == {
        "torch": "passed",
        "crash": "crashed",
        "hang": "timeout",
        "raise": "error",
    }, {k: r.message for k, r in results.items()}
    assert "SIGSEGV" in results["crash"].message
    assert "timeout of 2 s" in results["hang"].message
    assert "raised on purpose" in results["raise"].message
    torch_res = results["torch"]
    assert torch_res.case_id == "g-crash:torch" and json.loads(torch_res.params_json)["T"] == 8
    assert {o.name for o in torch_res.outputs} == {"out", "lse"}
    clock = "cpu_perf_counter" if DEVICE == "cpu" else "cuda_events"
    assert torch_res.timing.clock == clock and torch_res.worker == "itest-worker"
    assert torch_res.environment.device == d_device(worker)

    started = [(t, ev.started) for t, ev in events if ev.HasField("started")]
    assert [s.attempt for _, s in started] == [1, 1, 2, 3]
    # the case after a crash / a hang starts within the restart budget
    by_impl = {ev.result.impl: t for t, ev in events if ev.HasField("result")}
    start_of = {s.impl: t for t, s in started}
    assert start_of["hang"] - by_impl["crash"] <= RESTART_BUDGET_S
    assert start_of["raise"] - by_impl["hang"] <= RESTART_BUDGET_S

    done = events[-1][1].done
    assert done.group_id == "g-crash" and done.n_results == 4 and not done.not_run

    # the restarted executor serves the next run normally
    again = _collect(
        worker.stub.Run(pb.RunRequest(groups=[_group("g-after", ["torch"])]), timeout=60)
    )
    assert [ev.result.status for _, ev in again if ev.HasField("result")] == ["passed"]
    d = worker.stub.Describe(pb.DescribeRequest(), timeout=30)
    assert d.executor.restarts >= 2


def test_a_crashed_amp_case_is_named_as_the_engine_names_it(worker: Worker) -> None:
    """An AMP flce group: the engine reports `raise` (error), the supervisor reports `crash`
    itself (the executor died); both name the case's dtype amp-bfloat16."""
    group = pb.GroupSpec(
        group_id="g-amp",
        op="flce",
        impls=["raise", "crash"],
        params_json=json.dumps(
            {"N": 4, "H": 8, "V": 16, "dtype": "float32", "autocast": "bfloat16"}
        ),
        timing=pb.TimingPolicy(enabled=False),
    )
    events = _collect(
        worker.stub.Run(pb.RunRequest(run_id="itest-amp", groups=[group]), timeout=90)
    )
    results = {ev.result.impl: ev.result for _, ev in events if ev.HasField("result")}
    assert {k: (r.status, r.dtype) for k, r in results.items()} == {
        "raise": ("error", "amp-bfloat16"),
        "crash": ("crashed", "amp-bfloat16"),
    }, {k: r.message for k, r in results.items()}


def test_queued_runs_share_the_device(worker: Worker) -> None:
    """Two Run calls at once: both complete, each gets only its own events."""
    out: dict[str, list[pb.CaseEvent]] = {}

    def run(rid: str) -> None:
        req = pb.RunRequest(
            run_id=rid, groups=[_group(f"{rid}-a", ["torch"]), _group(f"{rid}-b", ["torch"], K=3)]
        )
        out[rid] = [ev for _, ev in _collect(worker.stub.Run(req, timeout=60))]

    threads = [threading.Thread(target=run, args=(rid,)) for rid in ("q1", "q2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    for rid, evs in out.items():
        assert {ev.run_id for ev in evs} == {rid}
        done = [ev.done.group_id for ev in evs if ev.HasField("done")]
        assert done == [f"{rid}-a", f"{rid}-b"]
        assert all(ev.result.status == "passed" for ev in evs if ev.HasField("result"))
    assert set(out) == {"q1", "q2"}


def test_invalid_requests_get_invalid_argument_with_details(worker: Worker) -> None:
    bad_params = pb.RunRequest(groups=[_group("g-bad", ["torch"], K=1)])
    with pytest.raises(grpc.RpcError) as exc:
        list(worker.stub.Run(bad_params, timeout=30))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info, bad = _details(exc.value)
    assert info is not None and info.reason == "INVALID_SPEC" and info.domain == "kassay.dev"
    assert bad is not None
    assert [v.field for v in bad.field_violations] == ["groups.0.params.K"]

    unknown = pb.RunRequest(groups=[_group("g-unknown", ["torch", "no_such_impl"])])
    with pytest.raises(grpc.RpcError) as exc:
        list(worker.stub.Run(unknown, timeout=30))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "known impls" in (exc.value.details() or "")
    info, bad = _details(exc.value)
    assert info is not None and info.reason == "UNKNOWN_IMPL"
    assert "torch" in info.metadata["allowed"]
    assert bad is not None and bad.field_violations[0].field == "groups.0.impls"

    with pytest.raises(grpc.RpcError) as exc:
        list(worker.stub.Run(pb.RunRequest(), timeout=30))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    with pytest.raises(grpc.RpcError) as exc:
        worker.stub.Cancel(pb.CancelRequest(), timeout=10)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not worker.stub.Cancel(pb.CancelRequest(run_id="nope"), timeout=10).found


def test_executor_killed_while_idle_is_restarted(worker: Worker) -> None:
    """SIGKILL the executor between runs: health drops, a new executor comes up, runs work."""
    before = worker.stub.Describe(pb.DescribeRequest(), timeout=30).executor
    assert before.state == pb.EXECUTOR_STATE_IDLE and before.pid > 0
    os.kill(before.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    after = before
    while time.monotonic() < deadline:
        after = worker.stub.Describe(pb.DescribeRequest(), timeout=30).executor
        if after.state == pb.EXECUTOR_STATE_IDLE and after.pid != before.pid:
            break
        time.sleep(0.1)
    assert after.pid != before.pid and after.restarts == before.restarts + 1, after
    health = health_pb2_grpc.HealthStub(worker.channel)
    status = health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=5).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    evs = _collect(worker.stub.Run(pb.RunRequest(groups=[_group("g-idle", ["torch"])]), timeout=60))
    assert [ev.result.status for _, ev in evs if ev.HasField("result")] == ["passed"]


def test_cancel_stops_the_run(worker: Worker) -> None:
    """Cancelling stops a hanging case at once and hands back what did not run."""
    req = pb.RunRequest(
        run_id="itest-cancel",
        case_timeout_s=60,
        groups=[_group("g-c1", ["torch", "hang", "raise"]), _group("g-c2", ["torch"])],
    )
    events: list[tuple[float, pb.CaseEvent]] = []
    cancelled_at: list[float] = []
    for t, ev in ((time.monotonic(), e) for e in worker.stub.Run(req, timeout=60)):
        events.append((t, ev))
        if ev.HasField("started") and ev.started.impl == "hang":
            resp = worker.stub.Cancel(pb.CancelRequest(run_id="itest-cancel"), timeout=10)
            assert resp.found and resp.cancelled_groups == 2
            cancelled_at.append(time.monotonic())
    assert cancelled_at and events[-1][0] - cancelled_at[0] < 10.0
    dones = {ev.done.group_id: ev.done for _, ev in events if ev.HasField("done")}
    assert list(dones["g-c1"].not_run) == ["g-c1:hang", "g-c1:raise"]
    assert dones["g-c1"].n_results == 1 and dones["g-c1"].reason == "run cancelled"
    assert list(dones["g-c2"].not_run) == ["g-c2:torch"]


def test_sigterm_finishes_the_running_case_and_exits(worker: Worker) -> None:
    """Last on purpose: drains the module's worker."""
    req = pb.RunRequest(
        run_id="itest-term",
        case_timeout_s=3.0,
        groups=[_group("g-t1", ["torch", "hang", "raise"]), _group("g-t2", ["torch"])],
    )
    events: list[pb.CaseEvent] = []
    for ev in worker.stub.Run(req, timeout=60):
        events.append(ev)
        if ev.HasField("started") and ev.started.impl == "hang":
            worker.proc.send_signal(signal.SIGTERM)
    results = {ev.result.impl: ev.result.status for ev in events if ev.HasField("result")}
    msgs = [ev.result.message for ev in events if ev.HasField("result")]
    # the running case finished (it hit its timeout); nothing else ran
    assert results == {"torch": "passed", "hang": "timeout"}, (msgs, worker.tail())
    dones = {ev.done.group_id: ev.done for ev in events if ev.HasField("done")}
    assert list(dones["g-t1"].not_run) == ["g-t1:raise"]
    assert list(dones["g-t2"].not_run) == ["g-t2:torch"]
    assert dones["g-t2"].reason == "worker shutting down"
    assert worker.proc.wait(timeout=30) == 0, worker.tail()
    assert "stopped" in worker.tail()
