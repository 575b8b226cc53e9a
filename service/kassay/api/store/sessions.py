"""Signed-out browser sessions. A session cookie is stateless (an expiry and an HMAC of it keyed
by a token: kassay.api.auth), so signing out records its HMAC until the cookie would have
expired; every replica sharing the database then refuses it."""

from __future__ import annotations

import time

from sqlalchemy import Engine, delete, insert, select
from sqlalchemy.exc import IntegrityError

from kassay.api.store.tables import revoked_sessions


class Sessions:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def revoke(self, mac: str, expires_at: float) -> None:
        """Refuse the session with this HMAC from now until `expires_at` (idempotent); the
        entries of sessions expired anyway are pruned."""
        with self.engine.begin() as conn:
            conn.execute(
                delete(revoked_sessions).where(revoked_sessions.c.expires_at < time.time())
            )
            try:
                with conn.begin_nested():
                    conn.execute(insert(revoked_sessions).values(mac=mac, expires_at=expires_at))
            except IntegrityError:  # signed out twice
                pass

    def revoked(self, mac: str) -> bool:
        with self.engine.connect() as conn:
            return (
                conn.execute(
                    select(revoked_sessions.c.mac).where(revoked_sessions.c.mac == mac)
                ).first()
                is not None
            )
