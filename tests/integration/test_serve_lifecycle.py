"""`kassay serve` as a process tree: SIGTERM (as a container runtime or systemd sends it) and
SIGINT (Ctrl-C) end the API, its worker and the worker's executor within a few seconds when
idle, and no process of the tree is left behind re-parented to init."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
from users import KASSAY

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


# ------------------------------------------------------------------------- --gpus


def _serve_args(tmp_path: Path, gpus: str) -> argparse.Namespace:
    from kassay.cli.api import build_serve_parser

    return build_serve_parser().parse_args(
        ["--gpus", gpus, "--port", "0", "--data-dir", str(tmp_path / "data")]
    )


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc/PID/environ")
def test_gpus_start_one_worker_per_gpu(tmp_path, monkeypatch) -> None:
    """--gpus all on a host with three GPUs (the enumeration answers three: the only fake) and
    --gpus 0,2: one worker process per GPU, each seeing only its own as cuda:0 on a port of its
    own, and the API dispatching to all of them."""
    from kassay.cli import api as cli

    monkeypatch.setattr(cli, "visible_gpus", lambda env=None: ["0", "1", "2"])
    for spec, expected in (("all", ["0", "1", "2"]), ("0,2", ["0", "2"])):
        emb = cli._embedded(_serve_args(tmp_path, spec), "serve")
        assert emb is not None
        emb.start_workers()
        try:
            seen = []
            for w in emb.workers:
                assert w.proc is not None
                env = _environ(w.proc.pid)
                argv = Path(f"/proc/{w.proc.pid}/cmdline").read_bytes().split(b"\0")
                seen.append(env["CUDA_VISIBLE_DEVICES"])
                assert b"cuda:0" in argv and w.address.encode() in argv
                assert env["KASSAY_WORKER_ID"].endswith(f":gpu{env['CUDA_VISIBLE_DEVICES']}")
            assert seen == expected
            assert len({w.port for w in emb.workers}) == len(expected)
            settings = emb.make_server().config.app.state.settings
            assert settings.workers == [w.address for w in emb.workers]
        finally:
            emb.stop_worker()
        assert all(w.proc is not None and w.proc.poll() is not None for w in emb.workers)


def test_gpus_on_a_host_without_gpus(procs) -> None:
    """`--gpus all` with no GPU visible: one CPU worker and a word about it; a count it cannot
    meet is refused at once (exit 2)."""
    import subprocess

    env = procs.env({"CUDA_VISIBLE_DEVICES": "", "KASSAY_WORKER_POLL_S": "0.5"})
    refused = subprocess.run(
        [*KASSAY, "serve", "--gpus", "2", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=procs.tmp,
    )
    assert refused.returncode == 2 and "--gpus 2: 0 GPU(s) visible" in refused.stderr

    port = procs.free_port()
    serve = procs.serve(port=port, name="serve-gpus-all", extra=["--gpus", "all"], env=env)
    try:
        procs.wait_ready(serve)
        import httpx

        workers = httpx.get(f"{serve.extra['url']}/v1/workers").json()
        assert [w["device"] for w in workers] == ["cpu"]
        assert "no GPU visible" in serve.tail()
    finally:
        serve.stop()
