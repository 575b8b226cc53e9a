"""How tests start kassay: as its users do (#38). The console script the install put next to
this Python (`.venv/bin/kassay`), never `python -m` from the source tree; an environment with
nothing a user's shell lacks (no PYTHONPATH onto the sources, no TRITON_INTERPRET: a CPU
executor sets that itself); the working directory is each test's own folder, outside the
repository."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

_SCRIPT = Path(sys.executable).with_name("kassay")
if not _SCRIPT.exists():  # pragma: no cover - an install without its console script
    raise RuntimeError(
        f"no kassay console script beside {sys.executable}: install kassay (make venv)"
    )

#: the command a user types
KASSAY = [str(_SCRIPT)]

#: what the test process has that a user's shell does not
_NOT_A_USERS = ("PYTHONPATH", "TRITON_INTERPRET")


def user_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment less what only a test set-up has, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in _NOT_A_USERS}
    env.update(extra or {})
    return env


def run_on_a_terminal(cmd: list[str], **kw: object) -> tuple[int, str]:
    """Run `cmd` with its stdout on a pseudo-terminal, as a user at a shell sees it (commands
    print tables there, CI lines to a pipe): its exit code and what it printed."""
    import pty
    import threading

    master, slave = pty.openpty()
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed its end
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        done = subprocess.run(cmd, stdout=slave, stderr=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]
    finally:
        os.close(slave)
    reader.join(timeout=10)
    os.close(master)
    return done.returncode, b"".join(chunks).decode(errors="replace")


def wait_serve_ready(
    url: str, serve: subprocess.Popen[bytes], log: Path, timeout: float = 180
) -> None:
    """Wait until a `kassay serve` at `url` reports a worker up on /readyz; fail with the tail
    of its log if it exits or is not ready in `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert serve.poll() is None, log.read_text()[-3000:]
        try:
            r = httpx.get(f"{url}/readyz", timeout=2.0)
            if r.status_code == 200 and r.json().get("workers_up", 0) >= 1:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    pytest.fail(f"kassay serve not ready:\n{log.read_text()[-3000:]}")
