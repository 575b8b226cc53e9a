"""The API's links to its workers, and what their last Describe said (kassay.api.dispatch).

`Workers` is the catalog admission reads (kassay.api.submit.WorkerCatalog): which ops and impls
the described workers offer, whether one runs artifacts, the most device memory one has free.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from kassay.api.schemas import WorkerInfo

log = logging.getLogger("kassay.api.dispatcher")


class WorkerLost(Exception):
    """The worker stopped answering while running a group."""


@dataclass
class WorkerLink:
    """One worker address and what its last Describe said."""

    address: str
    found_by: str | None = None  # the DNS name this address came from (None: listed as is)
    retired: bool = False  # gone from its DNS name: takes no new group
    state: str = "unknown"  # unknown | up | down
    channel: Any = None
    stub: Any = None
    device: str | None = None
    device_name: str | None = None
    memory_bytes: int | None = None
    memory_free_bytes: int | None = None
    max_run_groups: int | None = None  # the worker's cap on groups per Run
    ops: dict[str, list[str]] = field(default_factory=dict)
    impl_kinds: dict[str, dict[str, str]] = field(default_factory=dict)  # op -> impl -> kind
    environment: dict[str, Any] | None = None
    sandbox: dict[str, Any] | None = None  # what its Describe says of the artifact sandbox
    last_seen: float | None = None
    last_error: str | None = None
    running: dict[str, tuple[str, str]] = field(default_factory=dict)  # run_id -> (job, group)
    calls: dict[str, Any] = field(default_factory=dict)  # run_id -> grpc call

    def impl_names(self) -> set[str]:
        return {name for impls in self.ops.values() for name in impls}

    @property
    def accepts_code(self) -> bool:
        return bool(self.sandbox and self.sandbox.get("artifacts"))

    def info(self) -> WorkerInfo:
        return WorkerInfo(
            address=self.address,
            state=self.state,
            device=self.device,
            device_name=self.device_name,
            memory_bytes=self.memory_bytes,
            ops=self.ops,
            impl_kinds=self.impl_kinds,
            running=[f"{j}/{g}" for j, g in self.running.values()],
            last_seen=(
                datetime.fromtimestamp(self.last_seen, timezone.utc) if self.last_seen else None
            ),
            last_error=self.last_error,
            environment=self.environment,
            sandbox=self.sandbox,
            found_by=self.found_by,
        )


class Workers:
    """The links of one dispatcher: the catalog admission reads, and the groups they run."""

    def __init__(self, links: list[WorkerLink]) -> None:
        self.links = links

    def impls_for(self, op: str) -> set[str] | None:
        described = [link for link in self.links if link.ops]
        if not described:
            return None
        return {name for link in described for name in link.ops.get(op, [])}

    def all_described(self) -> bool:
        """Every configured worker has answered Describe at least once since start."""
        return bool(self.links) and all(link.ops for link in self.links)

    def accepts_code(self) -> bool | None:
        """Whether a described worker runs artifacts (None: no worker described yet)."""
        described = [link for link in self.links if link.ops]
        if not described:
            return None
        return any(link.accepts_code for link in described)

    def unrunnable_reason(
        self, op: str, impls: list[str], *, artifacts: bool = False
    ) -> str | None:
        """Why no worker can run a group of `op` with these impls (None when one can). Only
        meaningful once every worker has been described. A group with artifacts needs a worker
        that runs them (its impl names are checked by that worker, after loading them)."""
        if artifacts:
            if any(link.accepts_code and op in link.ops for link in self.links):
                return None
            return f"no worker runs artifacts (code jobs) for op {op!r}"
        if any(set(impls) <= set(link.ops.get(op, [])) for link in self.links):
            return None
        offered = sorted({name for link in self.links for name in link.ops.get(op, [])})
        missing = sorted(set(impls) - set(offered))
        if missing:
            return (
                f"no worker offers impl{'s' if len(missing) > 1 else ''} "
                f"{', '.join(repr(m) for m in missing)} for op {op!r}; "
                f"the workers offer: {', '.join(offered) or '(none)'}"
            )
        return f"no single worker offers all of {', '.join(impls)} for op {op!r}"

    def max_memory(self) -> int | None:
        """The most device memory a described worker has free for kassay (measured when its
        executor started, so it leaves out what other processes hold); its total where the
        worker reported no free figure."""
        sizes = [
            link.memory_free_bytes or link.memory_bytes
            for link in self.links
            if link.memory_free_bytes or link.memory_bytes
        ]
        return max(s for s in sizes if s) if sizes else None

    def up(self) -> int:
        return sum(1 for link in self.links if link.state == "up" and not link.retired)

    def info(self) -> list[WorkerInfo]:
        return [link.info() for link in self.links]

    def running(self) -> list[tuple[str, str]]:
        """(job, group) of every group a link runs now."""
        return [key for link in self.links for key in link.running.values()]


async def describe(link: WorkerLink, *, enable_mutants: bool) -> bool:
    """Refresh what the worker offers; False (and the link down) when it does not answer."""
    from kassay.contract.v1 import worker_pb2 as pb

    try:
        resp = await link.stub.Describe(pb.DescribeRequest(), timeout=5.0)
    except Exception as exc:
        if link.state != "down":
            log.warning("worker %s is down: %s", link.address, rpc_text(exc))
        link.state = "down"
        link.last_error = rpc_text(exc)
        return False
    link.device = resp.device
    link.device_name = resp.device_name
    link.memory_bytes = int(resp.memory_total_bytes) or None
    link.memory_free_bytes = int(resp.memory_free_bytes) or None
    link.max_run_groups = int(resp.max_run_groups) or None
    mutants = enable_mutants
    # the self-test's corpora (mutants, correct alternatives) only where the API offers them
    offered = [
        (op.name, i)
        for op in resp.ops
        for i in op.impls
        if mutants or i.kind not in ("mutant", "alternative")
    ]
    link.ops = {op.name: [] for op in resp.ops}
    link.impl_kinds = {}
    for op_name, i in offered:
        link.ops[op_name].append(i.name)
        link.impl_kinds.setdefault(op_name, {})[i.name] = i.kind
    if resp.HasField("sandbox"):
        from kassay.contract.wire import read

        link.sandbox = read(resp.sandbox)
    else:
        link.sandbox = None
    if resp.HasField("environment"):
        from kassay.contract.wire import environment_from_proto

        with contextlib.suppress(Exception):
            link.environment = environment_from_proto(resp.environment).model_dump(mode="json")
    if link.state != "up":
        log.info("worker %s is up (%s)", link.address, resp.device_name or resp.device)
    link.state = "up"
    link.last_seen = time.time()
    link.last_error = None
    return True


def rpc_code(exc: BaseException) -> str | None:
    code = getattr(exc, "code", None)
    if callable(code):
        with contextlib.suppress(Exception):
            return str(code().name)
    return None


def rpc_text(exc: BaseException) -> str:
    details = getattr(exc, "details", None)
    code = rpc_code(exc)
    if callable(details) and code:
        with contextlib.suppress(Exception):
            return f"{code}: {details()}"
    return f"{type(exc).__name__}: {exc}"
