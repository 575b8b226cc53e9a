"""Deprecated import path of the generated gRPC stubs: they live in `kassay.contract.v1` now
(the proto package and the gRPC service names are still kassay.v1). `from kassay.v1 import
worker_pb2, worker_pb2_grpc` keeps working, with a DeprecationWarning, until the next major
release."""

from __future__ import annotations

import sys
import warnings

from kassay.contract.v1 import worker_pb2, worker_pb2_grpc

warnings.warn(
    "kassay.v1 moved to kassay.contract.v1 (import the stubs from there)",
    DeprecationWarning,
    stacklevel=2,
)
# `import kassay.v1.worker_pb2` finds the moved modules under the old names too
sys.modules[__name__ + ".worker_pb2"] = worker_pb2
sys.modules[__name__ + ".worker_pb2_grpc"] = worker_pb2_grpc

__all__ = ["worker_pb2", "worker_pb2_grpc"]
