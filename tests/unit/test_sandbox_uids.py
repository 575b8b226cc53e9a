"""Each running sandbox gets a user of its own (#31): RLIMIT_NPROC counts processes per user
across the host, so with one shared user a busy job's code spent another's process limit
(`pthread_create failed` in a real artifact's cases under load). A run's impl runner keeps its
user (and its lease) for all the run's groups (#42) and gives it back when the run ends."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from kassay.worker.runner_leases import RunnerLeases
from kassay.worker.sandbox import SandboxConfig


class _Cache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def install(self, digest: str) -> Path:
        path = self.root / digest
        path.mkdir(exist_ok=True)
        return path


def test_runs_at_once_get_distinct_users_and_give_them_back(tmp_path: Path) -> None:
    host = SimpleNamespace(
        sandbox_config=SandboxConfig(workdir="", uid=2_100_000_000),
        sandbox_uids=set(),
        sandbox_caps=None,
        artifacts=_Cache(tmp_path),
    )
    leases = RunnerLeases(host)  # type: ignore[arg-type]

    def lease(run: str, digests: list[str]):  # type: ignore[no-untyped-def]
        return asyncio.run(leases.lease(run, digests))

    a, b = lease("run-a", ["d1"]), lease("run-b", ["d1"])
    assert (a.config.uid, b.config.uid) == (2_100_000_000, 2_100_000_001)
    assert lease("run-a", ["d1"]) is a  # the run's later groups keep its runner and user
    assert a.workdir != b.workdir and Path(a.workdir).is_dir()
    assert a.paths == {"d1": str(tmp_path / "d1")}
    assert leases.release_run("run-a") == [a.key]
    assert not Path(a.workdir).exists()
    c = lease("run-c", ["d1"])
    assert c.config.uid == 2_100_000_000  # free again
    assert host.sandbox_uids == {0, 1}
    leases.release_all()
    assert host.sandbox_uids == set() and not Path(b.workdir).exists()
