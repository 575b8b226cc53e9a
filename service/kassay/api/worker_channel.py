"""The API's gRPC channel to one worker: plaintext or TLS/mTLS, with the worker token on every
call.

Two ways to carry the token, one per kind of channel, because gRPC refuses call credentials on
an insecure channel (it will not put a secret on a link it cannot protect):

- TLS (KASSAY_WORKER_TLS_CA set): a secure channel with composite credentials, the TLS channel
  credentials (the CA, plus the client certificate and key for mTLS) and access-token call
  credentials, which send `authorization: Bearer <token>` on every call.
- plaintext (loopback development, `kassay serve`, or a private network you trust): client
  interceptors (one per call shape the Worker service uses: unary, server-streaming Run,
  client-streaming PutArtifact) add the same metadata to every call. The token then travels in clear text, so
  the API warns when a plaintext worker address is not a loopback one.

The worker checks the header the same way either way (kassay.worker.server.access).
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from kassay.contract.addresses import is_loopback
from kassay.settings import Settings

log = logging.getLogger("kassay.api.dispatcher")


def _with_token(details: grpc.aio.ClientCallDetails, header: tuple[str, str]) -> Any:
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    metadata.add(*header)
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


class _UnaryToken(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, header: tuple[str, str]) -> None:
        self.header = header

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self.header), request)


class _StreamToken(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, header: tuple[str, str]) -> None:
        self.header = header

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self.header), request)


class _StreamUnaryToken(grpc.aio.StreamUnaryClientInterceptor):
    """For client-streaming calls (PutArtifact sends an artifact in chunks)."""

    def __init__(self, header: tuple[str, str]) -> None:
        self.header = header

    async def intercept_stream_unary(
        self, continuation: Any, details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(_with_token(details, self.header), request_iterator)


def channel_credentials(settings: Settings) -> grpc.ChannelCredentials | None:
    """TLS credentials for the worker channels (None: plaintext), with the token as call
    credentials when one is set."""
    if settings.worker_tls_ca is None:
        return None
    client_key = settings.worker_tls_client_key
    client_cert = settings.worker_tls_client_cert
    creds = grpc.ssl_channel_credentials(
        root_certificates=settings.worker_tls_ca.read_bytes(),
        private_key=client_key.read_bytes() if client_key is not None else None,
        certificate_chain=client_cert.read_bytes() if client_cert is not None else None,
    )
    if settings.worker_token is not None:
        token = grpc.access_token_call_credentials(settings.worker_token.get_secret_value())
        creds = grpc.composite_channel_credentials(creds, token)
    return creds


def open_channel(
    address: str,
    settings: Settings,
    options: list[tuple[str, Any]],
    credentials: grpc.ChannelCredentials | None = None,
    *,
    server_name: str | None = None,
) -> grpc.aio.Channel:
    """A channel to the worker at `address` as the settings say (see the module docstring);
    `credentials` from channel_credentials(), built once for all workers. `server_name`: the
    DNS name the address was found by (a `dns:///` entry), which its certificate is checked
    against unless KASSAY_WORKER_TLS_SERVER_NAME says otherwise (an address alone is an IP)."""
    if credentials is not None:
        opts = list(options)
        name = settings.worker_tls_server_name or server_name
        if name:
            opts.append(("grpc.ssl_target_name_override", name))
        return grpc.aio.secure_channel(address, credentials, options=opts)
    interceptors: list[Any] = []
    if settings.worker_token is not None:
        header = ("authorization", f"Bearer {settings.worker_token.get_secret_value()}")
        interceptors = [_UnaryToken(header), _StreamToken(header), _StreamUnaryToken(header)]
        if not is_loopback(address):
            log.warning(
                "the worker token goes to %s in clear text: set KASSAY_WORKER_TLS_CA (and TLS "
                "on the worker) unless this network is private to you",
                address,
            )
    return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors or None)


__all__ = ["channel_credentials", "open_channel"]
