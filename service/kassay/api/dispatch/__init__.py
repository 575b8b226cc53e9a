"""The dispatcher of queued groups to gRPC workers (see kassay.api.dispatch.dispatcher)."""

from kassay.api.dispatch.dispatcher import Dispatcher
from kassay.api.dispatch.links import WorkerLink, Workers
from kassay.api.dispatch.runs import ARTIFACT_CHUNK_BYTES

__all__ = ["ARTIFACT_CHUNK_BYTES", "Dispatcher", "WorkerLink", "Workers"]
