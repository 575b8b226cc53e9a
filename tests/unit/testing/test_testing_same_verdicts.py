"""kassay.testing judges as a job does (#39): for every mutant of the self-test corpus and each
of its probe's cases, assert_kernel's verdict is the status `kassay run` (kassay.validate.local
.run_job, the command's engine) gives the same impl on the same case key; the correct impls'
cases pass in both."""

from __future__ import annotations

import pytest

import kassay.testing as kt
from kassay.contract.spec import JobSpec
from kassay.impls import get_impl, load
from kassay.validate.local import run_job
from kassay.validate.selftest import probes

load(mutants=True)
PROBES = [p for p in probes() if p.op in ("flce", "lse_merge")]


@pytest.mark.parametrize("probe", PROBES, ids=[f"{p.op}.{p.mutant}" for p in PROBES])
def test_a_mutant_gets_the_same_verdict_in_pytest_and_kassay_run(probe) -> None:  # type: ignore[no-untyped-def]
    grid = {"regimes": list(probe.regimes), "coverage": "none", "baseline": probe.baseline}
    suite = {"op": probe.op, "impls": [probe.mutant], "params": probe.params, **grid}
    suite["timing"] = {"enabled": False}
    report = run_job(
        JobSpec.model_validate({"name": "same-verdicts", "suites": [suite]}),
        device="cpu",
        include_mutants=True,
        ceilings=False,
    )
    in_run = {c.group_id: c.status for c in report.cases}
    mutant = get_impl(probe.op, probe.mutant, include_mutants=True)
    in_pytest: dict[str, str] = {}
    for case in kt.cases(probe.op, regimes=probe.regimes, **probe.params):
        try:
            results = kt.assert_kernel(probe.op, mutant, case, baseline=probe.baseline)
        except kt.KernelAssertionError as exc:
            results = exc.results
        except pytest.skip.Exception:
            in_pytest[case.key] = "skipped"
            continue
        (res,) = results
        in_pytest[case.key] = res.status
    assert in_pytest == in_run
    assert any(s not in ("passed", "skipped", "unsupported") for s in in_run.values()), in_run
