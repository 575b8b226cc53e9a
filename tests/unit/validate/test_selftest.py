"""The mutant corpus: every known bug is caught, no correct impl is flagged."""

from kassay.impls import list_impls, load
from kassay.validate.selftest import plain_probes, probes, run_selftest


def test_every_known_bug_has_a_mutant_with_a_probe() -> None:
    load(mutants=True)
    mutants = {(i.op, i.name) for i in list_impls(include_mutants=True) if i.kind == "mutant"}
    assert {(p.op, p.mutant) for p in (*probes(), *plain_probes())} == mutants
    bugs = {
        i.bug.split(":")[0]
        for i in list_impls(include_mutants=True)
        if i.kind == "mutant" and i.bug
    }
    assert bugs == {str(n) for n in range(1, 24)}
    assert not any(i.kind == "mutant" for i in list_impls())  # hidden by default


def test_selftest_detects_all_and_flags_no_correct_impl() -> None:
    result = run_selftest(device="cpu")
    n = len(probes()) + len(plain_probes())
    assert result.line().startswith(f"detected {n}/{n} mutants"), [
        (p.probe.mutant, [c.status for c in p.mutant_cases])
        for p in result.probes
        if not p.detected
    ]
    assert result.n_false == 0, [
        (c.impl, c.message) for p in result.probes for c in p.false_failures
    ]
    assert result.n_correct >= len(probes()) - 1
    # the fairness corpus: every correct alternative ran, at every dtype and AMP, and none failed
    assert result.fairness_false == []
    ran = {(c.op, c.impl) for c in result.fairness if c.status == "passed"}
    alternatives = {
        (i.op, i.name) for i in list_impls(include_mutants=True) if i.kind == "alternative"
    }
    assert alternatives and alternatives <= ran
    amp = {c.dtype for c in result.fairness if c.op == "flce" and c.impl == "alt_float64"}
    assert {"float32", "float16", "bfloat16", "amp-bfloat16", "amp-float16"} <= amp
    assert result.line().endswith(f"(fairness corpus: 0/{result.n_fairness})")
    assert result.ok
