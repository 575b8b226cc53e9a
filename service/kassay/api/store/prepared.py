"""One hot read on PostgreSQL outside SQLAlchemy: a server-side prepared statement over a few
plain psycopg connections.

The status read (GET /v1/jobs/{id}, polled by CI) through SQLAlchemy pays for its compiler, a
pool checkout and the pool's pre-ping round trip on every call. Here each connection prepares
the statement once (psycopg keeps it per connection) and a read is one round trip. There is no
pre-ping: a connection the server dropped (restart, idle timeout, pg_terminate_backend) fails
on use, and the read is retried once on a new connection.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row
from sqlalchemy import Engine


class PreparedRead:
    """`sql` (with %s placeholders) run as a prepared statement; rows come back as dicts whose
    values are decoded as the engine decodes them (its psycopg adapters: JSON to dicts).

    Connections are opened on demand and at most `keep` idle ones are kept for the next reads
    (deque pop/append are atomic, so threads share them without a lock), so a replica holds a
    few connections, not one per thread of its pools.
    """

    def __init__(self, engine: Engine, sql: str, *, keep: int = 4) -> None:
        args, kwargs = engine.dialect.create_connect_args(engine.url)
        # autocommit: a read must not leave its session idle in a transaction
        self._connect = functools.partial(
            psycopg.connect, *args, **kwargs, autocommit=True, row_factory=dict_row
        )
        self._sql = sql
        self._keep = keep
        self._idle: deque[psycopg.Connection[dict[str, Any]]] = deque()
        self._closed = False

    def fetchone(self, params: Sequence[Any]) -> dict[str, Any] | None:
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self._connect()
        try:
            row = conn.execute(self._sql, params, prepare=True).fetchone()
        except psycopg.OperationalError:
            conn.close()
            conn = self._connect()
            try:
                row = conn.execute(self._sql, params, prepare=True).fetchone()
            except BaseException:
                conn.close()
                raise
        except BaseException:
            conn.close()
            raise
        if self._closed or len(self._idle) >= self._keep:
            conn.close()
        else:
            self._idle.append(conn)
        return row

    def close(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()
