"""The checked-in gRPC stubs match protos/kassay/v1/*.proto (CI fails when they are stale)."""

from __future__ import annotations

import pytest

pytest.importorskip("grpc_tools")


def test_checked_in_stubs_are_fresh() -> None:
    from kassay.worker import protogen

    try:
        problems = protogen.check()
    except protogen.ProtogenError as exc:
        # The dev extra pins grpcio-tools: not being able to generate is itself a failure.
        pytest.fail(f"cannot generate stubs here: {exc}")
    assert not problems, "stale stubs; run `make protos`:\n" + "\n".join(problems)


def test_stubs_import_as_package_modules() -> None:
    from kassay.v1 import worker_pb2, worker_pb2_grpc

    assert worker_pb2.DESCRIPTOR.package == "kassay.v1"
    assert worker_pb2_grpc.WorkerStub.__module__ == "kassay.v1.worker_pb2_grpc"
    names = {m.name for m in worker_pb2.DESCRIPTOR.services_by_name["Worker"].methods}
    assert names == {"Describe", "Run", "Cancel", "ArtifactStatus", "PutArtifact"}


def test_no_op_has_a_message_of_its_own() -> None:
    """Params travel as data (params_json): a new op changes nothing in the .proto."""
    from kassay.ops import op_names
    from kassay.v1 import worker_pb2 as pb

    for msg in (pb.GroupSpec, pb.CaseResult):
        assert "params" not in msg.DESCRIPTOR.oneofs_by_name, msg.DESCRIPTOR.name
        assert "params_json" in msg.DESCRIPTOR.fields_by_name
    names = set(pb.DESCRIPTOR.message_types_by_name)
    assert not {n for n in names if n.lower().replace("params", "") in set(op_names())}
