"""Admission of a job: parse, validate, expand, check against the workers, store.

A job is refused before anything is stored when its spec is invalid (422 with the field path),
names an op or impl nobody offers (the known ones listed), expands past the case cap, or needs
more device memory than any worker has. A job that names artifacts (code it brings) also needs
the code scope, artifacts that are stored, and a worker that runs artifacts; its impl names are
not checked here (they may come from the artifacts: the worker fails names that no artifact
provides, listing the impls it found).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kassay.api.store import JobRecord, Store, body_hash
from kassay.contract.spec import GroupSpec, JobSpec, parse_spec
from kassay.errors import (
    InvalidSpecError,
    KassayError,
    ResourceError,
    UnknownImplError,
    did_you_mean,
)
from kassay.ops.expand import Expansion, expand_parsed
from kassay.settings import Settings
from kassay.validate.case_result import case_dtype


class WorkerCatalog(Protocol):
    """What admission needs to know about the connected workers."""

    def impls_for(self, op: str) -> set[str] | None:
        """Impl names the described workers offer for `op`; None when no worker is known."""

    def max_memory(self) -> int | None:
        """The most device memory any described worker has free; None when none is known."""

    def accepts_code(self) -> bool | None:
        """Whether a described worker runs groups that name artifacts; None when none is
        described yet."""


@dataclass
class Admitted:
    job: JobRecord
    created: bool
    ops: tuple[str, ...] = ()  # the ops the job asks for (metrics label admission by them)


def parse_body(body: bytes, content_type: str | None) -> JobSpec:
    """A spec from a JSON or YAML body (YAML is a superset of JSON; JSON bodies are parsed as
    JSON so that their errors read as JSON errors)."""
    if not body.strip():
        raise InvalidSpecError("the request body is empty: send a job spec as JSON or YAML")
    ctype = (content_type or "").split(";")[0].strip().lower()
    return parse_spec(body, json_only=ctype == "application/json")


def _check_artifacts(
    spec: JobSpec, store: Store, workers: WorkerCatalog, code_denial: KassayError | None
) -> None:
    """A job that brings code: the caller's code scope, the artifacts stored, a worker for
    them."""
    if code_denial is not None:
        raise code_denial
    for i, digest in enumerate(spec.artifacts):
        if store.artifacts.missing([digest]):
            raise InvalidSpecError(
                f"artifacts.{i}: no artifact {digest}; upload it first (POST /v1/artifacts, "
                "`kassay submit --artifact PATH`)",
                details={"errors": [{"loc": ["artifacts", i], "msg": "unknown artifact"}]},
            )
    if workers.accepts_code() is False:
        raise ResourceError(
            "no worker runs artifacts (code jobs): every worker was started without them",
            details={"loc": ["artifacts"]},
        )


def _check_impls(spec: JobSpec, workers: WorkerCatalog) -> None:
    """Impl names against what the described workers offer. With no worker described yet the
    names are accepted: a group no worker turns out to offer fails then, naming the impls the
    workers have (the API keeps no impl registry of its own, so it needs no torch)."""
    from kassay.ops import get_op

    for si, suite in enumerate(spec.suites):
        try:
            get_op(suite.op)
        except InvalidSpecError as exc:
            exc.details["loc"] = ["suites", si, "op"]
            raise
        offered = workers.impls_for(suite.op)
        if offered is None or spec.artifacts:
            continue
        for name in [*suite.impls, suite.baseline]:
            if name not in offered:
                known = sorted(offered)
                raise UnknownImplError(
                    f"suites.{si}.impls: no worker offers impl {name!r} for op {suite.op!r}"
                    f"{did_you_mean(name, known)}; known impls: {', '.join(known) or '(none)'} "
                    "(`kassay impls` lists them; mutants need KASSAY_ENABLE_MUTANTS on the API "
                    "and its workers)",
                    details={"loc": ["suites", si, "impls"], "op": suite.op, "allowed": known},
                )


def _estimates(expansion: Expansion) -> tuple[dict[str, str], int, GroupSpec | None]:
    """Per-group case dtype, and the largest per-group device-memory estimate (op contracts
    only: no torch), from the params expansion parsed."""
    from kassay.ops import get_op

    dtypes: dict[str, str] = {}
    worst = 0
    worst_group: GroupSpec | None = None
    for g in expansion.groups:
        if g.skip:  # never runs: named by the dtype it was written with
            dtypes[g.group_id] = case_dtype(g.op, g.params)
            continue
        op = get_op(g.op)
        params = expansion.params[g.group_id]
        dtypes[g.group_id] = op.case_dtype(params)
        need = int(op.estimate_device_bytes(params))
        if need > worst:
            worst, worst_group = need, g
    return dtypes, worst, worst_group


def admit(
    body: bytes,
    content_type: str | None,
    *,
    store: Store,
    workers: WorkerCatalog,
    settings: Settings,
    idempotency_key: str | None = None,
    code_denial: KassayError | None = None,
) -> Admitted:
    """Validate and store a job; see the module docstring for what is refused. `code_denial`:
    why this caller may not bring code (raised only if the spec names artifacts)."""
    spec = parse_body(body, content_type)
    spec_hash = body_hash(spec.model_dump_json())
    if idempotency_key:  # a replay returns the stored job without re-validating it
        existing = store.jobs.find_by_key(idempotency_key, spec_hash)
        if existing is not None:
            return Admitted(existing, False)
    if spec.artifacts:
        _check_artifacts(spec, store, workers, code_denial)
    _check_impls(spec, workers)
    expansion = expand_parsed(spec, max_cases=settings.max_cases)
    group_specs = expansion.groups
    dtypes, need, worst = _estimates(expansion)
    capacity = workers.max_memory()
    if capacity is not None and worst is not None and need > capacity:
        raise ResourceError(
            f"group {worst.group_id} ({worst.op} {worst.params}) needs about {need / 2**30:.2f} "
            f"GiB of device memory; the most any worker has free is {capacity / 2**30:.2f} GiB",
            details={
                "loc": ["suites", worst.suite_index, "params"],
                "needed_bytes": need,
                "largest_worker_bytes": capacity,
                "group": worst.params,
            },
        )
    job, created = store.jobs.create_job(
        spec, group_specs, dtypes, idempotency_key=idempotency_key, spec_hash=spec_hash
    )
    if created and spec.artifacts:
        store.artifacts.record_job(job.id, spec.artifacts)
    skipped = [g for g in group_specs if g.skip] if created else []
    for g in skipped:  # stored done: no worker leases it; its cases are reported here
        store.results.fill_missing(job.id, g.group_id, status="skipped", reason=g.skip)
    if skipped:
        job = store.jobs.require_job(job.id)
    return Admitted(job, created, tuple(sorted({s.op for s in spec.suites})))
