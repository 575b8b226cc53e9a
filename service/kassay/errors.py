"""The one exception tree of kassay.

It is mapped once to HTTP status codes (the API's exception handlers) and once to gRPC status
codes (the worker's server interceptor); each class carries both so the two maps cannot drift.
"""

from __future__ import annotations

from typing import Any


class KassayError(Exception):
    """Base of every error kassay raises on purpose."""

    http_status: int = 500
    grpc_code: str = "INTERNAL"  # name of a grpc.StatusCode member; kept as text: no grpc import

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details or {}

    def to_dict(self) -> dict[str, Any]:
        return {"error": type(self).__name__, "message": self.message, "details": self.details}


class InvalidSpecError(KassayError):
    """A job spec or params failed validation (field path and reason in details)."""

    http_status = 422
    grpc_code = "INVALID_ARGUMENT"


class UnknownOpError(InvalidSpecError):
    """The spec names an op that is not registered; details list the known ones."""


def did_you_mean(name: str, known: list[str] | tuple[str, ...]) -> str:
    """ " (did you mean 'x'?)" for the closest known names, or ""."""
    import difflib

    close = difflib.get_close_matches(name, list(known), n=2, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"


class UnknownImplError(InvalidSpecError):
    """The spec names an impl that is not registered for the op; details list the known ones."""


class CaseLimitError(KassayError):
    """The grid expands to more cases than the configured cap."""

    http_status = 422
    grpc_code = "RESOURCE_EXHAUSTED"


class ResourceError(KassayError):
    """The job cannot fit any worker (e.g. estimated device memory)."""

    http_status = 422
    grpc_code = "RESOURCE_EXHAUSTED"


class PayloadTooLargeError(KassayError):
    http_status = 413
    grpc_code = "RESOURCE_EXHAUSTED"


class NotFoundError(KassayError):
    http_status = 404
    grpc_code = "NOT_FOUND"


class ConflictError(KassayError):
    http_status = 409
    grpc_code = "FAILED_PRECONDITION"


class IncomparableError(ConflictError):
    """Two jobs cannot be compared: they ran on different kinds of device."""


class AuthError(KassayError):
    http_status = 401
    grpc_code = "UNAUTHENTICATED"


class ForbiddenError(KassayError):
    http_status = 403
    grpc_code = "PERMISSION_DENIED"


class UnsupportedError(KassayError):
    """An impl cannot compute these params (reported as case status `unsupported`)."""

    http_status = 422
    grpc_code = "UNIMPLEMENTED"


class WorkerUnavailableError(KassayError):
    http_status = 503
    grpc_code = "UNAVAILABLE"
