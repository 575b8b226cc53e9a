"""Each running sandbox gets a user of its own (#31): RLIMIT_NPROC counts processes per user
across the host, so with one shared user a busy job's code spent another's process limit
(`pthread_create failed` in a real artifact's cases under load). A job's impl runner keeps its
user (and its lease) for all the job's groups, across the several runs the API sends them in
(#42), and gives it back when the job's last run ends, or when no run of the job came for a
while."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from kassay.worker.runner.sandbox import SandboxConfig
from kassay.worker.server.runner_leases import RunnerLease, RunnerLeases


class _Cache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def install(self, digest: str) -> Path:
        path = self.root / digest
        path.mkdir(exist_ok=True)
        return path


@dataclass
class _Run:
    run_id: str
    job_id: str
    job_last: bool = False


def _leases(tmp_path: Path) -> tuple[RunnerLeases, SimpleNamespace]:
    host = SimpleNamespace(
        sandbox_config=SandboxConfig(workdir="", uid=2_100_000_000),
        sandbox_uids=set(),
        sandbox_caps=None,
        artifacts=_Cache(tmp_path),
    )
    return RunnerLeases(host), host  # type: ignore[arg-type]


def _lease(leases: RunnerLeases, run: _Run, digests: list[str]) -> RunnerLease:
    return asyncio.run(leases.lease(run, digests))


def test_jobs_at_once_get_distinct_users_and_give_them_back(tmp_path: Path) -> None:
    leases, host = _leases(tmp_path)
    a1, b1 = _Run("a1", "job-a", job_last=True), _Run("b1", "job-b", job_last=True)
    a, b = _lease(leases, a1, ["d1"]), _lease(leases, b1, ["d1"])
    assert (a.config.uid, b.config.uid) == (2_100_000_000, 2_100_000_001)
    assert _lease(leases, a1, ["d1"]) is a  # the run's later groups keep its runner and user
    assert a.workdir != b.workdir and Path(a.workdir).is_dir()
    assert a.paths == {"d1": str(tmp_path / "d1")}
    assert leases.ending_with(a1) == [a.key]
    assert leases.release_run(a1) == ([a.key], [])
    assert not Path(a.workdir).exists()
    c = _lease(leases, _Run("c1", "job-c"), ["d1"])
    assert c.config.uid == 2_100_000_000  # free again
    assert host.sandbox_uids == {0, 1}
    assert sorted(leases.release_all()) == sorted([b.key, c.key])
    assert host.sandbox_uids == set() and not Path(b.workdir).exists()


def test_the_runs_of_one_job_share_its_runner_until_its_last(tmp_path: Path) -> None:
    """The API sends a job's 22 groups in runs of 4; a runner per run started 6 (#42)."""
    leases, _ = _leases(tmp_path)
    r1, r2, r3 = _Run("r1", "job"), _Run("r2", "job"), _Run("r3", "job", job_last=True)
    first = _lease(leases, r1, ["d1", "d2"])
    assert _lease(leases, r2, ["d2", "d1"]) is first  # the same artifact set, any order
    assert leases.ending_with(r1) == []  # r2 still holds it
    assert leases.release_run(r1) == ([], [])
    assert leases.ending_with(r2) == []  # not the job's last run: the next one may come
    assert leases.release_run(r2) == ([], [first.key])  # waits a while for it
    assert _lease(leases, r3, ["d1", "d2"]) is first  # came: the same runner
    assert not leases.end_idle(first.key)  # the wait's end finds it held
    assert leases.ending_with(r3) == [first.key]
    assert leases.release_run(r3) == ([first.key], [])


def test_a_jobs_last_run_arriving_first_leaves_the_runner_to_the_earlier_one(
    tmp_path: Path,
) -> None:
    """The API sends a job's two runs on two calls 8 ms apart; the second (the job's last)
    reached the worker first and ran first, and its last group ended the runner that the first
    run, already queued behind it, then started again (a CI failure of #42's test)."""
    leases, _ = _leases(tmp_path)
    r1, r2 = _Run("r1", "job"), _Run("r2", "job", job_last=True)
    leases.enter(r2)
    leases.enter(r1)  # arrived, its groups queued behind r2's
    first = _lease(leases, r2, ["d1"])
    assert leases.ending_with(r2) == []  # r1 is still to run
    assert leases.release_run(r2) == ([], [])  # nor does it wait for an idle end
    assert _lease(leases, r1, ["d1"]) is first
    assert not leases.end_idle(first.key)
    assert leases.ending_with(r1) == [first.key]  # the job's last run was here: it ends now
    assert leases.release_run(r1) == ([first.key], [])
    assert leases.job_runs == {} and leases.last_jobs == set()
    assert not Path(first.workdir).exists()


def test_a_job_whose_last_run_went_elsewhere_ends_after_the_wait(tmp_path: Path) -> None:
    leases, host = _leases(tmp_path)
    r1 = _Run("r1", "job")
    lease = _lease(leases, r1, ["d1"])
    assert leases.release_run(r1) == ([], [lease.key])
    assert leases.end_idle(lease.key)
    assert not Path(lease.workdir).exists() and host.sandbox_uids == set()
    assert not leases.end_idle(lease.key)  # once


def test_a_last_run_ending_before_an_earlier_one_ends_the_runner_with_that_one(
    tmp_path: Path,
) -> None:
    leases, _ = _leases(tmp_path)
    r1, r2 = _Run("r1", "job"), _Run("r2", "job", job_last=True)
    lease = _lease(leases, r1, ["d1"])
    _lease(leases, r2, ["d1"])
    assert leases.release_run(r2) == ([], [])  # r1 still runs
    assert leases.ending_with(r1) == [lease.key]
    assert leases.release_run(r1) == ([lease.key], [])


def test_two_jobs_never_share_a_runner(tmp_path: Path) -> None:
    leases, _ = _leases(tmp_path)
    a = _lease(leases, _Run("r", "job-a"), ["d1"])
    b = _lease(leases, _Run("r", "job-b"), ["d1"])
    assert a is not b and a.workdir != b.workdir and a.config.uid != b.config.uid
