"""A baseline whose error its precision explains (flce's 16-bit logits at |z| ~ 1e3) is trusted;
one with a real bug stays suspect, and bugs of the others are still caught.

fp16 on the CPU (the interpreter's bf16 tl.dot is wrong): at N=16, H=64, V=2000, large_logits,
eager torch's gradients are ~1.3% rel_l2 off the exact float64 reference (suspect by the
baseline rule) and ~1e-4 off the reference with the logits rounded to float16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kassay.impls import Impl, get_impl, load, register
from kassay.ops import get_op
from kassay.ops.flce import FlceOp
from kassay.ops.runtime import flce as rt
from kassay.validate.engine import run_group
from kassay.validate.results import CaseResult
from kassay.validate.spec import GroupSpec, TimingPolicy

LL = {"N": 16, "H": 64, "V": 2000, "dtype": "float16"}


def _run(
    params: dict, impls: list[str], baseline: str = "torch", regime: str = "large_logits"
) -> dict[str, CaseResult]:
    load(mutants=True, testing=True)
    g = GroupSpec(
        group_id="t",
        op="flce",
        params=params,
        regime=regime,
        impls=impls,
        baseline=baseline,
        timing=TimingPolicy(enabled=False),
    )
    cases = run_group(g, device="cpu", include_mutants=True, include_testing=True, ceilings=False)
    return {c.impl: c for c in cases}


def _count_precision_references(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = FlceOp.precision_reference

    def counted(self: FlceOp, inputs: dict, params: object) -> dict:
        calls.append(1)
        return real(self, inputs, params)  # type: ignore[arg-type]

    monkeypatch.setattr(FlceOp, "precision_reference", counted)
    return calls


def _kassay_grad_weight_scaled(inputs: dict, params: object) -> dict:
    """kassay with grad_weight 0.5% too large: inside 2 x the explained baseline's error."""
    out = dict(get_impl("flce", "kassay").run(inputs, params))
    gw = out["grad_weight"]
    out["grad_weight"] = (gw.float() * 1.005).to(gw.dtype)
    return out


def test_torch_in_fp16_large_logits_is_explained_and_bugs_are_still_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _count_precision_references(monkeypatch)
    register(
        Impl("flce", "t_kassay_gw_half_percent", _kassay_grad_weight_scaled, kind="testing"),
        replace=True,
    )
    res = _run(LL, ["torch", "kassay", "t_kassay_gw_half_percent"])
    base = res["torch"]
    assert base.status == "passed" and base.flags == ["baseline_explained"], base.message
    assert len(calls) == 1  # one precision reference for the group, for the baseline only
    gw = next(o for o in base.outputs if o.name == "grad_weight")
    assert gw.rel_l2 > 1e-2 and not gw.baseline_suspect  # the suspect rule's bar, yet trusted
    assert "grad_weight: baseline explained by its precision: rel_l2 0.01" in base.message
    assert "against the reference with logits rounded to float16" in base.message
    assert gw.reason in base.message
    kassay = res["kassay"]
    assert kassay.status == "passed" and not kassay.flags, kassay.message
    for o in kassay.outputs:  # judged by the baseline's limits, not the absolute policy
        assert o.policy == "baseline" and o.baseline_rel_l2 is not None
    bad = res["t_kassay_gw_half_percent"]
    assert bad.status == "failed" and "biased" in bad.flags, bad.message
    assert "grad_weight biased by +0.5" in bad.message


def test_a_wrong_baseline_stays_suspect_in_large_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_precision_references(monkeypatch)
    p = {**LL, "reduction": "none"}  # the mutant scales every row by grad_output[0]
    res = _run(p, ["m_none_grad_scale", "torch"], baseline="m_none_grad_scale")
    base = res["m_none_grad_scale"]
    assert calls  # its error was checked against the 16-bit-logits reference too
    assert base.status == "failed" and base.flags == ["baseline_suspect"], base.message
    assert "baseline suspect" in base.message and "explained" not in base.message
    assert all(o.policy == "absolute" for o in res["torch"].outputs if o.name != "loss")
    # the same mutant judged against the explained torch baseline is caught
    res = _run(p, ["torch", "m_none_grad_scale"])
    assert res["torch"].flags == ["baseline_explained"]
    assert res["m_none_grad_scale"].status == "failed"


def test_the_precision_reference_is_computed_only_for_a_suspect_baseline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _count_precision_references(monkeypatch)
    res = _run({**LL, "N": 8}, ["torch"], regime="normal")
    assert res["torch"].status == "passed" and not res["torch"].flags
    assert not calls
    # float32 has no precision reference: nothing to explain with
    assert get_op("flce").precision_rounding(get_op("flce").parse_params(LL)) is not None
    p32 = get_op("flce").parse_params({**LL, "dtype": "float32"})
    assert get_op("flce").precision_rounding(p32) is None


def test_an_amp_baseline_is_explained_by_its_autocast_dtype() -> None:
    p = {"N": 16, "H": 64, "V": 2000, "dtype": "float32", "autocast": "bfloat16"}
    base = _run(p, ["torch"])["torch"]
    assert base.status == "passed" and base.flags == ["baseline_explained"], base.message
    assert "x, W and logits rounded to bfloat16 (autocast)" in base.message


@pytest.mark.parametrize(
    "extra",
    [
        {"dtype": "float16", "bias": True, "softcap": 30.0, "label_smoothing": 0.1},
        {"dtype": "float32", "autocast": "bfloat16", "bias": True},
    ],
    ids=["fp16-bias-softcap", "amp-bf16"],
)
def test_precision_reference_is_the_truth_on_rounded_logits(extra: dict) -> None:
    """Against float64 autograd through logits rounded once to the compute dtype (after the
    bias, before the softcap; under AMP on operands rounded to it too)."""
    op = get_op("flce")
    p = op.parse_params({"N": 12, "H": 16, "V": 300, **extra})
    inputs = op.make_inputs(p, "large_logits", 0, torch.device("cpu"))
    dt = p.compute_dtype
    x, w, b = (inputs[k].to(dt).double().requires_grad_() for k in ("x", "weight", "bias"))
    z = x @ w.T + b
    z = z + (z.to(dt).double() - z).detach()  # rounded values, gradient of the identity
    zc = p.softcap * torch.tanh(z / p.softcap) if p.softcap else z
    loss = F.cross_entropy(zc, inputs["target"], label_smoothing=p.label_smoothing)
    loss.backward()
    got = op.precision_reference(inputs, p)
    for name, want in (
        ("loss", loss),
        ("grad_input", x.grad),
        ("grad_weight", w.grad),
        ("grad_bias", b.grad),
    ):
        torch.testing.assert_close(got[name], want.detach(), rtol=1e-10, atol=1e-12)
    # the rounding moves the truth far beyond the tolerance above (softcap 30 squeezes it)
    exact = op.reference(inputs, p)["grad_weight"]
    assert float((exact - got["grad_weight"]).norm()) > 1e-5 * float(exact.norm())


def test_rounding_that_rounds_nothing_leaves_the_reference_bit_identical() -> None:
    """Logits that float16 holds exactly (small integer x and W): the rounded reference is the
    exact one bit for bit, so the option touches the logits and nothing else; without it the
    reference is what it was."""
    op = get_op("flce")
    p = op.parse_params({"N": 12, "H": 8, "V": 50, "dtype": "float16", "bias": True})
    inputs = op.make_inputs(p, "normal", 0, torch.device("cpu"))
    g = torch.Generator().manual_seed(1)
    for k, shape in (("x", (12, 8)), ("weight", (50, 8)), ("bias", (50,))):
        inputs[k] = torch.randint(-3, 4, shape, generator=g).to(torch.float16)
    exact = rt.reference(inputs, p)
    for dt in (torch.float16, None):
        again = rt.reference(inputs, p, logits_dtype=dt)
        assert exact.keys() == again.keys()
        assert all(torch.equal(exact[k], again[k]) for k in exact)
    inputs["x"] = inputs["x"] * 1.001  # now the logits round
    rounded = rt.reference(inputs, p, logits_dtype=torch.float16)
    assert not torch.equal(rt.reference(inputs, p)["grad_weight"], rounded["grad_weight"])
