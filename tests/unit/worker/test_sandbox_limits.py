"""What a command started through the sandbox launcher (`python -m kassay.worker.runner.sandbox`, as the
worker starts a sandboxed executor) gets: the resource limits (CPU time, open files, processes),
a scrubbed environment whose HOME and TMPDIR are its working directory, and that directory as its
cwd; and what Describe says about a host that cannot isolate the network."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from kassay.worker.runner.sandbox import Capabilities, SandboxConfig

_LAUNCHER = (sys.executable, "-m", "kassay.worker.runner.sandbox")

#: prints what the sandboxed process sees, then opens files until it may not
_PROBE = """
import errno, json, os, resource
seen = {
    "cpu": resource.getrlimit(resource.RLIMIT_CPU),
    "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
    "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0],
    "cwd": os.getcwd(),
    "env": sorted(os.environ),
    "home": os.environ.get("HOME"),
    "tmpdir": os.environ.get("TMPDIR"),
}
fds = []
try:
    while len(fds) < 10_000:
        fds.append(os.open(os.devnull, os.O_RDONLY))
except OSError as exc:
    seen["emfile"] = exc.errno == errno.EMFILE
seen["opened"] = len(fds)
print(json.dumps(seen))
"""


def _launch(
    workdir: Path, code: str, timeout: float = 60, **limits: int
) -> subprocess.CompletedProcess[str]:
    workdir.chmod(0o777)  # as root the code runs as nobody: its directory must be its own
    cfg = SandboxConfig(workdir=str(workdir), landlock=False, **limits)
    env = {**os.environ, "KASSAY_TEST_SECRET": "s3cret", "DATABASE_URL": "postgresql://x"}
    return subprocess.run(
        [*_LAUNCHER, "--config", json.dumps(asdict(cfg)), "--", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def test_limits_environment_and_working_directory(tmp_path: Path) -> None:
    done = _launch(tmp_path, _PROBE, cpu_s=30, nofile=64, nproc=100)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["cpu"] == [30, 35]  # SIGXCPU at the soft limit, SIGKILL 5 s later
    assert seen["nofile"] == [64, 64]
    assert seen["emfile"] is True and seen["opened"] < 64
    # as root the code runs as its own uid and gets the limit as set; as the worker's user the
    # limit counts that user's threads running now on top
    assert seen["nproc"] >= 100
    if os.geteuid() == 0:
        assert seen["nproc"] == 100
    assert seen["cwd"] == seen["home"] == seen["tmpdir"] == str(tmp_path)
    assert not [k for k in seen["env"] if k.startswith("KASSAY_") or "DATABASE" in k]


def test_cpu_time_limit_kills_a_spinning_process(tmp_path: Path) -> None:
    done = _launch(tmp_path, "while True: pass", timeout=30, cpu_s=1)
    assert done.returncode in (
        -signal.SIGXCPU,
        -signal.SIGKILL,
        128 + signal.SIGXCPU,
        128 + signal.SIGKILL,
    ), (done.returncode, done.stderr)


def test_describe_says_when_the_network_is_not_isolated() -> None:
    """A worker that is not root has no network namespace: Describe says what still holds."""
    cfg = SandboxConfig(workdir="/nonexistent")
    bare = Capabilities(root=False, landlock_abi=0, namespaces=False).describe(cfg)
    assert bare["network"] == "none" and bare["filesystem"] == "none"
    assert any("network is NOT isolated" in n for n in bare["notes"])
    assert any("writes are NOT confined" in n for n in bare["notes"])
    assert bare["user"] == "the worker's user" and bare["processes"] == "process-group"
    tcp = Capabilities(root=False, landlock_abi=4, namespaces=False).describe(cfg)
    assert tcp["network"] == "landlock-tcp"
    assert any("UDP and Unix sockets are not" in n for n in tcp["notes"])
    assert tcp["limits"] == {
        "cpu_s": cfg.cpu_s,
        "nofile": cfg.nofile,
        "nproc": cfg.nproc,
        "data_bytes": cfg.data_bytes,
        "fsize_bytes": cfg.fsize_bytes,
    }
