"""assert_kernel, cases and parametrize (the public surface is kassay.testing's docstring).

The grid is expanded by the job spec's own expansion (kassay.ops.expand) and each case
run by the engine's run_group: there is no second judge here, only the translation of a
CaseResult into an assertion."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kassay.contract.results import NOT_JUDGED, CaseResult
from kassay.contract.spec import (
    DEFAULT_MAX_CASES,
    GroupSpec,
    JobSpec,
    Suite,
    TimingPolicy,
    TolerancePolicy,
)
from kassay.ops import get_op
from kassay.ops.expand import expand
from kassay.ops.registry import Impl, get_impl, load, scoped
from kassay.testing.session import SESSION

#: how many of an output's worst elements the message shows
_WORST = 5


class KernelAssertionError(AssertionError):
    """A case's verdict was not `passed`; `results` holds every case asserted in the call."""

    def __init__(self, message: str, results: list[CaseResult]) -> None:
        super().__init__(message)
        self.results = results


class KernelSkipped(Exception):
    """Outside pytest: no case of the call could be judged here (the reason says why)."""


@dataclass(frozen=True)
class Case:
    """One input group of an op's grid, as a job's suite expands it: its params (the op's
    params model's dump), regime, seed and, for a point default coverage added, why; `skip` is
    why the op refuses the combination ("": it runs). `key` is the group id `kassay run` and
    a job's report give the same case (its case id is key + ':' + impl)."""

    op: str
    params: dict[str, Any]
    regime: str
    seed: int
    coverage: str
    skip: str
    key: str
    #: a short readable id (pytest's test id): the params that vary across the grid
    id: str = ""

    def __str__(self) -> str:
        return self.id or self.key


def cases(
    op: str,
    *,
    regimes: Sequence[str] | None = None,
    seeds: Sequence[int] = (0,),
    coverage: str = "none",
    **params: Any,
) -> list[Case]:
    """The cases of `op` over the grid `params` (a list is a dimension, as in a job's suite),
    in `regimes` (default: the op's default regimes for each point) and `seeds`; `coverage`
    "standard" adds the op's default coverage points, as a job does by default."""
    _prepare()
    groups = _expand(op, "torch", params, regimes=regimes, seeds=seeds, coverage=coverage)
    return _named([_case(g) for g in groups])


def parametrize(
    op: str,
    *,
    argname: str = "case",
    regimes: Sequence[str] | None = None,
    seeds: Sequence[int] = (0,),
    coverage: str = "none",
    **params: Any,
) -> Any:
    """`pytest.mark.parametrize(argname, cases(...))` with readable ids, and the cases the op
    refuses marked skip with the reason."""
    import pytest

    found = cases(op, regimes=regimes, seeds=seeds, coverage=coverage, **params)
    return pytest.mark.parametrize(
        argname,
        [
            pytest.param(c, id=str(c), marks=[pytest.mark.skip(reason=c.skip)] if c.skip else [])
            for c in found
        ],
    )


def assert_kernel(
    op: str,
    impl: Any,
    case: Case | None = None,
    *,
    device: str | None = None,
    timing: bool | None = None,
    tolerance: TolerancePolicy | dict[str, Any] | None = None,
    baseline: str = "torch",
    regimes: Sequence[str] | None = None,
    seeds: Sequence[int] = (0,),
    coverage: str = "none",
    **params: Any,
) -> list[CaseResult]:
    """Judge `impl` on `case`, or on every case of the grid `params` (as `cases` expands it),
    as a job would; return the CaseResults; raise KernelAssertionError unless every case
    judged passed (pytest.skip / KernelSkipped when none could be judged)."""
    _prepare()
    the_op = get_op(op)
    name, scoped_impls = _resolve(the_op, impl)
    policy = TolerancePolicy.model_validate(tolerance or {})
    timed = SESSION["timing"] if timing is None else timing
    if case is not None:
        if params:
            raise TypeError(f"assert_kernel: a case or a grid, not both (got {sorted(params)})")
        if case.op != op:
            raise ValueError(f"assert_kernel: the case is of op {case.op!r}, not {op!r}")
        groups = [_group(case, name, baseline, policy, timed)]
    else:
        with scoped(scoped_impls):
            groups = _expand(
                op,
                name,
                params,
                regimes=regimes,
                seeds=seeds,
                coverage=coverage,
                baseline=baseline,
                tolerance=policy,
                timed=timed,
            )
    hidden = isinstance(impl, Impl) and impl.kind in ("mutant", "alternative", "testing")
    results = _run(groups, scoped_impls, device or SESSION["device"], hidden=hidden)
    record = SESSION["record"]
    if record is not None:
        for r in results:
            record(r)
    judged = [r for r in results if r.status not in NOT_JUDGED]
    bad = [r for r in judged if r.status != "passed"]
    if bad:
        raise KernelAssertionError(_message(bad, len(judged), policy.factor), results)
    if not judged:
        reasons = sorted({r.message for r in results})
        _skip(f"kassay: no case of {op} impl {name!r} could be judged here: " + "; ".join(reasons))
    return results


# ------------------------------------------------------------------------------ the impl


def _prepare() -> None:
    from kassay.triton_mode import ensure_triton_mode

    ensure_triton_mode()  # before any Triton kernel module is imported
    load()


def _resolve(op: Any, impl: Any) -> tuple[str, list[Impl]]:
    """(the impl's name, the impls to register for the call)."""
    if isinstance(impl, str):
        get_impl(op.name, impl)  # UnknownImplError, with the known ones and a did-you-mean
        return impl, []
    if isinstance(impl, Impl):
        if impl.op != op.name:
            raise ValueError(f"impl {impl.name!r} is of op {impl.op!r}, not {op.name!r}")
        try:
            # the self-test's corpora too: a mutant's Impl is judged as `kassay run` judges it
            registered = get_impl(op.name, impl.name, include_mutants=True, include_testing=True)
        except Exception:
            return impl.name, [impl]
        if registered is impl:
            return impl.name, []
        raise ValueError(
            f"impl {impl.name!r} of op {op.name!r} is already registered (a built-in or "
            "plugin): give yours another name"
        )
    if not callable(impl):
        raise TypeError(
            f"assert_kernel: impl must be a function, an Impl or an impl name, not "
            f"{type(impl).__name__}"
        )
    run, supports = op.from_callable(impl)  # TypeError saying what does not fit
    name = _free_name(op.name, re.sub(r"[^A-Za-z0-9_.\-]", "_", getattr(impl, "__name__", "fn")))
    kw: dict[str, Any] = {"supports": supports} if supports is not None else {}
    return name, [Impl(op.name, name, run, "a function under test (kassay.testing)", **kw)]


def _free_name(op: str, base: str) -> str:
    """`base`, or `base_2`, ... where a registered impl has it (a user's function named
    `torch` must not be judged as torch)."""
    name, n = base[:90] or "fn", 1
    while True:
        try:
            get_impl(op, name, include_mutants=True, include_testing=True)
        except Exception:
            return name
        n += 1
        name = f"{base[:90]}_{n}"


# ------------------------------------------------------------------------------ the grid


def _expand(
    op: str,
    impl: str,
    params: dict[str, Any],
    *,
    regimes: Sequence[str] | None,
    seeds: Sequence[int],
    coverage: str,
    baseline: str = "torch",
    tolerance: TolerancePolicy | None = None,
    timed: bool = False,
) -> list[GroupSpec]:
    suite = Suite.model_validate(
        {
            "op": op,
            "impls": [impl],
            "baseline": baseline,
            "params": params,
            "regimes": list(regimes) if regimes is not None else None,
            "seeds": list(seeds),
            "coverage": coverage,
            "tolerance": (tolerance or TolerancePolicy()).model_dump(),
            "timing": _timing(timed).model_dump(),
        }
    )
    spec = JobSpec(name="kassay.testing", suites=[suite])
    return expand(spec, max_cases=DEFAULT_MAX_CASES, check_impl=_check_impl)


def _check_impl(op: str, name: str) -> None:
    # the hidden kinds (mutants, alternatives) reach here only as an Impl a caller passed
    get_impl(op, name, include_mutants=True, include_testing=True)


def _timing(timed: bool) -> TimingPolicy:
    return TimingPolicy() if timed else TimingPolicy(enabled=False)


def _case(g: GroupSpec) -> Case:
    return Case(g.op, dict(g.params), g.regime, g.seed, g.coverage, g.skip, g.group_id)


def _named(found: list[Case]) -> list[Case]:
    """Ids from what varies across the grid: `K=2-float32-normal`, unique."""
    keys = sorted({k for c in found for k in c.params})
    varying = [k for k in keys if len({repr(c.params.get(k)) for c in found}) > 1]
    regimes = len({c.regime for c in found}) > 1
    seeds = len({c.seed for c in found}) > 1
    out: list[Case] = []
    seen: set[str] = set()
    for c in found:
        parts = [f"{k}={c.params.get(k)}" for k in varying]
        parts += [c.regime] if regimes else []
        parts += [f"seed{c.seed}"] if seeds else []
        parts += ["coverage"] if c.coverage else []
        ident = "-".join(parts) or c.key
        if ident in seen:
            ident = f"{ident}-{c.key}"
        seen.add(ident)
        out.append(Case(c.op, c.params, c.regime, c.seed, c.coverage, c.skip, c.key, ident))
    return out


def _group(case: Case, impl: str, baseline: str, policy: TolerancePolicy, timed: bool) -> Any:
    return GroupSpec(
        group_id=case.key,
        op=case.op,
        params=case.params,
        regime=case.regime,
        seed=case.seed,
        impls=[impl],
        baseline=baseline,
        tolerance=policy,
        timing=_timing(timed),
        coverage=case.coverage,
        skip=case.skip,
    )


# ------------------------------------------------------------------------------ the run


def _run(
    groups: Iterable[GroupSpec], impls: list[Impl], device: str, *, hidden: bool
) -> list[CaseResult]:
    """`hidden`: the impl is of the self-test's corpora (a mutant, an alternative)."""
    from kassay.validate.case_result import case_result
    from kassay.validate.engine import run_group

    results: list[CaseResult] = []
    with scoped(impls):
        for g in groups:
            if g.skip:  # a combination the op refuses: reported, never run
                results += [case_result(g, i, "skipped", g.skip) for i in g.impls]
                continue
            results += run_group(
                g,
                device=device,
                worker="local",
                ceilings=False,
                include_mutants=hidden,
                include_testing=hidden,
            )
    return results


def _skip(reason: str) -> None:
    try:
        import pytest
    except ImportError:  # pragma: no cover - kassay's dev extra has pytest
        raise KernelSkipped(reason) from None
    pytest.skip(reason)


# ------------------------------------------------------------------------------ the message


def _message(bad: list[CaseResult], judged: int, factor: float) -> str:
    first = bad[0]
    lines = [_first_line(first, factor)]
    if len(bad) > 1:
        listed = ", ".join(f"{r.case_id} {r.status}" for r in bad[:10])
        more = " ..." if len(bad) > 10 else ""
        lines.append(f"{len(bad)} of {judged} cases not passed: {listed}{more}")
    lines += _details(first)
    return "\n".join(lines)


def _first_line(r: CaseResult, factor: float) -> str:
    where = f"kassay: {r.op} impl {r.impl!r} {r.status} on case {r.case_id} ({r.regime})"
    failed = [o for o in r.outputs if not o.passed]
    if not failed:
        return f"{where}: {r.message or r.status}"
    o = failed[0]
    return f"{where}: output {o.name}: {o.reason}{_limit(o, factor)}"


def _limit(o: Any, factor: float) -> str:
    """How the max_abs limit was formed, where the baseline policy set it."""
    if o.threshold_max_abs is None or o.baseline_max_abs is None:
        return ""
    floor = o.threshold_max_abs - factor * o.baseline_max_abs
    return (
        f" [max_abs limit {o.threshold_max_abs:.3g} = {factor:g} x baseline's max_abs "
        f"{o.baseline_max_abs:.3g} + rounding floor {floor:.3g}]"
    )


def _details(r: CaseResult) -> list[str]:
    lines = [
        f"  params {r.params}, regime {r.regime}, seed {r.seed}"
        + (f", coverage: {r.coverage}" if r.coverage else "")
    ]
    for o in r.outputs:
        if o.passed:
            continue
        lines.append(
            f"  {o.name} ({o.dtype}, shape {o.shape}): max_abs {o.max_abs:.3g}, max_rel "
            f"{o.max_rel:.3g}, {o.n_bad} element(s) beyond atol + rtol*|ref|, nan {o.nan}, "
            f"inf {o.inf}; policy {o.policy}"
        )
        for w in o.worst[:_WORST]:
            lines.append(
                f"    at {w.index}: {w.value:.6g} (reference {w.reference:.6g}, "
                f"|err| {w.abs_err:.3g})"
            )
    return lines
