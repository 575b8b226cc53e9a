"""Bearer-token auth. With no token configured everything is open. With tokens configured,
writes (submit, cancel) need a write token: no or unknown token → 401, a read-only token → 403;
reads need any token unless `open_reads` is set.

Code (uploading artifacts, submitting a job that names them) is a separate scope: with
`code_tokens` configured it needs one of them (a write or read token gets 403); without, it is
allowed only where `allow_code` is set (`kassay serve` on one machine), to whoever may write.
A code token may also do everything a write token does.

The dependencies are `async def` on purpose: FastAPI runs plain `def` dependencies in a thread,
a hop that costs more than the check itself."""

from __future__ import annotations

import hmac

from fastapi import Request

from kassay.errors import AuthError, ForbiddenError, KassayError
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
    if _known(token, s.api_tokens) or _known(token, s.code_tokens):
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
    if not any(_known(token, t) for t in (s.api_tokens, s.read_tokens, s.code_tokens)):
        raise AuthError("unknown token")


def code_denial(request: Request) -> KassayError | None:
    """Why this request may not bring code (None when it may). Raised by the caller only when
    the request does bring code: a plain job needs no code scope."""
    s = _settings(request)
    if s.code_tokens:
        try:
            token = _token(request)
        except AuthError as exc:
            return exc
        if token is None:
            return AuthError("code (artifacts) needs 'Authorization: Bearer <code token>'")
        if _known(token, s.code_tokens):
            return None
        if _known(token, s.api_tokens) or _known(token, s.read_tokens):
            return ForbiddenError(
                "this token may not submit code: artifacts and jobs that name them need a "
                "token with the code scope (KASSAY_CODE_TOKENS)"
            )
        return AuthError("unknown token")
    if s.allow_code:
        return None
    return ForbiddenError(
        "this server accepts no code: artifacts need KASSAY_CODE_TOKENS (a deployment) or "
        "KASSAY_ALLOW_CODE=true (one machine; `kassay serve` sets it)"
    )


async def require_code(request: Request) -> None:
    """FastAPI dependency of the artifact upload: a writer with the code scope."""
    await require_write(request)
    denial = code_denial(request)
    if denial is not None:
        raise denial
