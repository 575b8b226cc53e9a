"""Who may talk to a worker: the shared-token check, TLS/mTLS server credentials and the rule
that an unauthenticated worker listens on loopback only.

- Token: with a token set, every kassay.v1.Worker call and server reflection need the metadata
  `authorization: Bearer <token>` (compared in constant time); anything else is refused with
  UNAUTHENTICATED and the usual google.rpc details (reason AUTH). The grpc.health.v1 service
  stays open so that load balancers and Kubernetes probes need no secret; it tells only
  SERVING / NOT_SERVING.
- TLS: a server certificate and key make the port TLS-only; a client CA on top makes it mTLS
  (a client without a certificate signed by that CA fails the handshake).
- Exposure: a worker with neither a token nor mTLS runs code paths on its device for anyone who
  reaches its port, so it refuses to listen beyond loopback unless told to
  (KASSAY_WORKER_ALLOW_UNAUTHENTICATED=true).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from grpc_status import rpc_status

from kassay.contract.addresses import is_loopback
from kassay.errors import AuthError
from kassay.worker.server.interceptor import SERVICE_PREFIX, rich_status

#: methods the token guards: the Worker service and server reflection (v1alpha and v1)
GUARDED_PREFIXES = (
    SERVICE_PREFIX,
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)


def exposure_problem(
    listen: str, *, token: str | None, mtls: bool, allow_unauthenticated: bool
) -> str | None:
    """Why a worker must not start as configured (None when it may)."""
    if token or mtls or allow_unauthenticated or is_loopback(listen):
        return None
    return (
        f"refusing to listen on {listen} without authentication: anyone who can reach this "
        "port could run and cancel groups on the device. Set KASSAY_WORKER_TOKEN (the API "
        "needs the same value), or require client certificates (KASSAY_WORKER_TLS_CLIENT_CA "
        "with KASSAY_WORKER_TLS_CERT/KEY), or listen on 127.0.0.1; to run open on purpose, set "
        "KASSAY_WORKER_ALLOW_UNAUTHENTICATED=true"
    )


def server_credentials(
    cert: Path | None, key: Path | None, client_ca: Path | None
) -> grpc.ServerCredentials | None:
    """TLS credentials for the listening port (None: plaintext). With `client_ca`, clients must
    show a certificate it signed (mTLS)."""
    if cert is None or key is None:
        return None
    return grpc.ssl_server_credentials(
        [(key.read_bytes(), cert.read_bytes())],
        root_certificates=client_ca.read_bytes() if client_ca is not None else None,
        require_client_auth=client_ca is not None,
    )


def bearer_ok(metadata: Sequence[tuple[str, Any]] | None, token: str) -> bool:
    """Whether the call's metadata carries `authorization: Bearer <token>`."""
    expected = token.encode()
    for key, value in metadata or ():
        if key != "authorization":
            continue
        text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
        scheme, _, given = text.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected):
            return True
    return False


def _refusal(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that fails the call with UNAUTHENTICATED."""
    status = rpc_status.to_status(
        rich_status(AuthError("this worker needs 'authorization: Bearer <worker token>'"))
    )

    async def deny(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort_with_status(status)

    kinds: dict[str, Callable[..., grpc.RpcMethodHandler]] = {
        "unary_unary": grpc.unary_unary_rpc_method_handler,
        "unary_stream": grpc.unary_stream_rpc_method_handler,
        "stream_unary": grpc.stream_unary_rpc_method_handler,
        "stream_stream": grpc.stream_stream_rpc_method_handler,
    }
    for attr, make in kinds.items():
        if getattr(handler, attr) is not None:
            return make(
                deny,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    return handler


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses guarded calls (see GUARDED_PREFIXES) that lack the bearer token."""

    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = getattr(handler_call_details, "method", "") or ""
        if handler is None or not method.startswith(GUARDED_PREFIXES):
            return handler
        metadata = getattr(handler_call_details, "invocation_metadata", None)
        if bearer_ok(metadata, self.token):
            return handler
        return _refusal(handler)


__all__ = [
    "GUARDED_PREFIXES",
    "TokenInterceptor",
    "bearer_ok",
    "exposure_problem",
    "is_loopback",
    "server_credentials",
]
