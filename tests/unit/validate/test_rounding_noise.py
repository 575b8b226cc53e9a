"""The scalar flce loss's rounding noise joins its floor (Op.reference_noise).

Every 16-bit impl rounds the logits, each in its own way: eager's addmm once with the bias in,
Liger's mm and then `+ bias` twice. Their loss errors are partly independent draws of the same
size, so "2 x the baseline's error" on a scalar, one draw, failed correct impls: a simulation of
Liger's double rounding at its H200 coverage point (N=45 H=40 V=200 bf16, bias, softcap 30)
failed 68 of 200 seeds, and the H200 false-failure table showed it. The estimate, sigma^2 =
sum (dL/dz z)^2 h^2/3 from the float64 reference, is checked here against the errors it models,
and a loss bug of 0.1% is still caught.

float16 on the CPU (torch's own ops, no Triton kernel): its half-ulp is 8x smaller than
bfloat16's, the noise 8x smaller, the same rule."""

from __future__ import annotations

import re
import statistics

import torch
import torch.nn.functional as F

from kassay.contract.spec import GroupSpec, TimingPolicy
from kassay.impls import Impl, load, register
from kassay.ops import get_op
from kassay.ops.flce import harness as flce_harness
from kassay.validate import engine
from kassay.validate.engine import run_group

OP = get_op("flce")
CPU = torch.device("cpu")
CASE = {"N": 45, "H": 40, "V": 200, "bias": True, "softcap": 30.0, "ignore_fraction": 0.1}


def _loss(z: torch.Tensor, target: torch.Tensor, p: object) -> torch.Tensor:
    z = z.float()
    cap = p.softcap  # type: ignore[attr-defined]
    if cap is not None:
        z = cap * torch.tanh(z / cap)
    return F.cross_entropy(z, target, ignore_index=p.ignore_index)  # type: ignore[attr-defined]


def _double_rounded(x, w, target, b, p):
    """Correct, rounding each logit twice as Liger does: x @ W^T written in the input dtype,
    then `+ bias` written again."""
    z = x @ w.t()
    return _loss(z + b if b is not None else z, target, p)


def _loss_high(x, w, target, b, p):
    """A bug: the loss 0.1% too large (its gradients too)."""
    return _loss(F.linear(x, w, b), target, p) * 1.001


def test_the_noise_estimate_matches_the_errors_it_models() -> None:
    """Per seed, eager's loss error (one rounding) and the gap between one and two roundings,
    over sigma: spread like a standard normal's |draw| (median ~0.67), never far beyond."""
    for dtype in ("float16", "bfloat16"):
        one, gap = [], []
        for seed in range(24):
            p = OP.parse_params({**CASE, "dtype": dtype})
            inp = OP.make_inputs(p, "normal", seed, CPU)
            ref, noise = OP.reference_noise(inp, p)
            x, w, b, t = inp["x"], inp["weight"], inp["bias"], inp["target"]
            once = _loss(F.linear(x.float(), w.float(), b.float()).to(x.dtype), t, p)
            twice = _loss(((x.float() @ w.float().t()).to(x.dtype) + b), t, p)
            one.append(abs(float(once) - float(ref["loss"])) / noise["loss"])
            gap.append(abs(float(twice) - float(once)) / noise["loss"])
        assert 0.25 < statistics.median(one) < 1.0 and max(one) < 4.0, (dtype, one)
        assert 0.25 < statistics.median(gap) < 1.5 and max(gap) < 4.0, (dtype, gap)


def test_noise_only_for_a_scalar_loss_of_16_bit_logits() -> None:
    for over, has in (
        ({"dtype": "bfloat16"}, True),
        ({"dtype": "float16", "reduction": "sum"}, True),
        ({"dtype": "float32", "autocast": "bfloat16"}, True),
        ({"dtype": "float32"}, False),
        ({"dtype": "bfloat16", "reduction": "none"}, False),
    ):
        p = OP.parse_params({**CASE, **over})
        _, noise = OP.reference_noise(OP.make_inputs(p, "normal", 0, CPU), p)
        assert ("loss" in noise) is has, over
    p = OP.parse_params({**CASE, "dtype": "bfloat16"})
    inputs = OP.make_inputs(p, "normal", 0, CPU)
    assert set(OP.reference(inputs, p)) == set(OP.reference_noise(inputs, p)[0])


def _run(seed: int, impls: list[str], params: dict | None = None) -> dict:
    load(testing=True)
    g = GroupSpec(
        group_id="t",
        op="flce",
        params=params if params is not None else {**CASE, "dtype": "float16"},
        regime="normal",
        seed=seed,
        impls=impls,
        baseline="torch",
        timing=TimingPolicy(enabled=False),
    )
    cases = run_group(g, device="cpu", include_testing=True, ceilings=False)
    return {c.impl: c for c in cases}


def test_a_double_rounding_impl_passes_and_a_loss_bug_fails() -> None:
    register(
        Impl("flce", "t_double_rounded", flce_harness.as_run(_double_rounded), kind="testing"),
        replace=True,
    )
    register(
        Impl("flce", "t_loss_high", flce_harness.as_run(_loss_high), kind="testing"),
        replace=True,
    )
    tight = 0  # seeds where the double-rounded loss is beyond 2 x the baseline's error
    for seed in range(12):
        res = _run(seed, ["torch", "t_double_rounded", "t_loss_high"])
        loss = next(o for o in res["t_double_rounded"].outputs if o.name == "loss")
        tight += loss.rel_l2 > 2 * loss.baseline_rel_l2
        assert res["t_double_rounded"].status == "passed", res["t_double_rounded"].message
        high = res["t_loss_high"]
        assert high.status == "failed" and "loss" in high.message, high.message
    assert tight >= 2  # the old rule would have failed these seeds


# reduction none: rounding each row's grad_output once for the whole row ------------------------

ROWS = {
    "N": 45,
    "H": 40,
    "V": 200,
    "dtype": "float16",
    "reduction": "none",
    "bias": True,
    "label_smoothing": 0.1,
    "ignore_fraction": 0.25,
}


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; backward hands on grad_output rounded to `dtype` and times `factor`."""

    @staticmethod
    def forward(ctx, t, dtype, factor):  # type: ignore[no-untyped-def]
        ctx.dtype, ctx.factor = dtype, factor
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        return g.to(ctx.dtype).to(g.dtype) * ctx.factor, None, None


def _rows(x, w, target, b, p):
    z = F.linear(x, w, b).float()
    return F.cross_entropy(
        z, target, ignore_index=p.ignore_index, reduction="none", label_smoothing=p.label_smoothing
    )


def _go_rounded(x, w, target, b, p):
    """Correct, as Liger's backward: each row's grad_output rounded to the input dtype before
    it scales the row's logit gradients, so the whole row carries one rounding error."""
    return _ScaleGrad.apply(_rows(x, w, target, b, p), x.dtype, 1.0)


def _grads_high(x, w, target, b, p):
    """A bug: every gradient 0.5% too large (grad_output rounded too, as the correct one)."""
    return _ScaleGrad.apply(_rows(x, w, target, b, p), x.dtype, 1.005)


def test_scale_noise_estimate_matches_the_shift_it_models() -> None:
    """Per seed, the fitted scale between the reference with grad_output rounded per row and
    the exact one, over the estimate: like a standard normal's |draw|, never far beyond."""
    for dtype in ("float16", "bfloat16"):
        p = OP.parse_params({**ROWS, "dtype": dtype})
        ratios: dict[str, list[float]] = {"grad_input": [], "grad_weight": [], "grad_bias": []}
        for seed in range(24):
            inp = OP.make_inputs(p, "normal", seed, CPU)
            ref, noise = OP.reference_noise(inp, p)
            go16 = inp["grad_output"].to(getattr(torch, dtype)).float()
            shifted = OP.reference({**inp, "grad_output": go16}, p)
            for k, v in ratios.items():
                r = ref[k]
                s = float(((shifted[k] - r) * r).sum() / (r * r).sum())
                v.append(abs(s) / noise["scale:" + k])
        for k, v in ratios.items():
            assert 0.25 < statistics.median(v) < 1.0 and max(v) < 4.0, (dtype, k, v)


def test_scale_noise_only_for_16_bit_reduction_none() -> None:
    for over, has in (
        ({}, True),
        ({"dtype": "float32", "autocast": "bfloat16"}, True),
        ({"dtype": "float32"}, False),
        ({"reduction": "mean"}, False),
    ):
        p = OP.parse_params({**ROWS, **over})
        _, noise = OP.reference_noise(OP.make_inputs(p, "normal", 0, CPU), p)
        assert ("scale:grad_weight" in noise) is has, over


def test_a_row_rounding_impl_passes_and_a_scaled_gradient_fails(monkeypatch) -> None:
    register(
        Impl("flce", "t_go_rounded", flce_harness.as_run(_go_rounded), kind="testing"), replace=True
    )
    register(
        Impl("flce", "t_grads_high", flce_harness.as_run(_grads_high), kind="testing"), replace=True
    )
    seeds = range(12)
    for seed in seeds:
        res = _run(seed, ["torch", "t_go_rounded", "t_grads_high"], ROWS)
        ok = res["t_go_rounded"]
        assert ok.status == "passed", (seed, ok.message)
        high = res["t_grads_high"]
        assert high.status == "failed", high.message
        assert re.search(r"grad_weight biased by \+0\.(4[5-9]|5[0-5])%", high.message), high.message
    # Before #29 the bias check flagged this correct impl on some seeds without the scale
    # noise (its scale was judged against the baseline's own); judged against the truth, beyond
    # factor x the baseline's |s| and the participation noise, it passes even without it, and
    # the 0.5% scale still fails
    monkeypatch.setattr(engine, "SCALE_NOISE", "off:")
    for s in seeds:
        res = _run(s, ["torch", "t_go_rounded", "t_grads_high"], ROWS)
        assert res["t_go_rounded"].status == "passed", (s, res["t_go_rounded"].message)
        assert res["t_grads_high"].status == "failed", (s, res["t_grads_high"].message)
