"""A throwaway PostgreSQL server for tests and benchmarks: initdb + pg_ctl into a temporary
folder, listening on a free loopback port only, trust authentication, fsync off.

PostgreSQL refuses to run as root, so when the tests run as root (CI does) the server runs as
the `postgres` user Debian's package creates (or `nobody`), in a folder it owns. The server
binaries are looked up on PATH, then under /usr/lib/postgresql/*/bin (Debian's layout, which is
not on PATH). `find_binaries()` says why when there are none, for the skip reason.

Used by tests/conftest.py (fixtures `postgres_server`, `pg_url`) and bench/store_throughput.py.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from kassay.ports import free_port as _free_port

INSTALL_HINT = "install Debian's postgresql package (apt-get install -y postgresql)"
SUPERUSER = "kassay"


def find_binaries() -> tuple[Path | None, str]:
    """(the folder holding initdb, pg_ctl and postgres, or None; why not when None)."""
    on_path = shutil.which("initdb")
    candidates = [Path(on_path).parent] if on_path else []
    # Debian: /usr/lib/postgresql/<major>/bin, newest major first
    debian = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates += [Path(p) for p in debian]
    for folder in candidates:
        if all((folder / b).exists() for b in ("initdb", "pg_ctl", "postgres")):
            return folder, ""
    return None, f"no PostgreSQL server binaries (initdb, pg_ctl) found: {INSTALL_HINT}"


def _run_as() -> pwd.struct_passwd | None:
    """The user to run the server as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("running as root and no 'postgres' or 'nobody' user to run PostgreSQL as")


class PostgresServer:
    """One server; `url(db)` names a database on it, `create_database()` makes a fresh one."""

    def __init__(self, bindir: Path, *, max_connections: int = 300) -> None:
        self.bindir = bindir
        self.max_connections = max_connections
        self.port = 0
        self.root = Path(tempfile.mkdtemp(prefix="kassay-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._user = _run_as()

    def _cmd(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        kw: dict[str, object] = {}
        if self._user is not None:
            kw = {"user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}
        return subprocess.run(
            list(args),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=self.root,
            env={**os.environ, "LC_ALL": "C", "LANG": "C"},
            **kw,  # type: ignore[arg-type]
        )

    def start(self) -> PostgresServer:
        if self._user is not None:
            os.chown(self.root, self._user.pw_uid, self._user.pw_gid)
        init = self._cmd(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--no-sync",
        )
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed: {init.stdout}{init.stderr}")
        for attempt in range(5):  # the port may be taken between choosing and binding it
            self.port = _free_port()
            opts = (
                f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
                f"-c max_connections={self.max_connections} -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off"
            )
            started = self._cmd(
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-o",
                opts,
                "-w",
                "-t",
                "60",
                "start",
            )
            if started.returncode == 0:
                return self
            if attempt == 4:
                raise RuntimeError(
                    f"pg_ctl start failed: {started.stdout}{started.stderr}\n{self.log_tail()}"
                )
            time.sleep(0.2)
        return self

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, prefix: str = "t") -> str:
        """A new empty database; returns its SQLAlchemy URL."""
        import psycopg

        name = f"{prefix}_{secrets.token_hex(6)}"
        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname=postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.data.exists():
            self._cmd(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
