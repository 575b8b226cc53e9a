"""Bearer-token auth. With no token configured everything is open. With tokens configured,
writes (submit, cancel) need a write token: no or unknown token → 401, a read-only token → 403;
reads need any token unless `open_reads` is set.

Code (uploading artifacts, submitting a job that names them) is a separate scope: with
`code_tokens` configured it needs one of them (a write or read token gets 403); without, it is
allowed only where `allow_code` is set (`kassay serve` on one machine), to whoever may write.
A code token may also do everything a write token does.

A browser cannot send a bearer header (a link, an EventSource), so a token may also sign a
browser in (POST /login): the session cookie it gets grants reads only, whatever the token's
scope (a cookie rides along with cross-site requests; writes keep needing the header, so a
forged form cannot submit or cancel). The cookie holds an expiry, a nonce and an HMAC of both keyed by the
token, never the token: it stops working when the token is removed from the settings.

The dependencies are `async def` on purpose: FastAPI runs plain `def` dependencies in a thread,
a hop that costs more than the check itself."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable

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


SESSION_COOKIE = "kassay_session"


def _all_tokens(s: Settings) -> list[str]:
    return [*s.api_tokens, *s.read_tokens, *s.code_tokens]


def _session_mac(token: str, expires: int, nonce: str) -> str:
    return hmac.new(
        token.encode(), f"kassay-session:{expires}:{nonce}".encode(), hashlib.sha256
    ).hexdigest()


def reads_locked(s: Settings) -> bool:
    """Whether reads need a token (or a signed-in browser)."""
    return not s.open_reads and bool(s.api_tokens or s.read_tokens)


def known_token(s: Settings, token: str) -> bool:
    return any(_known(token, t) for t in (s.api_tokens, s.read_tokens, s.code_tokens))


def session_cookie(s: Settings, token: str, now: float | None = None) -> tuple[str, int]:
    """(the cookie value that signs a browser in with `token`, its lifetime in seconds)."""
    max_age = int(s.session_hours * 3600)
    expires = int(now if now is not None else time.time()) + max_age
    # a nonce per sign-in: a session signed out stays refused while the next one reads
    nonce = secrets.token_hex(8)
    return f"{expires}.{nonce}.{_session_mac(token, expires, nonce)}", max_age


def _session_parts(s: Settings, value: str | None, now: float | None) -> tuple[str, int] | None:
    """(HMAC, expiry) of a session cookie that is unexpired and made with a token the settings
    still hold, else None."""
    if not value:
        return None
    expires_text, _, rest = value.partition(".")
    nonce, _, mac = rest.partition(".")
    if not expires_text.isdigit() or len(expires_text) > 12 or len(mac) != 64:
        return None
    if len(nonce) != 16 or any(ch not in "0123456789abcdef" for ch in nonce):
        return None
    expires = int(expires_text)
    if expires < (now if now is not None else time.time()):
        return None
    if not any(
        hmac.compare_digest(mac.encode(), _session_mac(t, expires, nonce).encode())
        for t in _all_tokens(s)
    ):
        return None
    return mac, expires


def valid_session(
    s: Settings,
    value: str | None,
    now: float | None = None,
    revoked: Callable[[str], bool] | None = None,
) -> bool:
    """Whether a session cookie is unexpired, made with a token the settings still hold and,
    given `revoked` (the store's record of signed-out sessions), not signed out."""
    parts = _session_parts(s, value, now)
    return parts is not None and not (revoked is not None and revoked(parts[0]))


def sign_out(request: Request) -> None:
    """Record the request's session (if any) as signed out, for every replica."""
    parts = _session_parts(_settings(request), request.cookies.get(SESSION_COOKIE), None)
    if parts is not None:
        request.app.state.services.store.sessions.revoke(*parts)


def may_read(request: Request) -> bool:
    """Whether the request may read: open reads, a known bearer token or a signed-in browser.
    Raises AuthError for a malformed Authorization header."""
    s = _settings(request)
    if not reads_locked(s):
        return True
    token = _token(request)
    if token is not None:
        return known_token(s, token)
    store = request.app.state.services.store
    return valid_session(s, request.cookies.get(SESSION_COOKIE), revoked=store.sessions.revoked)


async def require_read(request: Request) -> None:
    """FastAPI dependency of every read route: a bearer token, or a browser's session cookie."""
    if may_read(request):
        return
    if _token(request) is None:
        raise AuthError("this call needs 'Authorization: Bearer <token>' (or sign in at /login)")
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


class LoginThrottle:
    """Failed sign-ins per client address over a sliding window: past `limit` failures within
    `window_s`, that address may not try again until the oldest leaves the window (a token is
    not to be guessed at the speed of the server). Kept in the replica's memory, so a client
    spread over N replicas gets N times the tries; one route's counter did not seem worth a
    dependency (slowapi counts every request, not failures). The table is bounded: past
    MAX_ADDRESSES the stalest addresses are forgotten."""

    MAX_ADDRESSES = 10_000

    def __init__(self, limit: int, window_s: float) -> None:
        self.limit, self.window_s = limit, window_s
        self._fails: dict[str, list[float]] = {}

    def _recent(self, who: str, now: float) -> list[float]:
        times = [t for t in self._fails.get(who, ()) if now - t < self.window_s]
        if times:
            self._fails[who] = times
        else:
            self._fails.pop(who, None)
        return times

    def retry_after(self, who: str, now: float | None = None) -> float | None:
        """Seconds until `who` may try again, or None when it may now."""
        now = time.monotonic() if now is None else now
        times = self._recent(who, now)
        if len(times) < self.limit:
            return None
        return max(times[-self.limit] + self.window_s - now, 0.0)

    def failed(self, who: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._recent(who, now)
        if who not in self._fails and len(self._fails) >= self.MAX_ADDRESSES:
            stalest = min(self._fails, key=lambda k: self._fails[k][-1])
            del self._fails[stalest]
        self._fails.setdefault(who, []).append(now)
