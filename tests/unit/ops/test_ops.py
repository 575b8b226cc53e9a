"""Each op's float64 reference against an independent small computation."""

import pytest
import torch
import torch.nn.functional as F

from kassay.ops import get_op
from kassay.ops.lse_merge.runtime import lse_to_th

CPU = torch.device("cpu")


def _autograd_flce(inputs: dict, p) -> dict:
    x = inputs["x"].double().requires_grad_()
    w = inputs["weight"].double().requires_grad_()
    b = inputs["bias"].double().requires_grad_() if "bias" in inputs else None
    z = F.linear(x, w, b)
    if p.softcap is not None:
        z = p.softcap * torch.tanh(z / p.softcap)
    t = inputs["target"]
    cw = inputs["ce_weight"].double() if p.ce_weight else None
    valid = (t != p.ignore_index).double()
    if p.use_token_scaling:  # per row, times the detached target probability, then reduced
        safe = torch.where(t != p.ignore_index, t, 0)
        p_t = torch.softmax(z, -1).gather(1, safe[:, None])[:, 0].detach()
        rows = F.cross_entropy(
            z, t, weight=cw, ignore_index=p.ignore_index, label_smoothing=p.label_smoothing,
            reduction="none",
        ) * p_t  # fmt: skip
        den = valid.sum() if cw is None else (cw[safe] * valid).sum()
        loss = rows if p.reduction == "none" else rows.sum()
        loss = loss / den if p.reduction == "mean" else loss
    else:  # torch's own (weighted) cross-entropy, its mean included
        p_t = torch.ones_like(valid)
        loss = F.cross_entropy(
            z, t, weight=cw, ignore_index=p.ignore_index, label_smoothing=p.label_smoothing,
            reduction=p.reduction,
        )  # fmt: skip
    zl = p.z_loss_scale * torch.logsumexp(z, -1) ** 2 * valid * p_t
    zl = zl if p.reduction == "none" else zl.sum() / (valid.sum() if p.reduction == "mean" else 1.0)
    total = loss + zl
    total.backward(inputs["grad_output"].double().expand_as(total))
    out = {
        "loss": total.detach(),
        "z_loss": zl.detach(),
        "grad_input": x.grad,
        "grad_weight": w.grad,
    }
    if b is not None:
        out["grad_bias"] = b.grad
    if p.return_token_accuracy:
        hits = (z.detach().argmax(-1) == t).double() * valid
        out["token_accuracy"] = hits if p.reduction == "none" else hits.sum() / valid.sum()
    return out


@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"bias": True, "reduction": "sum", "label_smoothing": 0.1},
        {
            "reduction": "none",
            "softcap": 5.0,
            "z_loss_scale": 1e-3,
            "ignore_fraction": 0.3,
            "return_z_loss": True,
        },
        {"bias": True, "label_smoothing": 0.2, "z_loss_scale": 0.01, "ignore_fraction": 0.5},
        {"ce_weight": True, "ignore_fraction": 0.3},
        {"ce_weight": True, "bias": True, "label_smoothing": 0.2, "reduction": "sum"},
        {"ce_weight": True, "label_smoothing": 0.1, "z_loss_scale": 0.01, "reduction": "none"},
        {"ce_weight": True, "label_smoothing": 0.1, "softcap": 4.0, "ignore_fraction": 0.2},
        {"use_token_scaling": True, "label_smoothing": 0.1, "z_loss_scale": 0.01},
        {"use_token_scaling": True, "ce_weight": True, "reduction": "none", "softcap": 3.0},
        {"return_token_accuracy": True, "V": 5, "ignore_fraction": 0.3},
        {"return_token_accuracy": True, "V": 5, "reduction": "none", "ce_weight": True},
    ],
)
def test_flce_reference_matches_torch_autograd_float64(opts: dict) -> None:
    op = get_op("flce")
    p = op.parse_params({"N": 37, "H": 19, "V": 53, "dtype": "float32", **opts})
    inputs = op.make_inputs(p, "normal", 3, CPU)
    ref = op.reference(inputs, p)
    want = _autograd_flce(inputs, p)
    assert sorted(ref) == sorted(o.name for o in op.outputs(p)) and set(ref) <= set(want)
    if p.return_token_accuracy:  # the count has signal: some rows hit, some miss
        assert 0 < float(want["token_accuracy"].sum()) < float(want["token_accuracy"].numel())
    for name in ref:
        torch.testing.assert_close(ref[name], want[name], rtol=1e-10, atol=1e-12)


def test_flce_reference_chunks_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    import kassay.ops.flce.runtime as mod

    op = get_op("flce")
    p = op.parse_params({"N": 40, "H": 8, "V": 16, "dtype": "float32", "bias": True})
    inputs = op.make_inputs(p, "normal", 0, CPU)
    whole = op.reference(inputs, p)
    monkeypatch.setattr(mod, "REF_CHUNK_BYTES", 3 * 8 * 16 * 7)  # 7-row chunks
    chunked = op.reference(inputs, p)
    for k in whole:
        torch.testing.assert_close(whole[k], chunked[k], rtol=1e-12, atol=1e-14)


def test_flce_all_ignored_defines_zero_loss_and_gradients() -> None:
    op = get_op("flce")
    p = op.parse_params({"N": 8, "H": 4, "V": 10, "dtype": "float32"})
    ref = op.reference(op.make_inputs(p, "all_ignored", 0, CPU), p)
    assert float(ref["loss"]) == 0.0
    assert not ref["grad_input"].any() and not ref["grad_weight"].any()


def test_flce_large_logits_regime_reaches_1e3() -> None:
    op = get_op("flce")
    p = op.parse_params({"N": 64, "H": 64, "V": 256, "dtype": "float32"})
    inp = op.make_inputs(p, "large_logits", 0, CPU)
    z = inp["x"].double() @ inp["weight"].double().T
    assert 500 < float(z.abs().max()) < 3000


def test_inputs_are_deterministic_and_seed_dependent() -> None:
    op = get_op("flce")
    p = op.parse_params({"N": 8, "H": 4, "V": 10, "dtype": "bfloat16", "ignore_fraction": 0.5})
    a, b = op.make_inputs(p, "normal", 1, CPU), op.make_inputs(p, "normal", 1, CPU)
    c = op.make_inputs(p, "normal", 2, CPU)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["x"], c["x"])
    assert int((a["target"] == -100).sum()) == 4


@pytest.mark.parametrize("layout", ["hT", "Th"])
@pytest.mark.parametrize("regime", ["normal", "huge", "empty_rows", "fa2_inf"])
def test_lse_merge_reference_matches_logsumexp(layout: str, regime: str) -> None:
    op = get_op("lse_merge")
    p = op.parse_params(
        {"T": 32, "Hh": 3, "D": 4, "K": 3, "dtype": "float32", "lse_layout": layout}
    )
    inp = op.make_inputs(p, regime, 0, CPU)
    ref = op.reference(inp, p)
    lses = lse_to_th(inp["lses"], layout).double()
    lses = torch.where(torch.isposinf(lses), torch.full_like(lses, -torch.inf), lses)
    want_lse = torch.logsumexp(lses, dim=0)
    got_lse = lse_to_th(ref["lse"], layout)
    torch.testing.assert_close(got_lse, want_lse, rtol=1e-12, atol=0, equal_nan=False)
    w = torch.softmax(lses, dim=0).nan_to_num(0.0)  # all-empty rows: softmax NaN -> 0
    want_out = (w[..., None] * inp["outs"].double()).sum(0)
    torch.testing.assert_close(ref["out"], want_out, rtol=1e-10, atol=1e-12)
    if regime == "huge":
        assert float(lses.abs().max()) > 1000
    if regime in ("empty_rows", "fa2_inf"):
        assert torch.isneginf(want_lse).any()
        empty = torch.isneginf(got_lse)
        assert not ref["out"][empty].any()
    assert not torch.isnan(ref["out"]).any()


def test_lse_merge_second_half_keeps_first_half_of_state0() -> None:
    op = get_op("lse_merge")
    p = op.parse_params(
        {
            "T": 10,
            "Hh": 2,
            "D": 4,
            "K": 3,
            "dtype": "float32",
            "mode": "step_second_half",
            "lse_layout": "Th",
        }
    )
    inp = op.make_inputs(p, "fa2_inf", 0, CPU)
    ref = op.reference(inp, p)
    assert torch.equal(ref["out"][:5], inp["outs"][0, :5].double())
    assert torch.equal(ref["lse"][:5], inp["lses"][0, :5].double())
    full = op.reference(inp, op.parse_params({**p.model_dump(), "mode": "merge"}))
    torch.testing.assert_close(ref["out"][5:], full["out"][5:])  # second half: all K merged
    assert not torch.equal(ref["out"][:5], full["out"][:5])  # first half: state 0 only


def test_models_count_bytes_and_flops() -> None:
    op = get_op("lse_merge")
    p = op.parse_params({"T": 32768, "Hh": 32, "D": 128, "K": 2, "dtype": "bfloat16"})
    assert op.bytes_moved(p) == 3 * 32768 * 32 * 128 * 2 + 3 * 32768 * 32 * 4
    # the step modes count the harness's sequence: state 0 into the accumulator, K-1 updates
    e, r = 32768 * 32 * 128, 32768 * 32
    state = e * 2 + 4 * r
    step = op.parse_params({**p.model_dump(), "mode": "step"})  # accumulate float32
    init = 2 * state + e * 2 + 4 * e
    assert op.bytes_moved(step) == init + state + 8 * r + 8 * e + 2 * e
    k8 = op.parse_params({**step.model_dump(), "K": 8})
    assert op.bytes_moved(k8) == init + 7 * (state + 8 * r + 8 * e + 2 * e)
    in_out = op.parse_params({**step.model_dump(), "accumulate": "out"})
    assert op.bytes_moved(in_out) == 2 * state + state + 8 * r + 2 * 2 * e
    half = op.parse_params({**step.model_dump(), "mode": "step_second_half"})
    assert op.bytes_moved(half) == init + 0.5 * (state + 8 * r + 8 * e + 2 * e)
    # kassay's K=2 step on the H200 (0.903 ms, kassay run 2026-12-04): 3.3 TB/s, not 0.9
    assert 3.2e12 < op.bytes_moved(step) / 0.903e-3 < 3.4e12
    f = get_op("flce")
    q = f.parse_params({"N": 8192, "H": 4096, "V": 128256})
    assert f.flops(q) == 6 * 8192 * 4096 * 128256
    assert f.unavoidable_bytes(q) == (8192 * 4096 + 128256 * 4096) * 2 + 4


def test_an_op_without_a_precision_rounding_has_no_precision_reference_or_noise() -> None:
    """Op's defaults: the engine asks for a precision reference only where precision_rounding
    names one (lse_merge: never), so the base class refuses instead of inventing one; lse_merge's
    only noise is its conditioning (a float32 lse's magnitude), the reference itself unchanged."""
    op = get_op("lse_merge")
    p = op.parse_params({"T": 8, "Hh": 2, "D": 4, "K": 2, "dtype": "float32"})
    inputs = op.make_inputs(p, "normal", 0, CPU)
    assert op.precision_rounding(p) is None
    with pytest.raises(NotImplementedError, match="no precision reference"):
        op.precision_reference(inputs, p)
    ref, noise = op.reference_noise(inputs, p)
    assert set(noise) == {"cond:abs:out", "cond:rel:out"}
    # |lse| ~ 3-6 in the normal regime: a few float32 roundings of out
    assert 0 < noise["cond:rel:out"] < 2e-6 and 0 < noise["cond:abs:out"] < 1e-5
    want = op.reference(inputs, p)
    assert ref.keys() == want.keys() and all(torch.equal(ref[k], want[k]) for k in ref)
