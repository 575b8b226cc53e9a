"""The PyTorch impls and peer formulas on CPU, through the engine."""

import pytest
import torch
import torch.nn.functional as F

from kassay.contract.spec import GroupSpec, TimingPolicy
from kassay.validate.engine import run_group

NO_TIMING = TimingPolicy(enabled=False)


def _run(op: str, params: dict, impls: list[str], regime: str = "normal") -> dict:
    g = GroupSpec(group_id="g", op=op, params=params, impls=impls, regime=regime, timing=NO_TIMING)
    return {r.impl: r for r in run_group(g, device="cpu", ceilings=False)}


@pytest.mark.skipif(not hasattr(F, "linear_cross_entropy"), reason="torch < 2.13")
def test_torch_compile_and_native_flce_pass() -> None:
    res = _run(
        "flce",
        {"N": 16, "H": 8, "V": 32, "dtype": "float32", "bias": True},
        ["torch", "torch_compile", "torch_native"],
    )
    assert {k: v.status for k, v in res.items()} == dict.fromkeys(res, "passed")


_OPTIONS = [
    {"ce_weight": True, "ignore_fraction": 0.25},
    {"ce_weight": True, "label_smoothing": 0.1, "bias": True, "reduction": "sum"},
    {"ce_weight": True, "reduction": "none", "label_smoothing": 0.2},
    {"accum_dtype": "float32", "bias": True},
    {"use_token_scaling": True, "label_smoothing": 0.1, "z_loss_scale": 1e-3},
    {"return_token_accuracy": True, "V": 5, "ignore_fraction": 0.25, "softcap": 4.0},
]


@pytest.mark.parametrize("opts", _OPTIONS)
def test_liger_parity_options_pass_on_every_impl_that_takes_them(opts: dict) -> None:
    # torch (the baseline), kassay (interpreter, float32) and torch_native where it has the
    # option; torch_native declares token scaling/accuracy unsupported, and with its two
    # options it passes (shown against the float64 reference by the engine)
    impls = ["torch", "kassay"] + (["torch_native"] if hasattr(F, "linear_cross_entropy") else [])
    res = _run("flce", {"N": 24, "H": 8, "V": 40, "dtype": "float32", **opts}, impls)
    native = res.pop("torch_native", None)
    assert {k: v.status for k, v in res.items()} == dict.fromkeys(res, "passed"), {
        k: v.message for k, v in res.items()
    }
    if native is not None:
        want = (
            "unsupported"
            if "use_token_scaling" in opts or "return_token_accuracy" in opts
            else "passed"
        )
        assert native.status == want, native.message


def test_a_loss_fn_without_ce_weight_cannot_run_weighted_cases() -> None:
    from kassay.ops import get_op
    from kassay.ops.flce import harness as flce_harness

    def plain(x, w, t, b, p):  # an older plugin: no ce_weight keyword
        return F.cross_entropy(F.linear(x, w, b).float(), t)

    op = get_op("flce")
    p = op.parse_params({"N": 4, "H": 4, "V": 8, "dtype": "float32", "ce_weight": True})
    with pytest.raises(RuntimeError, match="takes no ce_weight"):
        flce_harness.as_run(plain)(op.make_inputs(p, "normal", 0, torch.device("cpu")), p)


def test_native_declares_what_it_cannot_do() -> None:
    res = _run(
        "flce",
        {"N": 8, "H": 8, "V": 16, "dtype": "float32", "softcap": 5.0},
        ["torch", "torch_native"],
    )
    assert res["torch_native"].status == "unsupported"


def test_every_target_ignored_baseline_zero_torch_native_nan() -> None:
    # The baseline follows the op's contract (0/0 = 0: a plain spec runs every regime, and a
    # baseline must be right there); torch's own F.linear_cross_entropy returns NaN, a real
    # finding the service reports.
    p = {"N": 8, "H": 8, "V": 16, "dtype": "float32"}
    res = _run("flce", p, ["torch", "torch_native"], "all_ignored")
    assert res["torch"].status == "passed", res["torch"].message
    assert res["torch_native"].status == "failed" and "NaN" in res["torch_native"].message


def test_autocast_case_returns_parameter_dtype_gradients() -> None:
    res = _run(
        "flce", {"N": 16, "H": 8, "V": 32, "dtype": "float32", "autocast": "bfloat16"}, ["torch"]
    )
    outs = {o.name: o for o in res["torch"].outputs}
    assert res["torch"].status == "passed"
    assert outs["grad_weight"].dtype == "float32" and outs["grad_input"].dtype == "float32"


@pytest.mark.parametrize("regime", ["empty_rows", "fa2_inf"])
def test_peer_formulas_produce_nan_on_rows_empty_in_every_state(regime: str) -> None:
    p = {"T": 64, "Hh": 4, "D": 8, "K": 2, "dtype": "float32", "mode": "step"}
    res = _run("lse_merge", p, ["torch", "te_style", "ring_style"], regime)
    assert res["torch"].status == "passed"
    assert res["te_style"].status == "failed" and "NaN" in res["te_style"].message
    assert res["ring_style"].status == "failed"


def test_te_style_loses_precision_at_huge_lse() -> None:
    p = {"T": 64, "Hh": 4, "D": 8, "K": 4, "dtype": "float32", "mode": "step"}
    res = _run("lse_merge", p, ["torch", "te_style"], "huge")
    assert res["torch"].status == "passed"
    out = next(o for o in res["te_style"].outputs if o.name == "out")
    # The running lse is float32 in every impl (ulp 1e-3 at 1e4), but the log1p form rounds it
    # once more per step and scales both states by the rounded value.
    assert out.rel_l2 > 3 * out.baseline_rel_l2


def test_in_place_update_writes_the_callers_tensors() -> None:
    from kassay.ops.lse_merge.baseline import update_torch

    out = torch.randn(6, 2, 4)
    lse = torch.randn(2, 6)
    ptr = out.data_ptr()
    before = out.clone()
    update_torch(
        out,
        lse,
        torch.randn(3, 2, 4),
        torch.randn(2, 3),
        lse_layout="hT",
        second_half=True,
        acc=None,
    )
    assert out.data_ptr() == ptr
    assert torch.equal(out[:3], before[:3]) and not torch.equal(out[3:], before[3:])


@pytest.mark.parametrize("budget", [24 * 64 * 4, "auto"])
def test_kassays_memory_budget_param_reaches_its_schedule(budget) -> None:
    # 6 KiB: the vocabulary-panel schedule (64-column panels); "auto": the default row chunks.
    # Either way the engine's verdict is kassay's own default one, and torch ignores the knob.
    from kassay.kernels import plan_call

    params = {
        "N": 24,
        "H": 8,
        "V": 300,
        "dtype": "float32",
        "bias": True,
        "memory_budget_bytes": budget,
    }
    want = "vocab" if budget != "auto" else "rows"
    x, w = torch.zeros(24, 8), torch.zeros(300, 8)
    assert plan_call(x, w, memory_budget_bytes=budget).schedule == want
    res = _run(
        "flce", {**params, "label_smoothing": 0.1, "ignore_fraction": 0.25}, ["torch", "kassay"]
    )
    assert {k: v.status for k, v in res.items()} == {"torch": "passed", "kassay": "passed"}, {
        k: v.message for k, v in res.items()
    }
    assert res["kassay"].params["memory_budget_bytes"] == budget


def test_a_bad_memory_budget_is_refused_with_the_field_named() -> None:
    from kassay.ops import get_op

    for bad in (0, "lots", 1.5):
        with pytest.raises(ValueError, match="memory_budget_bytes"):
            get_op("flce").parse_params({"N": 4, "H": 4, "V": 8, "memory_budget_bytes": bad})
