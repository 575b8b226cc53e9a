"""A job spec's grids expanded into input groups against the op contracts (kassay.contract.spec
holds the spec's models; expanding needs each op's params model, regimes and coverage, so it sits
a floor above them, here).

A suite that lists no regimes runs every regime of its op; unless `coverage: none`, default
coverage (each op's `coverage`) adds edge points, marked as added in every report. Imports no
torch unless the `check_impl` a caller passes does.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from kassay.contract.spec import (
    DEFAULT_MAX_CASES,
    GroupSpec,
    JobSpec,
    Suite,
    TimingPolicy,
    convergence_regime,
    group_id_of,
    spec_error,
)
from kassay.errors import CaseLimitError, InvalidSpecError
from kassay.ops import OpParams, get_op


def _grid(params: dict[str, Any]) -> list[dict[str, Any]]:
    axes = {k: (v if isinstance(v, list) else [v]) for k, v in params.items()}
    for k, v in axes.items():
        if not v:
            raise InvalidSpecError(
                f"params.{k}: a grid axis must list at least one value",
                details={"errors": [{"loc": ["params", k], "msg": "empty grid axis"}]},
            )
    keys = list(axes)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*axes.values())]


def suite_regimes(suite: Suite) -> list[str]:
    """The regimes a suite runs: those it lists, else every regime of its op."""
    if suite.regimes is not None:
        return list(suite.regimes)
    return list(get_op(suite.op).regimes)


def count_cases(spec: JobSpec) -> int:
    """Cases of the user's grids (coverage adds a bounded number more; `expand` counts them)."""
    total = 0
    for s in spec.suites:
        n = 1
        for v in s.params.values():
            n *= len(v) if isinstance(v, list) else 1
        if s.convergence is not None:  # seeds are the policy's, inside one group
            total += n * len(s.impls)
            continue
        try:
            n_regimes = len(suite_regimes(s))
        except InvalidSpecError:
            n_regimes = 1
        total += n * n_regimes * len(s.seeds) * len(s.impls)
    return total


#: Checks that an impl exists for an op; raises InvalidSpecError (or a subclass) when it does not.
ImplCheck = Callable[[str, str], None]


@dataclass(frozen=True)
class Expansion:
    """A spec's groups, and each run group's params as its op's model parsed them (skipped
    groups have none): admission prices the groups with these instead of parsing again."""

    groups: list[GroupSpec]
    params: dict[str, OpParams]


def expand(
    spec: JobSpec,
    *,
    max_cases: int = DEFAULT_MAX_CASES,
    check_impl: ImplCheck | None = None,
) -> list[GroupSpec]:
    """Validate every suite against the op contracts (and the impls through `check_impl`, when
    given) and expand the grids.

    Raises InvalidSpecError (unknown op/impl/regime, invalid params with the grid point named)
    or CaseLimitError when the job has more cases than min(max_cases, spec.max_cases).
    Imports no torch unless `check_impl` does."""
    return expand_parsed(spec, max_cases=max_cases, check_impl=check_impl).groups


def expand_parsed(
    spec: JobSpec,
    *,
    max_cases: int = DEFAULT_MAX_CASES,
    check_impl: ImplCheck | None = None,
) -> Expansion:
    """`expand`, keeping the parsed params of every group it runs."""
    parsed: dict[str, OpParams] = {}
    cap = min(max_cases, spec.max_cases or max_cases)
    n = count_cases(spec)
    # the grid is bounded before it is expanded (combinations the op refuses do not count
    # against the cap, but a grid many times over it is refused without expanding it)
    if n > cap * GRID_SLACK:
        raise CaseLimitError(
            f"job expands to {n} cases, over the cap of {cap}; split it or shrink the grid",
            details={"cases": n, "cap": cap},
        )
    groups: list[GroupSpec] = []
    for si, suite in enumerate(spec.suites):
        try:
            op = get_op(suite.op)
        except InvalidSpecError as exc:
            exc.details["loc"] = ["suites", si, "op"]
            raise
        for name in [*suite.impls, suite.baseline]:
            if check_impl is None:
                break
            try:
                check_impl(op.name, name)
            except InvalidSpecError as exc:
                exc.details["loc"] = ["suites", si, "impls"]
                raise
        if suite.convergence is not None:
            groups += _convergence_groups(op, suite, si, parsed, artifacts=list(spec.artifacts))
            continue
        regimes = suite_regimes(suite)
        for regime in regimes:
            try:
                op.check_regime(regime)
            except InvalidSpecError as exc:
                exc.details["loc"] = ["suites", si, "regimes"]
                raise
        points = []
        refused: list[tuple[dict[str, Any], str, InvalidSpecError]] = []
        for point in _grid(suite.params):
            try:
                parsed_point = op.parse_params(point)
            except ValidationError as exc:
                err = spec_error(exc, ("suites", si, "params"))
                shown = json.dumps(point, default=str)
                shown = shown if len(shown) <= 300 else shown[:300] + " ..."
                err.message = f"{err.message} (grid point {shown})"
                err.args = (err.message,)
                if not _combination_only(exc):
                    raise err from None
                refused.append((point, _combination_reason(exc), err))
                continue
            params = parsed_point.model_dump()  # the one validation of this point in the API
            points.append(params)
            for regime in regimes:
                if suite.regimes is None and not op.default_regime_ok(parsed_point, regime):
                    continue
                for seed in suite.seeds:
                    g = _group(op.name, suite, si, params, regime, seed, artifacts=spec.artifacts)
                    parsed[g.group_id] = parsed_point
                    groups.append(g)
        if refused and not points:
            # no point of the grid is valid: that is a mistake, not a mix
            raise refused[0][2]
        for point, reason, _err in refused:
            groups.append(_skipped_group(op.name, suite, si, point, regimes[0], reason))
        if suite.coverage == "standard":
            groups += _coverage_groups(
                op, suite, si, points, regimes, groups, parsed, artifacts=list(spec.artifacts)
            )
    n_run = sum(len(g.impls) for g in groups if not g.skip)
    n_cov = sum(len(g.impls) for g in groups if g.coverage)
    if n_run > cap:
        added = f" ({n_cov} added by coverage)" if n_cov else ""
        hint = ", shrink the grid or set coverage: none" if n_cov else " or shrink the grid"
        raise CaseLimitError(
            f"job expands to {n_run} cases{added}, over the cap of {cap}; split it{hint}",
            details={"cases": n_run, "cap": cap},
        )
    ids = [g.group_id for g in groups]
    if len(set(ids)) != len(ids):
        raise InvalidSpecError("the grid repeats a point (same params, regime and seed twice)")
    return Expansion(groups, parsed)


#: a grid may list up to this many times the case cap before expansion: the combinations an op
#: refuses (skipped, not run) do not count against the cap, but expanding a grid costs time
GRID_SLACK = 16


def _convergence_groups(
    op: Any, suite: Suite, si: int, parsed: dict[str, OpParams], *, artifacts: list[str]
) -> list[GroupSpec]:
    """One group per point of a convergence suite's options: the op's params the model calls it
    with (Op.convergence_params), its impls trained in one executor (matched seeds)."""
    policy = suite.convergence
    assert policy is not None
    regime = convergence_regime(policy)
    out = []
    for point in _grid(suite.params):
        try:
            full = op.convergence_params(policy.shape(), point)
            point_params = op.parse_params(full)
            params = point_params.model_dump()
        except ValueError as exc:
            if isinstance(exc, ValidationError):
                raise spec_error(exc, ("suites", si, "params")) from None
            raise InvalidSpecError(
                f"suites.{si}.params: {exc}",
                details={"loc": ["suites", si, "params"], "errors": [{"msg": str(exc)}]},
            ) from None
        out.append(
            GroupSpec(
                group_id=group_id_of(op.name, params, regime, suite.seeds[0], si),
                suite_index=si,
                op=op.name,
                params=params,
                regime=regime,
                seed=suite.seeds[0],
                impls=list(suite.impls),
                baseline=suite.baseline,
                timing=TimingPolicy(enabled=False),
                artifacts=list(artifacts),
                convergence=policy,
            )
        )
        parsed[out[-1].group_id] = point_params
    return out


def _combination_only(exc: ValidationError) -> bool:
    """Whether every error is the params model's own check of a combination of fields (its
    model validator: no field in `loc`), as opposed to a field's value being wrong."""
    return all(not e["loc"] for e in exc.errors())


def _combination_reason(exc: ValidationError) -> str:
    msgs = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
    return f"not a valid combination of the grid: {msgs}"


def _skipped_group(
    op: str, suite: Suite, si: int, point: dict[str, Any], regime: str, reason: str
) -> GroupSpec:
    """The group of a grid point the op refuses: reported skipped, never run."""
    return GroupSpec(
        group_id=group_id_of(op, point, "skipped", 0, si),
        suite_index=si,
        op=op,
        params=point,
        regime=regime,
        seed=suite.seeds[0],
        impls=list(suite.impls),
        baseline=suite.baseline,
        tolerance=suite.tolerance,
        timing=TimingPolicy(enabled=False),
        skip=reason,
    )


def _group(
    op: str,
    suite: Suite,
    si: int,
    params: dict[str, Any],
    regime: str,
    seed: int,
    timing: TimingPolicy | None = None,
    coverage: str = "",
    *,
    artifacts: list[str] | None = None,
) -> GroupSpec:
    """One input group of suite `si` at a validated params dump."""
    return GroupSpec(
        group_id=group_id_of(op, params, regime, seed, si),
        suite_index=si,
        op=op,
        params=params,
        regime=regime,
        seed=seed,
        impls=list(suite.impls),
        baseline=suite.baseline,
        tolerance=suite.tolerance,
        timing=timing if timing is not None else suite.timing,
        coverage=coverage,
        artifacts=list(artifacts or []),
    )


def _coverage_groups(
    op: Any,
    suite: Suite,
    si: int,
    points: list[dict[str, Any]],
    regimes: list[str],
    existing: list[GroupSpec],
    parsed: dict[str, OpParams],
    *,
    artifacts: list[str],
) -> list[GroupSpec]:
    """Groups for the edge points coverage adds to one suite: valid for the op, not already in
    the grid, at the suite's first seed, untimed; they load the job's `artifacts` as its grid
    groups do (the suite's impls may come from them)."""
    seen = {(json.dumps(g.params, sort_keys=True), g.regime) for g in existing}
    seed = suite.seeds[0]
    out = []
    for raw, regime, note in op.coverage(points, regimes):
        try:
            point = op.parse_params(raw)
        except ValidationError:
            continue  # an edge point this op's params reject (e.g. ignore_index inside V)
        if regime not in regimes and not op.default_regime_ok(point, regime):
            continue
        params = point.model_dump()
        key = (json.dumps(params, sort_keys=True), regime)
        if key in seen:
            continue
        seen.add(key)
        out.append(
            _group(
                op.name,
                suite,
                si,
                params,
                regime,
                seed,
                TimingPolicy(enabled=False),
                note,
                artifacts=artifacts,
            )
        )
        parsed[out[-1].group_id] = point
    return out
