"""The sandbox's PID namespace: on for CPU executors, off for GPU ones (CUDA fails to initialise
in a new PID namespace: error 304 on the H200, research/NOTES-probes.md (sandbox_cuda_probe))."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from dataclasses import asdict

import pytest

from kassay.worker.runner.sandbox import Capabilities, SandboxConfig, probe
from kassay.worker.server.supervisor import Supervisor

_LAUNCHER = (sys.executable, "-m", "kassay.worker.runner.sandbox")
_NSPID = "print([ln for ln in open('/proc/self/status') if ln.startswith('NSpid')][0].split()[1:])"


def _levels(tmp_path, pid_namespace: bool) -> int:
    """How many PID namespaces deep the sandboxed command runs (1: the host's)."""
    os.chmod(tmp_path, 0o777)
    cfg = SandboxConfig(workdir=str(tmp_path), pid_namespace=pid_namespace, landlock=False)
    out = subprocess.run(
        [*_LAUNCHER, "--config", json.dumps(asdict(cfg)), "--", sys.executable, "-c", _NSPID],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return len(ast.literal_eval(out))


@pytest.mark.skipif(not probe().namespaces, reason="namespaces need root and a host that allows")
def test_pid_namespace_only_where_asked(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "gpu").mkdir()
    assert _levels(tmp_path / "cpu", True) == 2
    assert _levels(tmp_path / "gpu", False) == 1


def test_a_gpu_worker_keeps_the_host_pid_namespace_and_says_so():
    cpu = Supervisor(device="cpu", worker_id="w")
    gpu = Supervisor(device="cuda:0", worker_id="w")
    assert cpu.sandbox_config.pid_namespace and not gpu.sandbox_config.pid_namespace
    caps = Capabilities(root=True, landlock_abi=6, namespaces=True)
    assert caps.describe(cpu.sandbox_config)["processes"] == "pid-namespace"
    box = caps.describe(gpu.sandbox_config)
    assert box["processes"] == "process-group" and box["network"] == "namespace"
    assert any("CUDA" in n for n in box["notes"])
