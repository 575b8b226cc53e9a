"""The one server interceptor: kassay's exception tree -> gRPC status codes with google.rpc details.

Every KassayError carries its gRPC code (kassay.errors: `grpc_code`); the interceptor aborts the
call with that code and a google.rpc.Status whose details hold
- an ErrorInfo: reason = the error class in UPPER_SNAKE_CASE (INVALID_SPEC, UNKNOWN_IMPL, ...),
  domain = "kassay.dev", metadata = the error's details (non-text values as JSON), and
- a BadRequest with one FieldViolation per failing field when the details name fields
  (`errors` with `loc` paths, or `field`).
Any other exception becomes INTERNAL with reason INTERNAL (logged with its traceback). Clients read
the details with grpc_status.rpc_status.from_call(). Applied to the kassay.v1.Worker methods only:
health and reflection pass through untouched.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from kassay.errors import KassayError

log = logging.getLogger(__name__)

ERROR_DOMAIN = "kassay.dev"
SERVICE_PREFIX = "/kassay.v1.Worker/"


def _reason(cls: type[BaseException]) -> str:
    name = cls.__name__.removesuffix("Error") or cls.__name__
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def _violations(details: dict[str, Any]) -> list[error_details_pb2.BadRequest.FieldViolation]:
    out = []
    for err in details.get("errors") or []:
        if isinstance(err, dict) and "loc" in err:
            path = ".".join(str(p) for p in err["loc"])
            out.append(
                error_details_pb2.BadRequest.FieldViolation(
                    field=path, description=str(err.get("msg", ""))
                )
            )
    if not out and isinstance(details.get("field"), str):
        allowed = details.get("allowed")
        desc = f"allowed: {', '.join(map(str, allowed))}" if allowed else ""
        out.append(
            error_details_pb2.BadRequest.FieldViolation(field=details["field"], description=desc)
        )
    return out


def rich_status(exc: BaseException) -> status_pb2.Status:
    """The google.rpc.Status for an exception (a KassayError keeps its code and details)."""
    if isinstance(exc, KassayError):
        code_name, message, details = exc.grpc_code, exc.message, exc.details
    else:
        code_name, message, details = "INTERNAL", f"{type(exc).__name__}: {exc}", {}
    code = getattr(grpc.StatusCode, code_name, grpc.StatusCode.INTERNAL)
    info = error_details_pb2.ErrorInfo(
        reason=_reason(type(exc)) if isinstance(exc, KassayError) else "INTERNAL",
        domain=ERROR_DOMAIN,
        metadata={str(k): _text(v) for k, v in details.items()},
    )
    packed = [any_pb2.Any()]
    packed[0].Pack(info)
    violations = _violations(details)
    if violations:
        bad = any_pb2.Any()
        bad.Pack(error_details_pb2.BadRequest(field_violations=violations))
        packed.append(bad)
    return status_pb2.Status(code=code.value[0], message=message, details=packed)


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    if not isinstance(exc, KassayError):
        log.exception("unexpected error in a Worker call", exc_info=exc)
    await context.abort_with_status(rpc_status.to_status(rich_status(exc)))


def _wrap_unary(behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behavior(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc)

    return wrapper


def _wrap_stream(behavior: Callable[..., Any]) -> Callable[..., Any]:
    if not inspect.isasyncgenfunction(behavior):
        return _wrap_unary(behavior)  # a coroutine that writes with context.write()

    async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            async for item in behavior(request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc)

    return wrapper


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Maps exceptions raised by kassay.v1.Worker handlers to rich gRPC statuses."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = getattr(handler_call_details, "method", "") or ""
        if handler is None or not method.startswith(SERVICE_PREFIX):
            return handler
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary(handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary is not None:  # PutArtifact: chunks in, one answer out
            return grpc.stream_unary_rpc_method_handler(
                _wrap_unary(handler.stream_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


__all__ = ["ERROR_DOMAIN", "ErrorInterceptor", "rich_status"]
