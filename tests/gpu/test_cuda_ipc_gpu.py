"""CUDA IPC between the trusted executor and the impl runner (kassay.worker.exchange.cuda_ipc,
kassay.worker.exchange.transports): tensors cross bit for bit in both directions without host
memory; what the borrower writes into lent inputs never reaches the lender's tensors; a header
pointing past the lent memory is refused before it is read; and an artifact on a CUDA worker
runs through IPC inside the sandbox (its results say `tensor_transport: cuda-ipc`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

ROOT = Path(__file__).resolve().parents[2]

#: the borrower: maps what the parent lent, checks it, scribbles on it, lends back x * 2, tries
#: a header past the end, and frees its own loan once the parent says it has taken it
CHILD = r"""
import json, sys, torch
from kassay.worker.exchange import cuda_ipc
from kassay.worker.exchange.transports import CudaIpcExchange
dev = torch.device("cuda:0")
ex = CudaIpcExchange(dev)
headers = json.loads(sys.stdin.readline())
views = ex.take_views(headers)
seen = {k: float(v.double().sum()) for k, v in views.items()}
back = ex.lend({"y": views["x"] * 2, "m": views["mask"].clone()}, "out")
views["x"].fill_(7.0)  # scribble on the lent inputs
ex.drop_views()
forged = dict(headers["x"], offset=headers["x"]["offset"] + (1 << 30))
try:
    CudaIpcExchange(dev).take_views({"x": forged})
    refused = ""
except cuda_ipc.IpcError as exc:
    refused = str(exc)
print(json.dumps({"seen": seen, "back": back, "refused": refused}), flush=True)
sys.stdin.readline()
ex.release_lent()
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "service"), str(ROOT / "client"), env.get("PYTHONPATH", "")]
    )
    return env


def test_tensors_cross_by_cuda_ipc_both_ways() -> None:
    from kassay.worker.exchange import cuda_ipc
    from kassay.worker.exchange.transports import CudaIpcExchange

    dev = torch.device("cuda:0")
    assert cuda_ipc.available(dev) == ""
    g = torch.Generator(device=dev).manual_seed(0)
    sent = {
        "x": torch.randn(1000, 33, device=dev, generator=g),
        "h": torch.randn(17, device=dev, generator=g).to(torch.bfloat16),
        "mask": torch.rand(5, device=dev, generator=g) > 0.5,
    }
    keep = {k: v.clone() for k, v in sent.items()}
    ex = CudaIpcExchange(dev)
    headers = ex.lend(sent, "in")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(json.dumps(headers) + "\n")
    child.stdin.flush()
    line = child.stdout.readline()
    assert line, f"the child gave no answer (exit {child.wait()})"
    reply = json.loads(line)
    for k, v in sent.items():
        assert reply["seen"][k] == pytest.approx(float(v.double().sum()), rel=1e-12), k
    got = ex.take_copies(reply["back"], max_bytes=1 << 30)
    child.stdin.write("taken\n")
    child.stdin.flush()
    assert child.wait(timeout=60) == 0
    ex.release_lent()
    assert torch.equal(got["y"], keep["x"] * 2)
    assert got["m"].dtype == torch.bool and torch.equal(got["m"], keep["mask"])
    # the child's scribbling reached neither the parent's tensors nor its copies
    for k, v in sent.items():
        assert torch.equal(v, keep[k]), k
    assert "past the lent" in reply["refused"], reply["refused"]


def test_an_artifact_on_cuda_runs_through_ipc_in_the_sandbox() -> None:
    """The executor of a group with an artifact lends the inputs by IPC to its sandboxed runner;
    an impl scribbles on them (and fails its own second run): torch beside it and an honest impl
    after it pass with the same numbers."""
    # not pytest's tmp_path: its parents are private to root, the sandbox's user could not enter
    tmp_path = Path(tempfile.mkdtemp(prefix="kassay-ipc-test-"))
    try:
        _artifact_on_cuda(tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _artifact_on_cuda(tmp_path: Path) -> None:
    from kassay.contract.spec import GroupSpec
    from kassay.impls import load
    from kassay.ops.registry import scoped
    from kassay.validate.engine import run_group
    from kassay.worker.executor.remote_impls import RemoteImpls
    from kassay.worker.runner.sandbox import SandboxConfig, probe

    module = tmp_path / "art" / "kassay_scribble_gpu.py"
    module.parent.mkdir()
    module.write_text(
        "from kassay.impls import Impl\nfrom kassay.ops import registry\n"
        "def _honest(inputs, params):\n"
        "    return registry._REGISTRY[('lse_merge', 'torch')].run(inputs, params)\n"
        "def _scribble(inputs, params):\n"
        "    out = {k: v.clone() for k, v in _honest(inputs, params).items()}\n"
        "    for t in inputs.values():\n"
        "        if t.is_floating_point():\n"
        "            t.fill_(7.0)\n"
        "    return out\n"
        "def impls():\n"
        "    return [Impl('lse_merge', 'g_scribble', _scribble),\n"
        "            Impl('lse_merge', 'g_honest', _honest)]\n"
    )
    dist = module.parent / "kassay_scribble_gpu-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kassay-scribble-gpu\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[kassay.impls]\nscribble = kassay_scribble_gpu:impls\n")
    workdir = tmp_path / "work"
    workdir.mkdir()
    caps = probe()
    cfg = SandboxConfig(
        workdir=str(workdir),
        namespaces=caps.namespaces,
        pid_namespace=False,
        landlock=caps.landlock_abi > 0,
        data_bytes=64 << 30,
    )
    if caps.root:
        for path in (tmp_path, workdir, module.parent, dist):
            os.chmod(path, 0o755)
        os.chown(workdir, cfg.uid, cfg.uid)
    dev = torch.device("cuda:0")
    load()
    remote = RemoteImpls(dev, str(workdir), cfg.to_json(), [str(module.parent)])
    try:
        assert remote.errors == [], remote.errors
        assert remote.exchange.name == "cuda-ipc"
        results = []
        group = GroupSpec(
            group_id="g",
            op="lse_merge",
            params={"T": 512, "Hh": 4, "D": 64, "K": 3, "dtype": "bfloat16"},
            impls=["torch", "g_scribble", "g_honest"],
        )
        # the executor registers a runner's impls for the length of a group (#42)
        with scoped(remote.impls) as refused:
            assert refused == {}, refused
            run_group(group, device=dev, on_result=results.append)
        status = {r.impl: (r.status, r.message[:300], r.ran_in) for r in results}
        assert status == {
            "torch": ("passed", "", "trusted"),
            "g_scribble": ("failed", status["g_scribble"][1], "sandbox"),
            "g_honest": ("passed", "", "sandbox"),
        }, status
        assert "second run" in status["g_scribble"][1]
        # IPC held: no fall-back to files after a refusal
        assert remote.exchange.name == "cuda-ipc"
        outs = {r.impl: [(o.max_abs, o.rel_l2) for o in r.outputs] for r in results}
        assert outs["g_honest"] == outs["torch"]
    finally:
        remote.close()
        for impl in remote.impls:
            from kassay.ops.registry import _REGISTRY

            _REGISTRY.pop((impl.op, impl.name), None)
