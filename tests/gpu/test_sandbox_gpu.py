"""Artifact code on CUDA inside the sandbox: a module artifact whose impl launches a Triton kernel
(compiled in the sandbox's working directory, under its rlimits and Landlock) runs next to torch
and passes; the sandboxed executor is gone afterwards."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
import torch

from kassay.settings import Settings

#: sandboxes run as users of their own from this uid up
SANDBOX_UID = Settings().sandbox_uid

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

ROOT = Path(__file__).resolve().parents[2]

#: the artifact: the example package's merge kernel inlined (the sandbox reads only its own
#: artifact and Python's installation, not this repository) and an impl using it
MODULE = ROOT / "examples" / "kernel-package" / "src" / "kassay_example_kernels" / "merge.py"
MODULE_IMPLS = """

from kassay.impls import Impl
from kassay.ops.lse_merge.harness import as_run, supports_modes


def _merge(outs, lses, *, lse_layout, accumulate):
    return merge_states(outs, lses, lse_layout=lse_layout)


def impls():
    return [Impl("lse_merge", "gpu_example_merge", as_run(merge=_merge),
                 supports=supports_modes(merge=True, update=False))]
"""


def test_a_triton_artifact_runs_sandboxed_on_cuda(tmp_path: Path) -> None:
    from kassay.artifacts import sha256
    from kassay.contract.spec import GroupSpec
    from kassay.worker.runner.sandbox import SandboxConfig
    from kassay.worker.server.active_group import RunHandle
    from kassay.worker.server.artifact_cache import ArtifactCache
    from kassay.worker.server.supervisor import Supervisor

    data = (MODULE.read_text() + MODULE_IMPLS).encode()
    digest = sha256(data)
    cache = ArtifactCache(tmp_path / "artifacts", max_bytes=1 << 20)
    cache.put(digest, "gpu_example.py", [data])
    results = []

    class Sink:
        def started(self, *a: object) -> None: ...

        def result(self, r: object) -> None:
            results.append(r)

        def done(self, *a: object) -> None: ...

        def finished(self) -> None:
            finished.set()

    async def run() -> None:
        sup = Supervisor(
            device="cuda:0",
            worker_id="gpu-test",
            artifacts=cache,
            sandbox_config=SandboxConfig(workdir="", data_bytes=64 << 30),
        )
        await sup.start()
        try:
            print("sandbox:", sup.sandbox_info())
            group = GroupSpec(
                group_id="g",
                op="lse_merge",
                params={"T": 1024, "Hh": 8, "D": 128, "K": 4, "dtype": "bfloat16"},
                impls=["torch", "gpu_example_merge"],
                artifacts=[digest],
            )
            sup.submit(RunHandle(run_id="r", sink=Sink()), [group])
            await asyncio.wait_for(finished.wait(), 600)
        finally:
            await sup.close()

    finished = asyncio.Event()
    asyncio.run(run())
    status = {r.impl: (r.status, r.message[:500]) for r in results}
    assert status == {"torch": ("passed", ""), "gpu_example_merge": ("passed", "")}, status
    assert all(r.environment.model_extra["artifacts"] == [digest] for r in results)
    # nothing of the sandbox's user runs on; an exited process the container's init has not
    # reaped yet (a zombie: no GPU executor has a PID namespace to reap it) runs nothing
    deadline = time.monotonic() + 10
    while (leftovers := _running_as_sandbox()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not leftovers, leftovers


def _running_as_sandbox() -> list[str]:
    out = []
    for pid in os.listdir("/proc"):
        try:
            if not pid.isdigit() or os.stat(f"/proc/{pid}").st_uid < SANDBOX_UID:
                continue
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z":
                out.append(Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " "))
        except OSError:
            pass
    return out
