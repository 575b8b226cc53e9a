"""The store's schema version: Alembic migrations (shipped in kassay/api/store/migrations), the check an
API runs before it serves, and `kassay db upgrade`.

Rules:
- `upgrade(url)` brings any database to the newest revision: an empty one, one behind, and one
  made by kassay's `create_all` before migrations existed (no `alembic_version` table: the first
  revision creates only the tables such a database lacks, then the database is versioned).
  Concurrent upgrades of one database wait for each other (PostgreSQL: an advisory lock;
  SQLite: a lock file beside the database), so replicas or init containers may all run it.
- `ensure_current(engine, url)`, called when a Store opens: a database at the newest revision is
  used as it is; an *empty* SQLite database is upgraded on the spot (the embedded default,
  `kassay serve`, needs no extra step); anything else (an empty PostgreSQL database, a database
  behind, one made before migrations, one from a newer kassay) raises SchemaError with a message
  naming `kassay db upgrade`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.engine import make_url

from kassay.api.store.database import make_engine, sqlite_file

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
#: pg_advisory_lock key of schema upgrades (any constant unique to kassay will do)
_PG_LOCK_KEY = 0x6B617373_6179


class SchemaError(RuntimeError):
    """The database's schema is not the one this kassay needs; the message says what to run."""


@dataclass(frozen=True)
class SchemaState:
    """Where a database stands: its revision (None: unversioned), the newest this kassay has,
    and whether it holds any table at all."""

    current: str | None
    head: str
    empty: bool

    @property
    def up_to_date(self) -> bool:
        return self.current == self.head


def alembic_config(url: str | None = None) -> Config:
    """An Alembic Config on the packaged migrations (no alembic.ini needed)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if url is not None:
        # ConfigParser interpolation: a literal % in a password must be doubled
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "no migrations packaged"
    return head


def state(conn: Connection) -> SchemaState:
    current = MigrationContext.configure(conn).get_current_revision()
    tables = set(inspect(conn).get_table_names())
    return SchemaState(current=current, head=head_revision(), empty=not tables)


def safe_url(url: str) -> str:
    """The URL with any password hidden, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<the configured database URL>"


@contextlib.contextmanager
def _upgrade_lock(conn: Connection, url: str) -> Iterator[None]:
    """Held while one process checks and upgrades the schema."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK_KEY})
        conn.commit()
        try:
            yield
        finally:
            conn.rollback()  # a failed migration leaves the transaction aborted
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK_KEY})
            conn.commit()
        return
    path = sqlite_file(url)
    if path is None:  # in-memory SQLite, or a database no other process can open
        yield
        return
    fd = os.open(f"{path}.migrate-lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _run_upgrade(conn: Connection, revision: str) -> None:
    cfg = alembic_config()
    cfg.attributes["connection"] = conn
    command.upgrade(cfg, revision)
    conn.commit()


def upgrade_engine(engine: Engine, url: str, revision: str = "head") -> tuple[str | None, str]:
    """Upgrade the database behind `engine` to `revision`; (revision before, revision after)."""
    with engine.connect() as conn, _upgrade_lock(conn, url):
        before = state(conn).current
        _run_upgrade(conn, revision)
        after = MigrationContext.configure(conn).get_current_revision()
    assert after is not None
    return before, after


def upgrade(url: str, revision: str = "head") -> tuple[str | None, str]:
    """`kassay db upgrade`: bring the database at `url` to `revision` (default: the newest)."""
    engine = make_engine(url)
    try:
        return upgrade_engine(engine, url, revision)
    finally:
        engine.dispose()


def ensure_current(engine: Engine, url: str) -> SchemaState:
    """Refuse a database whose schema is not this kassay's (SchemaError); upgrade an empty
    SQLite database first. See the module's rules."""
    with engine.connect() as conn:
        st = state(conn)
        if st.up_to_date:
            return st
        if conn.dialect.name == "sqlite":
            # Read again under the lock: SQLite's DDL is not transactional here, so another
            # process upgrading the file right now shows some of its tables and no revision yet,
            # which alone reads as a database from before migrations. The first read's
            # transaction ends first: under the lock the read must see another process's
            # finished upgrade, not this connection's older snapshot (in WAL mode a write from
            # a stale snapshot fails at once).
            conn.rollback()
            with _upgrade_lock(conn, url):
                st = state(conn)
                if st.empty:
                    _run_upgrade(conn, "head")
                    st = state(conn)
            if st.up_to_date:
                return st
    raise SchemaError(behind_message(st, url))


def check_url(url: str) -> None:
    """ensure_current on a short-lived engine: what `kassay api` runs before it serves."""
    engine = make_engine(url)
    try:
        ensure_current(engine, url)
    finally:
        engine.dispose()


def behind_message(st: SchemaState, url: str) -> str:
    where = safe_url(url)
    cmd = f"kassay db upgrade --database-url '{where}'"
    if st.empty:
        return (
            f"the database {where} has no kassay schema yet; create it with `{cmd}` "
            "(or `kassay db upgrade` with KASSAY_DATABASE_URL set), then start the API"
        )
    if st.current is None:
        return (
            f"the database {where} was made by a kassay without schema migrations; run "
            f"`{cmd}` (or `kassay db upgrade` with KASSAY_DATABASE_URL set) to bring it to "
            f"revision {st.head}, then start the API"
        )
    known = {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}
    if st.current not in known:
        return (
            f"the database {where} is at schema revision {st.current}, which this kassay "
            f"(newest revision {st.head}) does not know: it was upgraded by a newer kassay; "
            "run that version"
        )
    return (
        f"the database {where} is at schema revision {st.current}, behind this kassay's "
        f"{st.head}; run `{cmd}` (or `kassay db upgrade` with KASSAY_DATABASE_URL set), "
        "then start the API"
    )
