"""`kassay serve` as a process tree: SIGTERM (as a container runtime or systemd sends it) and
SIGINT (Ctrl-C) end the API, its worker and the worker's executor within a few seconds when
idle, and no process of the tree is left behind re-parented to init."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

#: "within a few seconds when idle": the worker drains nothing, the executor exits at once
EXIT_WITHIN_S = 8.0


def _children() -> dict[int, list[int]]:
    """pid -> its children's pids, from /proc (Linux)."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    tree = _children()
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree in /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_exits_with_its_worker_and_executor(procs, sig) -> None:
    serve = procs.serve(port=procs.free_port(), name=f"serve-{sig.name}")
    tree: list[int] = []
    try:
        procs.wait_ready(serve)
        # serve -> worker -> executor (and whatever those started): all must go
        tree = descendants(serve.pid)
        assert len(tree) >= 2, f"expected a worker and its executor under serve: {tree}"
        assert serve.popen is not None
        t0 = time.monotonic()
        serve.popen.send_signal(sig)
        code = serve.popen.wait(timeout=30)
        took = time.monotonic() - t0
        # the worker and the executor are gone too, not re-parented to init
        deadline = time.monotonic() + 2.0
        while any(alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [p for p in tree if alive(p)]
        assert not left, f"still running after serve exited: {left}\n{serve.tail()}"
        assert code == 0, serve.tail()
        print(f"serve exited {took:.2f} s after {sig.name}")
        assert took < EXIT_WITHIN_S, f"serve took {took:.1f} s to exit on {sig.name}"
    finally:
        # whatever this test started and left running goes (by pid, not by name)
        for pid in [*tree, *(descendants(serve.pid) if serve.alive() else [])]:
            if alive(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        serve.kill()
