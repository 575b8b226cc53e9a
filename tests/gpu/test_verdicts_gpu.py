"""Verdict checks on CUDA: correct bfloat16 impls are not flagged biased or nondeterministic,
torch's bfloat16 flce at large logits is explained by its bf16 logits (not suspect) and the
others are then judged tightly (a 3% error fails, correct impls pass), kassay's
float32 flce passes the default policy at the CI shape, and kassay's bfloat16 lse_merge rounds
to nearest (the CPU interpreter truncates)."""

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

CORRECT_FLCE = ("torch", "torch_compile", "kassay", "liger", "cce")


def _available(op: str, names: tuple[str, ...]) -> list[str]:
    from kassay.impls import get_impl, load

    load()
    out = []
    for n in names:
        try:
            get_impl(op, n)
            out.append(n)
        except Exception:
            continue
    return out


def _run(op: str, params: dict, impls: list[str], regime: str = "normal") -> list:
    from kassay.contract.spec import GroupSpec, TimingPolicy
    from kassay.validate.engine import run_group

    g = GroupSpec(
        group_id="gpu-verdicts",
        op=op,
        params=params,
        regime=regime,
        impls=impls,
        timing=TimingPolicy(enabled=False),
    )
    return run_group(g, device="cuda", ceilings=False)


def test_correct_bf16_flce_impls_are_not_flagged() -> None:
    p = {"N": 4096, "H": 2048, "V": 32000, "dtype": "bfloat16", "ignore_fraction": 0.1}
    from kassay.impls import get_impl

    cases = _run("flce", p, _available("flce", CORRECT_FLCE))
    # No correct impl is biased, nor nondeterministic unless it declares so (cce's atomics and
    # torch's reductions are declared: the flag then only reports it).
    flagged = [
        (c.impl, c.flags, c.message)
        for c in cases
        if set(c.flags)
        - ({"nondeterministic"} if get_impl("flce", c.impl).nondeterministic else set())
    ]
    assert not flagged, flagged
    # cce's grad_input error is several times eager's (known, README): it may fail the
    # tolerance, the others pass.
    bad = [
        (c.impl, c.message)
        for c in cases
        if c.impl != "cce" and c.status not in ("passed", "unsupported")
    ]
    assert not bad, bad


def test_bf16_large_logits_are_explicit_and_the_baseline_is_explained() -> None:
    """|logits| ~ 1e3 in bfloat16: eager torch's gradients are several % off the exact truth
    (its bf16 logits), so a suite that lists no regimes still skips the regime for 16-bit flce;
    asked for explicitly, torch's error is explained by the reference on bf16-rounded logits:
    not suspect, its message gives both errors, and kassay is judged by the explained rules."""
    from kassay.contract.spec import parse_spec
    from kassay.ops.expand import expand

    p = {"N": 1024, "H": 512, "V": 8000, "dtype": "bfloat16"}
    plain = expand(
        parse_spec({"name": "x", "suites": [{"op": "flce", "impls": ["torch"], "params": p}]})
    )
    assert "large_logits" not in {g.regime for g in plain}
    cases = {c.impl: c for c in _run("flce", p, ["torch", "kassay"], "large_logits")}
    torch_case = cases["torch"]
    assert "baseline_suspect" not in torch_case.flags, torch_case.message
    assert "baseline_explained" in torch_case.flags, torch_case.message
    assert "against the reference with logits rounded to bfloat16" in torch_case.message
    assert all(not o.baseline_suspect for o in torch_case.outputs)
    # on the explained outputs kassay is judged by the two rules (no limit against the exact
    # errors), elsewhere by the baseline's limits
    explained = {o.name for o in torch_case.outputs if "explained by its precision" in o.reason}
    assert {"grad_input", "grad_weight"} <= explained, torch_case.message
    for o in cases["kassay"].outputs:
        if o.name in explained:
            assert o.threshold_rel_l2 is None, o
            assert o.reason.startswith(("accurate:", "as its precision computes:")), o
        else:
            assert o.policy == "baseline" and o.threshold_rel_l2 is not None, o


def test_kassay_bf16_large_logits_gradients_are_unbiased() -> None:
    # Once xfail: torch's bf16 logits made the baseline suspect, so kassay (bias -0.59% against
    # the exact truth on the H200) met the absolute policy. Both write bf16 logits; on the CPU in
    # fp16 both are ~1e-4 off the reference on rounded logits, so the explained baseline's
    # limits and bias are what kassay now meets.
    p = {"N": 1024, "H": 512, "V": 8000, "dtype": "bfloat16"}
    cases = {c.impl: c for c in _run("flce", p, ["torch", "kassay"], "large_logits")}
    assert cases["kassay"].status == "passed", cases["kassay"].message


def _kassay_grad_weight_noise(inputs: dict, params: object) -> dict:
    """kassay with a zero-mean 3% rel_l2 error on grad_weight, orthogonal to it (no scale) and
    the same on every call."""
    from kassay.impls import get_impl

    out = dict(get_impl("flce", "kassay").run(inputs, params))
    gw = out["grad_weight"].double()
    g = torch.Generator(device=gw.device).manual_seed(7)
    noise = torch.randn(gw.shape, generator=g, device=gw.device, dtype=gw.dtype) * gw.abs()
    noise -= (noise * gw).sum() / (gw * gw).sum() * gw
    noise *= 0.03 * gw.norm() / noise.norm()
    out["grad_weight"] = (gw + noise).to(out["grad_weight"].dtype)
    return out


def test_bf16_large_logits_limits_are_tight_for_the_others() -> None:
    """torch's bf16 gradients are ~8% off the exact truth at |z| ~ 1e3: "2 x" that passed a 3%
    non-scaling error; against the reference on bf16-rounded logits it fails. The correct impls
    pass (kassay, torch_compile and liger by the precision rule, cce if its logits are float32
    by the accurate one); cce's grad_input error is several times eager's (known): printed, not
    asserted."""
    from kassay.impls import Impl, register

    register(
        Impl("flce", "t_kassay_gw_noise", _kassay_grad_weight_noise, kind="testing"), replace=True
    )
    p = {"N": 1024, "H": 512, "V": 8000, "dtype": "bfloat16"}
    impls = ["torch", *_available("flce", CORRECT_FLCE[1:]), "t_kassay_gw_noise"]
    from kassay.contract.spec import GroupSpec, TimingPolicy
    from kassay.validate.engine import run_group

    g = GroupSpec(
        group_id="gpu-explained",
        op="flce",
        params=p,
        regime="large_logits",
        impls=impls,
        timing=TimingPolicy(enabled=False),
    )
    cases = {c.impl: c for c in run_group(g, device="cuda", ceilings=False, include_testing=True)}
    for c in cases.values():
        print(c.impl, c.status, c.flags, c.message[:400])
    assert "baseline_explained" in cases["torch"].flags, cases["torch"].message
    bad = cases["t_kassay_gw_noise"]
    gw = next(o for o in bad.outputs if o.name == "grad_weight")
    base_gw = next(o for o in cases["torch"].outputs if o.name == "grad_weight")
    assert gw.rel_l2 < 2 * base_gw.rel_l2  # inside the former limit
    assert bad.status == "failed" and "grad_weight: not accurate" in bad.message, bad.message
    wrong = [
        (c.impl, c.flags, c.message)
        for c in cases.values()
        if c.impl not in ("cce", "t_kassay_gw_noise")
        and (
            c.status not in ("passed", "unsupported")
            or set(c.flags) - {"nondeterministic", "baseline_explained"}
        )
    ]
    assert not wrong, wrong


@pytest.mark.parametrize("ls", [0.0, 0.1])
def test_kassay_fp32_flce_passes_the_default_policy_at_the_ci_shape(ls: float) -> None:
    p = {"N": 8192, "H": 4096, "V": 128256, "dtype": "float32", "label_smoothing": ls}
    cases = _run("flce", p, ["torch", "kassay"])
    for c in cases:
        assert c.status == "passed", (c.impl, c.message)


def test_kassay_bf16_lse_merge_is_unbiased_on_gpu() -> None:
    p = {"T": 4096, "Hh": 8, "D": 128, "K": 8, "dtype": "bfloat16", "mode": "step"}
    for regime in ("normal", "empty_rows", "fa2_inf"):
        cases = _run("lse_merge", p, ["torch", "kassay"], regime)
        for c in cases:
            assert c.status == "passed" and not c.flags, (regime, c.impl, c.message)
