"""Schema migrations (Alembic) on SQLite and on a real PostgreSQL server: from an empty database,
from the schema kassay's create_all made before migrations existed (tests/data), the refusal of a
database behind the schema (naming `kassay db upgrade`), and the migrations agreeing with
kassay.api.store.tables."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from kassay.api.store import SchemaError, Store
from kassay.api.store.migrate import alembic_config, head_revision, upgrade
from kassay.api.store.tables import metadata

ROOT = Path(__file__).resolve().parents[3]
BEFORE_MIGRATIONS = ROOT / "tests" / "data" / "schema_before_migrations"
TABLES = {
    "jobs",
    "job_labels",
    "groups",
    "cases",
    "artifacts",
    "job_artifacts",
    "case_keys",
    "comparisons",
    "revoked_sessions",
}


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/m.db"
    return str(request.getfixturevalue("pg_url"))


def _revision(url: str) -> str | None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def _load_schema_before_migrations(url: str) -> None:
    """Make the database kassay's create_all made before migrations, with one job in it."""
    dialect = "sqlite" if url.startswith("sqlite") else "postgresql"
    ddl = (BEFORE_MIGRATIONS / f"{dialect}.sql").read_text()
    statements = [s.strip() for s in ddl.split(";") if s.strip() and "CREATE" in s]
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            for stmt in statements:
                conn.exec_driver_sql("\n".join(x for x in stmt.splitlines() if x[:2] != "--"))
            conn.execute(
                text(
                    "INSERT INTO jobs (id, name, state, labels, spec, created_at, total, done, "
                    "passed, failed, error, crashed, timeout, unsupported, skipped, "
                    "cancel_requested, environments) VALUES ('job_old', 'old', 'finished', "
                    "'{}', '{}', :t, 0, 0, 0, 0, 0, 0, 0, 0, 0, false, '[]')"
                ),
                {"t": time.time()},
            )
    finally:
        engine.dispose()


def test_an_empty_database_upgrades_to_the_head_and_matches_the_tables(empty_url) -> None:
    assert upgrade(empty_url) == (None, head_revision())
    assert upgrade(empty_url) == (head_revision(), head_revision())  # again: nothing to do
    engine = create_engine(empty_url)
    try:
        with engine.connect() as conn:
            assert set(inspect(conn).get_table_names()) >= TABLES
            # what the revisions built is what kassay.api.store.tables declares: a change to the
            # tables without a new revision fails here
            diff = compare_metadata(MigrationContext.configure(conn), metadata)
        assert diff == []
    finally:
        engine.dispose()
    Store(empty_url).close()


def test_a_database_from_before_migrations_is_refused_then_adopted(empty_url) -> None:
    _load_schema_before_migrations(empty_url)
    with pytest.raises(SchemaError) as refused:
        Store(empty_url)
    assert "kassay db upgrade" in str(refused.value)
    assert "without schema migrations" in str(refused.value)
    assert upgrade(empty_url) == (None, head_revision())
    store = Store(empty_url)
    try:
        old = store.jobs.require_job("job_old")  # its rows survive
        assert old.name == "old" and old.state == "finished"
    finally:
        store.close()


def test_a_database_from_before_the_history_tables_gains_them(tmp_path) -> None:
    """Older still: only the first four tables (kassay before compare and artifacts)."""
    url = f"sqlite:///{tmp_path}/older.db"
    engine = create_engine(url)
    with engine.begin() as conn:
        metadata.create_all(conn, tables=[metadata.tables[t] for t in ("jobs", "groups")])
    engine.dispose()
    with pytest.raises(SchemaError):
        Store(url)
    upgrade(url)
    engine = create_engine(url)
    with engine.connect() as conn:
        assert set(inspect(conn).get_table_names()) >= TABLES
    engine.dispose()
    Store(url).close()


def test_an_empty_postgresql_database_is_refused_naming_the_command(pg_url) -> None:
    with pytest.raises(SchemaError) as refused:
        Store(pg_url)
    text_ = str(refused.value)
    assert "no kassay schema" in text_ and "kassay db upgrade --database-url" in text_
    assert _revision(pg_url) is None  # refused, not silently created


def test_an_empty_sqlite_file_is_upgraded_when_opened(tmp_path) -> None:
    """The embedded default (`kassay serve`) needs no extra step."""
    url = f"sqlite:///{tmp_path}/fresh.db"
    Store(url).close()
    assert _revision(url) == head_revision()


def test_a_database_behind_and_one_from_a_newer_kassay_are_refused(empty_url) -> None:
    upgrade(empty_url)
    engine = create_engine(empty_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'zzzz'"))
    engine.dispose()
    with pytest.raises(SchemaError, match="upgraded by a newer kassay"):
        Store(empty_url)
    # down to nothing and back: every revision has a working downgrade
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = :h"), {"h": head_revision()})
    engine.dispose()
    cfg = alembic_config(empty_url)
    command.downgrade(cfg, "base")
    assert _revision(empty_url) is None
    if not empty_url.startswith("sqlite"):  # an empty PostgreSQL database is refused
        with pytest.raises(SchemaError, match="kassay db upgrade"):
            Store(empty_url)
    command.upgrade(cfg, "head")
    Store(empty_url).close()


def _kassay(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "service"), str(ROOT / "client")])
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "kassay.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=e,
        check=False,
    )


def test_kassay_db_upgrade_and_the_api_refusing_to_start(empty_url) -> None:
    _load_schema_before_migrations(empty_url)
    api = _kassay("api", "--port", "1", "--database-url", empty_url)
    assert api.returncode == 2, api.stderr
    assert "kassay db upgrade" in api.stderr
    cur = _kassay("db", "current", env={"KASSAY_DATABASE_URL": empty_url})
    assert cur.returncode == 1 and "made before migrations" in cur.stdout
    up = _kassay("db", "upgrade", "--database-url", empty_url)
    assert up.returncode == 0, up.stderr
    assert f"upgraded from no revision to {head_revision()}" in up.stdout
    cur = _kassay("db", "current", "--database-url", empty_url)
    assert (
        cur.returncode == 0 and f"{head_revision()}; this kassay: {head_revision()}" in cur.stdout
    )
    bad = _kassay("db", "upgrade", "--database-url", "postgresql+psycopg://x:secret@127.0.0.1:1/x")
    assert bad.returncode == 2 and "secret" not in bad.stderr + bad.stdout


def test_the_migrations_ship_inside_the_package() -> None:
    """A pip install has them: they live under kassay/ and setuptools packages their files."""
    import tomllib

    from kassay.api.store import migrations

    folder = Path(migrations.__file__).parent
    assert (folder / "env.py").is_file() and (folder / "script.py.mako").is_file()
    assert list((folder / "versions").glob("0001_*.py"))
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = data["tool"]["setuptools"]["package-data"]["*"]
    assert "*.mako" in patterns  # the .py files are packages' modules (versions/__init__.py)
    assert (folder / "versions" / "__init__.py").is_file()


def test_an_api_opening_a_sqlite_file_another_is_upgrading_waits_for_it(tmp_path) -> None:
    """Two APIs on one new SQLite file: while the first one's upgrade is half done (some tables,
    no revision yet: SQLite's DDL is not transactional here), the second waits for it instead
    of taking the file for one made before migrations."""
    import fcntl
    import os
    import threading

    path = tmp_path / "shared.db"
    url = f"sqlite:///{path}"
    fd = os.open(f"{path}.migrate-lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # "the first API", mid-upgrade
    engine = create_engine(url)
    with engine.begin() as conn:
        metadata.create_all(conn, tables=[metadata.tables["jobs"]])
    engine.dispose()
    errors: list[BaseException] = []

    def second_api() -> None:
        try:
            Store(url).close()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=second_api)
    t.start()
    time.sleep(0.5)
    assert not errors, errors  # it waits rather than refusing the half-made file
    command.upgrade(alembic_config(url), "head")  # the first API finishes its upgrade
    os.close(fd)
    t.join(timeout=30)
    assert not t.is_alive() and not errors, errors
