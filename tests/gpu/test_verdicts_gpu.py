"""Verdict checks on CUDA: correct bfloat16 impls are not flagged biased or nondeterministic,
kassay's float32 flce passes the default policy at the CI shape, and kassay's bfloat16
lse_merge rounds to nearest (the CPU interpreter truncates)."""

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
    from kassay.validate.engine import run_group
    from kassay.validate.spec import GroupSpec, TimingPolicy

    g = GroupSpec(
        group_id="gpu-verdicts",
        op=op,
        params=params,
        regime=regime,
        impls=impls,
        timing=TimingPolicy(enabled=False),
    )
    return run_group(g, device="cuda", ceilings=False)


@pytest.mark.parametrize("regime", ["normal", "large_logits"])
def test_correct_bf16_flce_impls_are_not_flagged(regime: str) -> None:
    p = {"N": 4096, "H": 2048, "V": 32000, "dtype": "bfloat16", "ignore_fraction": 0.1}
    cases = _run("flce", p, _available("flce", CORRECT_FLCE), regime)
    bad = [(c.impl, c.flags, c.message) for c in cases if c.status not in ("passed", "unsupported")]
    assert not bad, bad


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
