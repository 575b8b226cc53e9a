"""Bearer-token auth. With no token configured everything is open. With tokens configured,
writes (submit, cancel) need a write token: no or unknown token → 401, a read-only token → 403;
reads need any token unless `open_reads` is set.

The dependencies are `async def` on purpose: FastAPI runs plain `def` dependencies in a thread,
a hop that costs more than the check itself."""

from __future__ import annotations

import hmac

from fastapi import Request

from kassay.errors import AuthError, ForbiddenError
from kassay.settings import Settings


def _token(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise AuthError("the Authorization header must be 'Bearer <token>'")
    return value.strip()


def _known(token: str, tokens: list[str]) -> bool:
    return any(hmac.compare_digest(token.encode(), t.encode()) for t in tokens)


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def require_write(request: Request) -> None:
    """FastAPI dependency of submit and cancel."""
    s = _settings(request)
    if not s.api_tokens and not s.read_tokens:
        return
    token = _token(request)
    if token is None:
        raise AuthError("this call needs 'Authorization: Bearer <token>'")
    if _known(token, s.api_tokens):
        return
    if _known(token, s.read_tokens):
        raise ForbiddenError(
            "this token may only read; submitting and cancelling need a write token"
        )
    raise AuthError("unknown token")


async def require_read(request: Request) -> None:
    """FastAPI dependency of every read route."""
    s = _settings(request)
    if s.open_reads or (not s.api_tokens and not s.read_tokens):
        return
    token = _token(request)
    if token is None:
        raise AuthError("this call needs 'Authorization: Bearer <token>'")
    if not (_known(token, s.api_tokens) or _known(token, s.read_tokens)):
        raise AuthError("unknown token")
