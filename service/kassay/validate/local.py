"""`kassay run`: the engine in-process, no servers — expand a job spec and run every group."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

from kassay.contract.results import CaseResult, Report, Summary, named
from kassay.contract.spec import DEFAULT_MAX_CASES, JobSpec
from kassay.errors import InvalidSpecError
from kassay.ops.expand import ImplCheck, expand
from kassay.validate.case_result import case_result
from kassay.validate.engine import run_group
from kassay.validate.env import environment, resolve_device


def local_impl_check(*, include_mutants: bool = False, include_testing: bool = False) -> ImplCheck:
    """An ImplCheck against this process's impl registry (imports torch: local runs only; the
    API checks impl names against what its workers describe)."""
    from kassay.impls import get_impl, load

    load(mutants=include_mutants, testing=include_testing)

    def check(op: str, name: str) -> None:
        get_impl(op, name, include_mutants=include_mutants, include_testing=include_testing)

    return check


def run_job(
    spec: JobSpec,
    *,
    device: str = "auto",
    max_cases: int = DEFAULT_MAX_CASES,
    include_mutants: bool = False,
    include_testing: bool = False,
    on_result: Callable[[CaseResult], None] | None = None,
    ceilings: bool = True,
) -> Report:
    if spec.artifacts:  # code a job brings runs only in a worker's sandbox
        raise InvalidSpecError(
            "artifacts: a local run loads no artifacts; install the package instead (its "
            "kassay.impls entry points load as plugins), or submit the job to a server",
            details={"errors": [{"loc": ["artifacts"], "msg": "not in a local run"}]},
        )
    groups = expand(
        spec,
        max_cases=max_cases,
        check_impl=local_impl_check(
            include_mutants=include_mutants, include_testing=include_testing
        ),
    )
    dev = resolve_device(device)
    created = datetime.now(timezone.utc)
    cases: list[CaseResult] = []
    for g in groups:
        if g.skip:  # a combination the op refuses: reported, never run
            skipped = [case_result(g, impl, "skipped", g.skip) for impl in g.impls]
            for c in skipped:
                if on_result is not None:
                    on_result(c)
            cases.extend(skipped)
            continue
        cases.extend(
            run_group(
                g,
                device=dev,
                include_mutants=include_mutants,
                include_testing=include_testing,
                on_result=on_result,
                worker="local",
                ceilings=ceilings,
            )
        )
    env = environment(dev)
    return Report(
        name=spec.name,
        labels=spec.labels,
        created_at=created,
        finished_at=datetime.now(timezone.utc),
        environments=[env],
        summary=Summary.of(cases),
        cases=named(cases),
    )
