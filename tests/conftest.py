"""Test-wide set-up.

TRITON_INTERPRET must be set before any Triton kernel module is imported, so it is decided here
from a cheap probe (no torch import) rather than from torch.cuda.is_available().

PostgreSQL: one throwaway server per test session (tests/pgserver.py, started on first use) and
a new database per test (`pg_url`).
"""

import os
import shutil
from collections.abc import Iterator

import pytest
from pgserver import PostgresServer, find_binaries

if shutil.which("nvidia-smi") is None and not os.environ.get("CUDA_VISIBLE_DEVICES"):
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server of its own on a free loopback port; skipped, saying why, where the
    server binaries or the psycopg driver are missing (`make test` installs both)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed: pip install 'kassay[postgres]'")
    bindir, why = find_binaries()
    if bindir is None:
        pytest.skip(why)
    server = PostgresServer(bindir).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(postgres_server: PostgresServer) -> str:
    """The URL of a new, empty database on the session's PostgreSQL server."""
    return postgres_server.create_database()
