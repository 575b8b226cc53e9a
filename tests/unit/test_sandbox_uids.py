"""Each running sandbox gets a user of its own (#31): RLIMIT_NPROC counts processes per user
across the host, so with one shared user a busy job's code spent another's process limit
(`pthread_create failed` in a real artifact's cases under load)."""

from __future__ import annotations

from types import SimpleNamespace

from kassay.validate.spec import GroupSpec
from kassay.worker.executor_source import SandboxedExecutor
from kassay.worker.sandbox import SandboxConfig


def test_sandboxes_running_at_once_get_distinct_users_and_give_them_back() -> None:
    sup = SimpleNamespace(
        sandbox_config=SandboxConfig(workdir="", uid=2_100_000_000), sandbox_uids=set()
    )
    group = GroupSpec(group_id="g", op="lse_merge", params={}, impls=["torch"])
    a, b, c = (SandboxedExecutor(sup, group) for _ in range(3))  # type: ignore[arg-type]
    assert (a._uid(), b._uid()) == (2_100_000_000, 2_100_000_001)
    assert a._uid() == 2_100_000_000  # a retry of the same group keeps its user
    a._release_uid()
    assert c._uid() == 2_100_000_000  # free again
    assert sup.sandbox_uids == {0, 1}
