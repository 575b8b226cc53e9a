"""Who may talk to a worker, over real gRPC on loopback ports: the worker token, TLS and mTLS
(certificates made in the test by a throwaway CA), the worker's own caps on a Run, the API
talking to such workers end to end, and /v1/workers not giving away run ids."""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("grpc_status")
x509 = pytest.importorskip("cryptography.x509")

from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402
from google.rpc import error_details_pb2  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc  # noqa: E402
from grpc_status import rpc_status  # noqa: E402
from users import KASSAY  # noqa: E402

from kassay.contract.v1 import worker_pb2 as pb  # noqa: E402
from kassay.contract.v1 import worker_pb2_grpc  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOKEN = "itest-worker-token-0123456789"
SERVICE = "kassay.v1.Worker"
#: the conftest workers' case timeout (a hang case ends there)
CASE_TIMEOUT_S = 6.0


# ---------------------------------------------------------------------------- certificates


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path  # a client certificate from another CA
    rogue_key: Path


def _name(cn: str) -> Any:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: Path, cert: Any, key: Any) -> tuple[Path, Path]:
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path.with_suffix(".key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path.with_suffix(".crt"), path.with_suffix(".key")


def _ca(cn: str) -> tuple[Any, Any]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(ca: tuple[Any, Any], cn: str, usage: Any, sans: list[Any]) -> tuple[Any, Any]:
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca = _ca("kassay test CA")
    (d / "ca.crt").write_bytes(ca[0].public_bytes(serialization.Encoding.PEM))
    server = _leaf(
        ca,
        "kassay worker",
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    client = _leaf(ca, "kassay api", ExtendedKeyUsageOID.CLIENT_AUTH, [])
    rogue = _leaf(_ca("someone else's CA"), "kassay api", ExtendedKeyUsageOID.CLIENT_AUTH, [])
    return Pki(
        d / "ca.crt", *_write(d / "server", *server), *_write(d / "client", *client),
        *_write(d / "rogue", *rogue),
    )  # fmt: skip


# ---------------------------------------------------------------------------------- helpers


def _tls(pki: Pki, *, client: tuple[Path, Path] | None = None) -> Any:
    return grpc.ssl_channel_credentials(
        root_certificates=pki.ca.read_bytes(),
        private_key=client[1].read_bytes() if client else None,
        certificate_chain=client[0].read_bytes() if client else None,
    )


def _channel(address: str, creds: Any = None) -> Any:
    return grpc.secure_channel(address, creds) if creds else grpc.insecure_channel(address)


def _auth(token: str = TOKEN) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def _wait_serving(worker: Any, creds: Any = None, timeout: float = 180.0) -> None:
    """Until the worker's (open) health service says SERVING."""
    deadline = time.monotonic() + timeout
    with _channel(worker.extra["address"], creds) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            if not worker.alive():
                pytest.fail(f"worker exited:\n{worker.tail()}")
            try:
                resp = health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=2)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.3)
    pytest.fail(f"worker not SERVING after {timeout} s:\n{worker.tail()}")


def _group(group_id: str, impls: list[str], **timing: Any) -> pb.GroupSpec:
    return pb.GroupSpec(
        group_id=group_id,
        op="lse_merge",
        impls=impls,
        params_json=json.dumps({"T": 8, "Hh": 2, "D": 4, "K": 2, "dtype": "float32"}),
        timing=pb.TimingPolicy(
            **{
                "enabled": True,
                "warmup": 0,
                "min_reps": 2,
                "max_reps": 3,
                "budget_s": 0.2,
                **timing,
            }
        ),
    )


def _refused(call: Any) -> tuple[Any, str]:
    """Run `call` (which must fail) and return its status code and ErrorInfo reason."""
    with pytest.raises(grpc.RpcError) as err:
        call()
    status = rpc_status.from_call(err.value)
    reason = ""
    for d in status.details if status else ():
        info = error_details_pb2.ErrorInfo()
        if d.Is(info.DESCRIPTOR):
            d.Unpack(info)
            reason = info.reason
    return err.value.code(), reason


def _results(stream: Any) -> dict[str, Any]:
    return {ev.result.impl: ev.result for ev in stream if ev.HasField("result")}


def _stop(*procs: Any) -> None:
    for p in procs:
        p.stop()


SPEC = {
    "name": "auth-e2e",
    "suites": [
        {
            "op": "lse_merge",
            "impls": ["torch"],
            "params": {"T": 8, "Hh": 2, "D": 4, "dtype": "float32"},
            # every regime + coverage: several groups, while the token worker caps a Run at 2
            # groups: the API must batch by the cap the worker describes
            "timing": {"enabled": False},
        }
    ],
}


def _run_job(url: str, spec: dict[str, Any] = SPEC) -> Any:
    from kassay_client import Client

    with Client(url, timeout=30) as kc:
        job = kc.jobs.create(spec)
        return kc.jobs.wait(job.id, timeout=180)


# ------------------------------------------------------------------------ token (plaintext)


@pytest.fixture(scope="module")
def token_worker(module_procs: Any) -> Iterator[Any]:
    """A loopback worker that needs TOKEN, with small caps of its own."""
    w = module_procs.worker(
        "token-worker",
        env={
            "KASSAY_WORKER_TOKEN": TOKEN,
            "KASSAY_MAX_RUN_GROUPS": "2",
            "KASSAY_MAX_GROUP_IMPLS": "3",
            "KASSAY_MAX_TIMING_BUDGET_S": "0.3",
        },
    )
    try:
        _wait_serving(w)
        yield w
    finally:
        w.stop()


INTRUDER = b"def impls():\n    return []\n"


def _chunks(data: bytes, digest: str, filename: str) -> Iterator[pb.ArtifactChunk]:
    """An artifact as the API sends it: PutArtifact messages of ARTIFACT_CHUNK_BYTES, the first
    naming the digest and the file."""
    from kassay.api.dispatch import ARTIFACT_CHUNK_BYTES as step

    for i in range(0, max(len(data), 1), step):
        head = {"digest": digest, "filename": filename} if i == 0 else {}
        yield pb.ArtifactChunk(size=len(data), data=data[i : i + step], **head)


def test_calls_without_the_right_token_are_unauthenticated(token_worker: Any) -> None:
    intruder_digest = hashlib.sha256(INTRUDER).hexdigest()
    with _channel(token_worker.extra["address"]) as ch:
        stub = worker_pb2_grpc.WorkerStub(ch)
        run = pb.RunRequest(run_id="intruder", groups=[_group("g-intruder", ["torch"])])
        bad = [
            None,
            _auth("wrong-token-0123456789"),
            _auth(TOKEN[:-1]),
            [("authorization", TOKEN)],
            [("authorization", f"Basic {TOKEN}")],
        ]
        for md in bad:
            calls = {
                "Describe": lambda md=md: stub.Describe(
                    pb.DescribeRequest(), metadata=md, timeout=10
                ),
                "Run": lambda md=md: list(stub.Run(run, metadata=md, timeout=10)),
                "Cancel": lambda md=md: stub.Cancel(
                    pb.CancelRequest(run_id="intruder"), metadata=md, timeout=10
                ),
                "ArtifactStatus": lambda md=md: stub.ArtifactStatus(
                    pb.ArtifactStatusRequest(digests=[intruder_digest]), metadata=md, timeout=10
                ),
                "PutArtifact": lambda md=md: stub.PutArtifact(
                    _chunks(INTRUDER, intruder_digest, "intruder.py"), metadata=md, timeout=10
                ),
            }
            for name, call in calls.items():
                assert _refused(call) == (grpc.StatusCode.UNAUTHENTICATED, "AUTH"), (name, md)
        # nothing of the refused runs was queued or run, nor any artifact kept
        missing = stub.ArtifactStatus(
            pb.ArtifactStatusRequest(digests=[intruder_digest]), metadata=_auth(), timeout=10
        ).missing
        assert list(missing) == [intruder_digest]
        d = stub.Describe(pb.DescribeRequest(), metadata=_auth(), timeout=30)
        assert d.executor.state == pb.EXECUTOR_STATE_IDLE and d.executor.queued_groups == 0
        ok = _results(stub.Run(pb.RunRequest(groups=[_group("g-ok", ["torch"])]), metadata=_auth()))
        assert ok["torch"].status == "passed"


def test_health_is_open_and_reflection_needs_the_token(token_worker: Any) -> None:
    with _channel(token_worker.extra["address"]) as ch:
        health = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=SERVICE), timeout=5
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        ask = [reflection_pb2.ServerReflectionRequest(list_services="")]
        code, _ = _refused(lambda: list(stub.ServerReflectionInfo(iter(ask), timeout=10)))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        (listed,) = stub.ServerReflectionInfo(iter(ask), metadata=_auth(), timeout=10)
        assert SERVICE in {s.name for s in listed.list_services_response.service}


def test_the_worker_caps_what_a_run_may_ask(token_worker: Any) -> None:
    with _channel(token_worker.extra["address"]) as ch:
        stub = worker_pb2_grpc.WorkerStub(ch)

        def run(req: pb.RunRequest) -> Any:
            return _results(stub.Run(req, metadata=_auth(), timeout=120))

        # more groups than the worker takes in one run, more impls than it runs in one group
        groups = [_group(f"g{i}", ["torch"]) for i in range(3)]
        code, _ = _refused(lambda: run(pb.RunRequest(groups=groups)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        many = _group("g-many", ["torch", "te_style", "ring_style", "kassay"])
        code, _ = _refused(lambda: run(pb.RunRequest(groups=[many])))
        assert code == grpc.StatusCode.INVALID_ARGUMENT

        # the caller cannot switch on mutants this worker does not offer
        d = stub.Describe(pb.DescribeRequest(), metadata=_auth(), timeout=30)
        kinds = {i.kind for op in d.ops for i in op.impls}
        assert "mutant" not in kinds and "builtin" in kinds
        mutant = pb.RunRequest(
            include_mutants=True, groups=[_group("g-mutant", ["torch", "m_naive_logaddexp"])]
        )
        assert _refused(lambda: run(mutant)) == (grpc.StatusCode.INVALID_ARGUMENT, "UNKNOWN_IMPL")

        # a run may not lengthen the case timeout, nor the timing budget
        hang = run(pb.RunRequest(case_timeout_s=1000, groups=[_group("g-hang", ["hang"])]))
        assert hang["hang"].status == "timeout", hang["hang"].message
        assert f"timeout of {CASE_TIMEOUT_S:g} s" in hang["hang"].message
        long_timing = _group(
            "g-budget", ["torch"], min_reps=1, max_reps=100_000, budget_s=600, target_rel_sem=1e-9
        )
        # 100k repetitions would outlast the case timeout: cut to the worker's 0.3 s, it passes
        timed = run(pb.RunRequest(groups=[long_timing]))["torch"]
        assert timed.status == "passed", timed.message
        assert 1 <= timed.timing.n < 100_000


def test_an_artifact_arrives_in_chunks_and_is_kept_only_if_it_matches_its_digest(
    token_worker: Any,
) -> None:
    """Over the authenticated channel: an artifact of several chunks is reassembled and kept by
    its sha256, once; bytes that do not hash to the digest sent are refused and not kept."""
    # a module of ~2.5 MiB: three PutArtifact messages
    data = b"def impls():\n    return []\n" + b"# padding " * 260_000 + b"\n"
    digest = hashlib.sha256(data).hexdigest()
    assert len(list(_chunks(data, digest, "big_module.py"))) == 3
    with _channel(token_worker.extra["address"]) as ch:
        stub = worker_pb2_grpc.WorkerStub(ch)

        def missing(*digests: str) -> list[str]:
            ask = pb.ArtifactStatusRequest(digests=list(digests))
            return list(stub.ArtifactStatus(ask, metadata=_auth(), timeout=10).missing)

        assert missing(digest) == [digest]
        forged = data[:-1] + b"#"  # one byte changed in the last chunk
        refused = _refused(
            lambda: stub.PutArtifact(
                _chunks(forged, digest, "big_module.py"), metadata=_auth(), timeout=60
            )
        )
        assert refused == (grpc.StatusCode.INVALID_ARGUMENT, "ARTIFACT_REFUSED")
        assert missing(digest) == [digest]
        put = stub.PutArtifact(_chunks(data, digest, "big_module.py"), metadata=_auth(), timeout=60)
        assert (put.digest, put.size, put.existed) == (digest, len(data), False)
        again = stub.PutArtifact(
            _chunks(data, digest, "big_module.py"), metadata=_auth(), timeout=60
        )
        assert again.existed is True and missing(digest) == []


def test_api_with_the_token_runs_jobs_and_workers_show_no_run_ids(
    token_worker: Any, module_procs: Any
) -> None:
    api = module_procs.api([token_worker], name="api-token", worker_token=TOKEN)
    wrong = module_procs.api(
        [token_worker], name="api-wrong", worker_token="not-the-worker-token-0123"
    )
    try:
        module_procs.wait_ready(api, token_worker)
        job = _run_job(api.extra["url"])
        assert job.state == "finished" and job.ok, job

        # A running group: what /v1/workers shows about it must not give its run id away.
        from kassay_client import Client

        with Client(api.extra["url"], timeout=30) as kc:
            slow = kc.jobs.create({**SPEC, "name": "slow", "suites": [
                {**SPEC["suites"][0], "impls": ["hang"]}
            ]})  # fmt: skip
            running: list[str] = []
            deadline = time.monotonic() + 60
            while not running and time.monotonic() < deadline:
                workers = httpx.get(f"{api.extra['url']}/v1/workers", timeout=5).json()
                running = [r for w in workers for r in w["running"]]
                time.sleep(0.2)
            assert running and all(r.startswith(f"{slow.id}/") for r in running), workers
            with _channel(token_worker.extra["address"]) as ch:
                stub = worker_pb2_grpc.WorkerStub(ch)
                for entry in running:  # the run id an older API built from the same parts
                    for guess in (f"{entry}/1+1", entry, slow.id):
                        resp = stub.Cancel(
                            pb.CancelRequest(run_id=guess), metadata=_auth(), timeout=10
                        )
                        assert not resp.found, guess
            kc.jobs.cancel(slow.id)

        # An API with the wrong token never sees the worker up, and says why.
        deadline = time.monotonic() + 30
        error = ""
        while "UNAUTHENTICATED" not in error and time.monotonic() < deadline:
            (info,) = httpx.get(f"{wrong.extra['url']}/v1/workers", timeout=5).json()
            error = info["last_error"] or ""
            time.sleep(0.3)
        assert info["state"] == "down" and "UNAUTHENTICATED" in error, info
        ready = httpx.get(f"{wrong.extra['url']}/readyz", timeout=5)
        assert ready.status_code == 200 and ready.json()["workers_up"] == 0  # jobs would queue
    finally:
        _stop(api, wrong)


# ------------------------------------------------------------------------------- TLS / mTLS


def test_tls_worker_refuses_plaintext_and_serves_tls(module_procs: Any, pki: Pki) -> None:
    w = module_procs.worker(
        "tls-worker",
        env={
            "KASSAY_WORKER_TOKEN": TOKEN,
            "KASSAY_WORKER_TLS_CERT": str(pki.server_cert),
            "KASSAY_WORKER_TLS_KEY": str(pki.server_key),
        },
    )
    try:
        _wait_serving(w, _tls(pki))
        addr = w.extra["address"]
        with _channel(addr) as plain:
            code, _ = _refused(
                lambda: worker_pb2_grpc.WorkerStub(plain).Describe(
                    pb.DescribeRequest(), metadata=_auth(), timeout=5
                )
            )
            assert code == grpc.StatusCode.UNAVAILABLE
        with _channel(addr, _tls(pki)) as ch:
            stub = worker_pb2_grpc.WorkerStub(ch)
            assert stub.Describe(pb.DescribeRequest(), metadata=_auth(), timeout=30).worker_id
            code, _ = _refused(lambda: stub.Describe(pb.DescribeRequest(), timeout=10))
            assert code == grpc.StatusCode.UNAUTHENTICATED  # TLS alone is not a login
    finally:
        w.stop()


def test_mtls_worker_needs_a_client_certificate_and_the_api_uses_it(
    module_procs: Any, pki: Pki
) -> None:
    # mTLS authenticates the API by itself: this worker has no token and listens on every
    # interface, which it may because it requires client certificates.
    w = module_procs.worker(
        "mtls-worker",
        host="0.0.0.0",
        env={
            "KASSAY_WORKER_TLS_CERT": str(pki.server_cert),
            "KASSAY_WORKER_TLS_KEY": str(pki.server_key),
            "KASSAY_WORKER_TLS_CLIENT_CA": str(pki.ca),
        },
    )
    api = None
    try:
        _wait_serving(w, _tls(pki, client=(pki.client_cert, pki.client_key)))
        addr = w.extra["address"]
        for creds in (None, _tls(pki), _tls(pki, client=(pki.rogue_cert, pki.rogue_key))):
            with _channel(addr, creds) as ch:
                code, _ = _refused(
                    lambda ch=ch: worker_pb2_grpc.WorkerStub(ch).Describe(
                        pb.DescribeRequest(), timeout=5
                    )
                )
                assert code == grpc.StatusCode.UNAVAILABLE
        api = module_procs.api(
            [w],
            name="api-mtls",
            worker_tls_ca=str(pki.ca),
            worker_tls_client_cert=str(pki.client_cert),
            worker_tls_client_key=str(pki.client_key),
        )
        module_procs.wait_ready(api, w)
        job = _run_job(api.extra["url"])
        assert job.state == "finished" and job.ok, job
    finally:
        _stop(*(p for p in (api, w) if p is not None))


def test_api_sends_the_token_over_tls(module_procs: Any, pki: Pki) -> None:
    """TLS plus the token as call credentials (what a deployment without client certificates
    uses); the worker name is checked against the certificate (localhost, not the IP)."""
    w = module_procs.worker(
        "tls-token-worker",
        env={
            "KASSAY_WORKER_TOKEN": TOKEN,
            "KASSAY_WORKER_TLS_CERT": str(pki.server_cert),
            "KASSAY_WORKER_TLS_KEY": str(pki.server_key),
        },
    )
    api = module_procs.api(
        [w],
        name="api-tls-token",
        worker_token=TOKEN,
        worker_tls_ca=str(pki.ca),
        worker_tls_server_name="localhost",
    )
    try:
        module_procs.wait_ready(api, w)
        with _channel(w.extra["address"]) as plain:  # the link really is TLS
            code, _ = _refused(
                lambda: health_pb2_grpc.HealthStub(plain).Check(
                    health_pb2.HealthCheckRequest(), timeout=5
                )
            )
            assert code == grpc.StatusCode.UNAVAILABLE
        job = _run_job(api.extra["url"])
        assert job.state == "finished" and job.ok, job
    finally:
        _stop(api, w)


# ------------------------------------------------------------------------------- exposure


def test_an_unauthenticated_worker_refuses_to_listen_beyond_loopback(module_procs: Any) -> None:
    port = module_procs.free_port()
    cmd = [*KASSAY, "worker", "--listen", f"0.0.0.0:{port}"]
    cmd += ["--device", "cpu"]
    run = subprocess.run(cmd, env=module_procs.env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "refusing to listen on 0.0.0.0" in run.stderr
    assert "KASSAY_WORKER_TOKEN" in run.stderr

    # the explicit opt-out lets it start
    w = module_procs.worker(
        "open-worker", host="0.0.0.0", env={"KASSAY_WORKER_ALLOW_UNAUTHENTICATED": "true"}
    )
    try:
        deadline = time.monotonic() + 60
        while "listening on" not in w.tail() and time.monotonic() < deadline:
            assert w.alive(), w.tail()
            time.sleep(0.2)
        assert "listening on 0.0.0.0" in w.tail() and "no token" in w.tail()
    finally:
        w.stop()


def test_kassay_serve_guards_its_worker_with_a_token_of_its_own(module_procs: Any) -> None:
    """`kassay serve`: the local worker refuses callers without the token serve made, and the
    embedded API (which holds it) runs a job through that worker."""
    port, worker_port = module_procs.free_port(), module_procs.free_port()
    data = module_procs.tmp / "serve-data"
    env = module_procs.env()
    env.pop("KASSAY_WORKER_TOKEN", None)
    log = module_procs.tmp / "serve.log"
    cmd = [*KASSAY, "serve", "--port", str(port), "--device", "cpu"]
    cmd += ["--worker-port", str(worker_port), "--data-dir", str(data)]
    with open(log, "wb") as fh:
        serve = subprocess.Popen(
            cmd,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=module_procs.tmp,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        ready = False
        while not ready and time.monotonic() < deadline:
            assert serve.poll() is None, log.read_text(errors="replace")[-3000:]
            try:
                r = httpx.get(f"{url}/readyz", timeout=2)
                ready = r.status_code == 200 and r.json()["workers_up"] >= 1
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        assert ready, log.read_text(errors="replace")[-3000:]
        with _channel(f"127.0.0.1:{worker_port}") as ch:
            code, _ = _refused(
                lambda: worker_pb2_grpc.WorkerStub(ch).Describe(pb.DescribeRequest(), timeout=10)
            )
            assert code == grpc.StatusCode.UNAUTHENTICATED
        job = _run_job(url)
        assert job.state == "finished" and job.ok, job
    finally:
        serve.terminate()
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait(timeout=10)
