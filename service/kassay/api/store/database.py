"""The store's database connection: a SQLAlchemy engine for any URL, SQLite tuned for many
readers and one writer at a time (WAL journal)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event

#: how long a new connection keeps trying to switch a new file to WAL
WAL_SWITCH_S = 10.0


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=10000")
    # WAL is a property of the file, set once. Switching to it answers "database is locked"
    # at once, without the busy handler, while another connection holds a lock on the new
    # file: replicas opening one new database together hit it (1 time in ~40 with six), so
    # the switch is retried
    (mode,) = cur.execute("PRAGMA journal_mode").fetchone()
    deadline = time.monotonic() + WAL_SWITCH_S
    while str(mode).lower() != "wal":
        try:
            cur.execute("PRAGMA journal_mode=WAL")  # an in-memory database stays "memory"
            break
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(url: str) -> Engine:
    """An engine for `url`; for SQLite, create the file's folder and switch on WAL."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 10})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True)


def sqlite_file(url: str) -> str | None:
    """The path of a SQLite file database, None for any other URL (and for :memory:)."""
    path = url.split("///", 1)[1] if url.startswith("sqlite:///") else ""
    return path if path and path != ":memory:" else None
