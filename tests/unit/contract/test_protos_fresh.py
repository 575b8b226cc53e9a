"""The checked-in gRPC stubs match protos/kassay/contract/v1/*.proto (CI fails when they are stale)."""

from __future__ import annotations

import pytest

pytest.importorskip("grpc_tools")


def test_checked_in_stubs_are_fresh() -> None:
    from kassay.contract import protogen

    try:
        problems = protogen.check()
    except protogen.ProtogenError as exc:
        # The dev extra pins grpcio-tools: not being able to generate is itself a failure.
        pytest.fail(f"cannot generate stubs here: {exc}")
    assert not problems, "stale stubs; run `make protos`:\n" + "\n".join(problems)


def test_stubs_import_as_package_modules() -> None:
    from kassay.contract.v1 import worker_pb2, worker_pb2_grpc

    assert worker_pb2.DESCRIPTOR.package == "kassay.v1"
    assert worker_pb2_grpc.WorkerStub.__module__ == "kassay.contract.v1.worker_pb2_grpc"
    names = {m.name for m in worker_pb2.DESCRIPTOR.services_by_name["Worker"].methods}
    assert names == {"Describe", "Run", "Cancel", "ArtifactStatus", "PutArtifact"}


def test_no_op_has_a_message_of_its_own() -> None:
    """Params travel as data (params_json): a new op changes nothing in the .proto."""
    from kassay.contract.v1 import worker_pb2 as pb
    from kassay.ops import op_names

    for msg in (pb.GroupSpec, pb.CaseResult):
        assert "params" not in msg.DESCRIPTOR.oneofs_by_name, msg.DESCRIPTOR.name
        assert "params_json" in msg.DESCRIPTOR.fields_by_name
    names = set(pb.DESCRIPTOR.message_types_by_name)
    assert not {n for n in names if n.lower().replace("params", "") in set(op_names())}


def test_the_old_stub_path_still_imports_with_a_deprecation_warning() -> None:
    import subprocess
    import sys

    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n    import kassay.v1\nexcept DeprecationWarning as e:\n    print('warned:', e)\n"
        "warnings.simplefilter('ignore')\n"
        "from kassay.v1 import worker_pb2_grpc\nimport kassay.v1.worker_pb2 as pb\n"
        "from kassay.contract.v1 import worker_pb2\n"
        "assert pb is worker_pb2 and worker_pb2_grpc.WorkerStub\n"
        "print(pb.DESCRIPTOR.services_by_name['Worker'].full_name)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == [
        "warned: kassay.v1 moved to kassay.contract.v1 (import the stubs from there)",
        "kassay.v1.Worker",
    ], out.stdout + out.stderr
