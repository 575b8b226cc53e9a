"""`kassay selftest`: the service's worth is catching wrong kernels.

Each targeted probe pairs one mutant (a known real-world bug, the op folder's `mutants`; its probes in `probes`: kassay.ops.probes) with a small
grid that exposes it, and runs the correct impls (torch, kassay) on the same groups under the
default policies. Plain probes run their mutants the way a new user would: a spec naming only
shapes, dtypes and options, no regimes listed, default coverage; what catches them is kassay's
defaults (coverage, the verdict checks), not a grid aimed at the bug. A mutant is detected when any of its cases is not passed (failed, error, crashed);
a correct impl's case that does not pass is a false failure. The run ends with
`detected D/M mutants, false failures F/C correct cases`, and succeeds only when D = M, F = 0.

The other corpus is fairness: correct impls written differently from eager PyTorch
(each op folder's `alternatives`: other softmax formulas, float32 logits under 16-bit inputs, float64,
chunked and compensated sums) run beside torch and kassay under plain specs at every dtype and
AMP (FAIRNESS); each of their cases that does not pass counts as a false failure too, and the
last line says how many of the correct cases were theirs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kassay.contract.results import BAD_STATUSES, NOT_JUDGED, CaseResult
from kassay.contract.spec import GroupSpec, JobSpec, Suite, TimingPolicy
from kassay.impls import get_impl, list_impls, load
from kassay.ops import all_ops, get_op
from kassay.ops.expand import expand
from kassay.ops.probes import CORRECT, Probe
from kassay.validate.engine import run_group
from kassay.validate.env import resolve_device
from kassay.validate.local import local_impl_check

#: statuses of a correct impl's case that are not a verdict (it cannot run these params, or the
#: device cannot judge them: kassay.validate.interpreter)
NOT_COUNTED = NOT_JUDGED


def probes() -> list[Probe]:
    """Every op's targeted probes (its probes module's PROBES)."""
    return _gather("PROBES")


def plain_probes() -> list[Probe]:
    """Every op's plain probes (PLAIN_PROBES)."""
    return _gather("PLAIN_PROBES")


def fairness() -> list[tuple[str, dict[str, Any]]]:
    """(op, plain grid) of every op's fairness suite (FAIRNESS)."""
    return _gather("FAIRNESS")


def correct_impls(op: str) -> tuple[str, ...]:
    """The op's correct impls: its probes module's CORRECT, else kassay.ops.probes.CORRECT."""
    mod = get_op(op).probes_module()
    return tuple(getattr(mod, "CORRECT", CORRECT))


def _gather(attr: str) -> list[Any]:
    """Every op's probes module's `attr` (kassay.ops.probes), in op order."""
    out: list[Any] = []
    for op in all_ops():
        mod = op.probes_module()
        if mod is not None:
            value = getattr(mod, attr, ())
            if isinstance(value, dict):
                out += [(op.name, value)] if value else []
            else:
                out += list(value)
    return out


@dataclass
class ProbeResult:
    probe: Probe
    mutant_cases: list[CaseResult] = field(default_factory=list)
    correct_cases: list[CaseResult] = field(default_factory=list)

    @property
    def detected(self) -> bool:
        return any(c.status in BAD_STATUSES for c in self.mutant_cases)

    @property
    def false_failures(self) -> list[CaseResult]:
        return [c for c in self.correct_cases if c.status not in (*NOT_COUNTED, "passed")]


@dataclass
class SelftestResult:
    probes: list[ProbeResult]
    #: the fairness corpus's cases (the alternatives', torch's and kassay's on its suites)
    fairness: list[CaseResult] = field(default_factory=list)

    @property
    def fairness_false(self) -> list[CaseResult]:
        return [c for c in self.fairness if c.status not in (*NOT_COUNTED, "passed")]

    @property
    def detected(self) -> int:
        return sum(p.detected for p in self.probes)

    @property
    def n_fairness(self) -> int:
        return sum(c.status not in NOT_COUNTED for c in self.fairness)

    @property
    def n_correct(self) -> int:
        return self.n_fairness + sum(
            sum(c.status not in NOT_COUNTED for c in p.correct_cases) for p in self.probes
        )

    @property
    def n_false(self) -> int:
        return len(self.fairness_false) + sum(len(p.false_failures) for p in self.probes)

    @property
    def ok(self) -> bool:
        return self.detected == len(self.probes) and self.n_false == 0

    def line(self) -> str:
        return (
            f"detected {self.detected}/{len(self.probes)} mutants, "
            f"false failures {self.n_false}/{self.n_correct} correct cases "
            f"(fairness corpus: {len(self.fairness_false)}/{self.n_fairness})"
        )


def available_impls(op: str, names: tuple[str, ...]) -> list[str]:
    """Those of `names` registered for `op` here (kassay's Triton impls need triton)."""
    out = []
    for n in names:
        try:
            get_impl(op, n)
            out.append(n)
        except Exception:
            continue
    return out


def run_selftest(*, device: str = "auto", only: list[str] | None = None) -> SelftestResult:
    load(mutants=True)
    if only:
        _check_only(only)
    dev = resolve_device(device)
    results = []
    for i, probe in enumerate(probes()):
        if only and probe.mutant not in only and f"{probe.op}.{probe.mutant}" not in only:
            continue
        pr = ProbeResult(probe)
        # kassay's bfloat16 kernels on a CPU come back skipped (kassay.validate.interpreter)
        correct = available_impls(probe.op, probe.correct or correct_impls(probe.op))
        for regime in probe.regimes:
            g = GroupSpec(
                group_id=f"selftest-{i}-{regime}",
                op=probe.op,
                params=probe.params,
                regime=regime,
                seed=0,
                impls=[*correct, probe.mutant],
                baseline=probe.baseline,
                timing=TimingPolicy(enabled=False),
            )
            cases = run_group(g, device=dev, include_mutants=True, ceilings=False)
            pr.mutant_cases += [c for c in cases if c.impl == probe.mutant]
            pr.correct_cases += [c for c in cases if c.impl != probe.mutant]
        results.append(pr)
    results += _run_plain(dev, only)
    fairness = _run_fairness(dev) if not only or "fairness" in only else []
    return SelftestResult(results, fairness)


def _check_only(only: list[str]) -> None:
    """InvalidSpecError naming the `only` entries that match no probe: a typo must not run
    nothing and pass."""
    from kassay.errors import InvalidSpecError, did_you_mean

    names = {"fairness"}
    for p in (*probes(), *plain_probes()):
        names |= {p.mutant, f"{p.op}.{p.mutant}"}
    unknown = [o for o in only if o not in names]
    if unknown:
        known = sorted(n for n in names if "." in n)
        raise InvalidSpecError(
            f"no probe named {', '.join(unknown)}{did_you_mean(unknown[0], sorted(names))}; the "
            f"probes: {', '.join(known)} (or a mutant's name alone, or fairness)",
            details={"field": "only", "allowed": known},
        )


def _run_fairness(dev: Any) -> list[CaseResult]:
    """The fairness corpus under plain specs: correct alternatives beside the op's correct
    impls."""
    suites = []
    for op, params in fairness():
        impls = [i.name for i in list_impls(op, include_mutants=True) if i.kind == "alternative"]
        suites.append(
            Suite(
                op=op,
                impls=[*available_impls(op, correct_impls(op)), *impls],
                params=params,
                timing=TimingPolicy(enabled=False),
            )
        )
    spec = JobSpec(name="selftest-fairness", suites=suites)
    groups = expand(spec, check_impl=local_impl_check(include_mutants=True))
    return [
        c
        for g in groups
        if not g.skip
        for c in run_group(g, device=dev, include_mutants=True, ceilings=False)
    ]


def _run_plain(dev: Any, only: list[str] | None) -> list[ProbeResult]:
    """One plain suite per op holding the correct impls and every plain mutant of the op: the
    expansion (grid, every regime, default coverage) is the user's, run once."""
    out = []
    plain = plain_probes()
    for op in dict.fromkeys(p.op for p in plain):
        probes = [
            p
            for p in plain
            if p.op == op and (not only or p.mutant in only or f"{p.op}.{p.mutant}" in only)
        ]
        if not probes:
            continue
        correct = available_impls(op, correct_impls(op))
        spec = JobSpec(
            name=f"selftest-plain-{op}",
            suites=[
                Suite(
                    op=op,
                    impls=[*correct, *(p.mutant for p in probes)],
                    params=probes[0].params,
                    timing=TimingPolicy(enabled=False),
                )
            ],
        )
        groups = expand(spec, check_impl=local_impl_check(include_mutants=True))
        cases = [
            c
            for g in groups
            if not g.skip
            for c in run_group(g, device=dev, include_mutants=True, ceilings=False)
        ]
        for p in probes:
            pr = ProbeResult(p)
            pr.mutant_cases = [c for c in cases if c.impl == p.mutant]
            if p is probes[0]:  # the correct cases are shared: count them once
                pr.correct_cases = [c for c in cases if c.impl in correct]
            out.append(pr)
    return out
