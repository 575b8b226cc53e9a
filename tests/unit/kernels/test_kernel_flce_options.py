"""CPU tests (Triton interpreter, float32/float16) of kassay flce's Liger-parity options:
ce_weight, use_token_scaling, return_token_accuracy, accum_dtype.

Each is checked against torch's own weighted cross-entropy in float64 (the truth) under the
baseline policy (rel-L2(kassay) <= factor * rel-L2(eager, same dtype) + floor); the bfloat16
and AMP runs are in tests/gpu/test_kernel_flce_gpu.py.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from flce_reference import II, argmax_hits, check_options, flce_kernel, random_case, rel_l2

from kassay.kernels import FlceOutput, FusedLinearCrossEntropyLoss

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
    reason="needs TRITON_INTERPRET=1 (set by tests/conftest.py on hosts without a GPU)",
)

DEV = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


def _inputs(n, h, v, dtype, bias, ignore_frac, seed=0):
    return random_case(
        n, h, v, dtype, bias, ignore_frac, seed,
        wscale=2, gen_device="cpu", device=DEV, class_weights=True,
    )  # fmt: skip


def _go(n, red, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) if red == "none" else torch.tensor(1.0)).to(DEV)


# (bias, label_smoothing, ignore_fraction, softcap, z_loss_scale, budget rows or None)
CASES = [
    (False, 0.0, 0.0, None, 0.0, None),
    (True, 0.1, 0.3, None, 0.0, None),
    (False, 0.2, 0.3, 4.0, 1e-3, 5),  # several chunks
    (True, 0.0, 0.5, None, 1e-2, 7),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("red", ["mean", "sum", "none"])
@pytest.mark.parametrize("bias,ls,ign,cap,zls,rows", CASES)
def test_ce_weight(dtype, red, bias, ls, ign, cap, zls, rows):
    n, v = 24, 123
    x, w, t, b, cw = _inputs(n, 16, v, dtype, bias, ign)
    budget = None if rows is None else rows * v * x.element_size()
    check_options(
        x, w, t, b, _go(n, red), cw=cw, ls=ls, red=red, cap=cap, zls=zls, budget=budget,
        floor=4 * torch.finfo(dtype).eps,
    )  # fmt: skip


@pytest.mark.parametrize("red", ["mean", "sum", "none"])
@pytest.mark.parametrize("ls", [0.0, 0.15])
def test_ce_weight_is_torchs_own_weighted_cross_entropy(red, ls):
    # against F.cross_entropy(weight=..., label_smoothing=...) itself, mean included
    x, w, t, b, cw = _inputs(20, 16, 97, torch.float32, True, 0.25, seed=3)
    go = _go(20, red).double()
    x64, w64, b64 = (a.double().requires_grad_() for a in (x, w, b))
    ref = F.cross_entropy(
        F.linear(x64, w64, b64), t, weight=cw.double(), ignore_index=II, label_smoothing=ls,
        reduction=red,
    )  # fmt: skip
    ref.backward(go)
    xk, wk, bk = (a.clone().requires_grad_() for a in (x, w, b))
    loss = flce_kernel()(xk, wk, t, bk, ce_weight=cw, label_smoothing=ls, reduction=red)
    loss.backward(go.float())
    for got, want in ((loss, ref), (xk.grad, x64.grad), (wk.grad, w64.grad), (bk.grad, b64.grad)):
        assert rel_l2(got.detach(), want.detach()) < 2e-6


def test_ce_weight_mean_divides_by_target_weights_not_rows():
    # a correct impl passes, a mutant that divides by the row count is 1/mean(c[t]) off
    x, w, t, _b, cw = _inputs(16, 8, 50, torch.float32, False, 0.0)
    got = float(flce_kernel()(x, w, t, ce_weight=cw))
    z = F.linear(x.double(), w.double())
    rows = F.cross_entropy(z, t, weight=cw.double(), reduction="none")
    assert got == pytest.approx(float(rows.sum() / cw.double()[t].sum()), rel=1e-5)
    assert got != pytest.approx(float(rows.sum() / 16), rel=1e-2)


def test_ce_weight_all_ignored_or_zero_weight_gives_zero_not_nan():
    x, w, t, b, cw = _inputs(12, 8, 40, torch.float32, True, 0.0)
    for tt, c in ((torch.full_like(t, II), cw), (t, torch.zeros_like(cw))):
        xr, wr, br = (a.clone().requires_grad_() for a in (x, w, b))
        loss = flce_kernel()(xr, wr, tt, br, ce_weight=c, label_smoothing=0.1)
        loss.backward()
        assert float(loss) == 0.0
        for g in (xr.grad, wr.grad, br.grad):
            assert torch.isfinite(g).all() and float(g.abs().max()) == 0.0


def test_ce_weight_takes_no_gradient_and_is_checked():
    x, w, t, _b, cw = _inputs(8, 8, 30, torch.float32, False, 0.0)
    cwr = cw.clone().requires_grad_()
    xr = x.clone().requires_grad_()
    flce_kernel()(xr, w, t, ce_weight=cwr).backward()
    assert xr.grad is not None and cwr.grad is None
    with pytest.raises(ValueError, match="ce_weight must be a \\[V=30\\]"):
        flce_kernel()(x, w, t, ce_weight=cw[:-1])
    with pytest.raises(ValueError, match="floating-point"):
        flce_kernel()(x, w, t, ce_weight=torch.ones(30, dtype=torch.int64, device=DEV))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("red", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_token_scaling(dtype, red, weighted):
    n, v = 24, 77
    x, w, t, b, cw = _inputs(n, 16, v, dtype, True, 0.25, seed=5)
    check_options(
        x, w, t, b, _go(n, red), cw=cw if weighted else None, ls=0.1, red=red, cap=6.0,
        zls=1e-3, ts=True, budget=6 * v * x.element_size(), floor=4 * torch.finfo(dtype).eps,
    )  # fmt: skip


def test_token_scaling_changes_the_loss_by_the_target_probability():
    # the option is live: off and on differ by exactly p_t per row (reduction none)
    x, w, t, _b, _ = _inputs(10, 8, 20, torch.float32, False, 0.0, seed=2)
    plain = flce_kernel()(x, w, t, reduction="none")
    scaled = flce_kernel()(x, w, t, reduction="none", use_token_scaling=True)
    p_t = torch.softmax(F.linear(x, w), -1).gather(1, t[:, None])[:, 0]
    torch.testing.assert_close(scaled, plain * p_t, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("red", ["mean", "sum", "none"])
@pytest.mark.parametrize("cap", [None, 3.0])
def test_token_accuracy(dtype, red, cap):
    # V small enough that random logits hit their target often: a count with signal
    n, v = 40, 5
    x, w, t, b, _ = _inputs(n, 16, v, dtype, True, 0.3, seed=7)
    out = flce_kernel()(x, w, t, b, softcap=cap, reduction=red, return_token_accuracy=True)
    assert isinstance(out, FlceOutput) and out.z_loss is None
    assert out.token_accuracy.dtype == torch.float32
    assert not out.token_accuracy.requires_grad
    hits = argmax_hits(x, w, t, b, cap)
    valid = (t != II).sum()
    want = hits if red == "none" else hits.sum() / valid
    assert 0 < float(hits.sum()) < float(valid)
    tol = 0.0 if dtype == torch.float32 else 1.0 / float(valid)  # a near-tie may flip in fp16
    assert float((out.token_accuracy.double() - want).abs().max()) <= tol + 1e-7
    # the loss is the call's without the flag
    torch.testing.assert_close(out.loss, flce_kernel()(x, w, t, b, softcap=cap, reduction=red))


def test_token_accuracy_ties_go_to_the_first_column_across_blocks():
    # columns 3, 70 and 200 have identical (largest) logits; under the interpreter's 64-wide
    # blocks they lie in different blocks and lanes: argmax is column 3, as torch.argmax
    h, v = 8, 260
    g = torch.Generator().manual_seed(0)
    w = torch.randn(v, h, generator=g) * 0.1
    x = torch.randn(6, h, generator=g)
    big = torch.ones(h)
    for c in (3, 70, 200):
        w[c] = big
    x = x.abs() + 1.0  # every row's largest logit is the tied one
    t = torch.tensor([3, 70, 200, 3, II, 5])
    out = flce_kernel()(
        x.to(DEV), w.to(DEV), t.to(DEV), reduction="none", return_token_accuracy=True
    )
    assert out.token_accuracy.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]


def test_token_accuracy_all_ignored_is_zero():
    x, w, t, _b, _ = _inputs(8, 8, 6, torch.float32, False, 0.0)
    out = flce_kernel()(x, w, torch.full_like(t, II), return_token_accuracy=True)
    assert float(out.token_accuracy) == 0.0 and float(out.loss) == 0.0


def test_token_accuracy_with_z_loss_returns_all_three():
    x, w, t, _b, _ = _inputs(8, 8, 6, torch.float32, False, 0.0)
    out = flce_kernel()(x, w, t, z_loss_scale=1e-2, return_z_loss=True, return_token_accuracy=True)
    loss, zl, acc = out  # a tuple, Liger's field names
    assert zl is out.z_loss and float(zl) > 0 and acc is out.token_accuracy
    ref_loss, ref_zl = flce_kernel()(x, w, t, z_loss_scale=1e-2, return_z_loss=True)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(zl, ref_zl)


@pytest.mark.parametrize("red", ["mean", "none"])
def test_accum_dtype_float32(red):
    # float16 weights over several chunks: accumulated in float32 by default already, so the
    # option must give the same gradients; and it is checked against the truth
    n, v = 30, 61
    x, w, t, b, cw = _inputs(n, 16, v, torch.float16, True, 0.2, seed=9)
    go = _go(n, red)
    budget = 4 * v * 2
    out = check_options(
        x, w, t, b, go, cw=cw, ls=0.1, red=red, budget=budget, accum_dtype=torch.float32,
        floor=4 * torch.finfo(torch.float16).eps,
    )  # fmt: skip
    assert out.loss.dtype == torch.float32
    grads = []
    for acc in (None, torch.float32):
        wr = w.clone().requires_grad_()
        flce_kernel()(
            x, wr, t, reduction=red, memory_budget_bytes=budget, accum_dtype=acc
        ).backward(go)
        grads.append(wr.grad)
    assert torch.equal(grads[0], grads[1])


def test_accum_dtype_other_than_float32_is_refused():
    x, w, t, _b, _ = _inputs(4, 8, 10, torch.float32, False, 0.0)
    for bad in (torch.bfloat16, torch.float16, "float32"):
        with pytest.raises(ValueError, match="accum_dtype"):
            flce_kernel()(x, w, t, accum_dtype=bad)


def test_module_keeps_options_and_moves_ce_weight_as_a_buffer():
    x, w, t, b, cw = _inputs(12, 8, 30, torch.float32, True, 0.2)
    mod = FusedLinearCrossEntropyLoss(
        ce_weight=cw, label_smoothing=0.1, use_token_scaling=True, return_token_accuracy=True
    )
    assert "ce_weight" in dict(mod.named_buffers())
    out = mod(x, w, t, b)
    want = flce_kernel()(
        x, w, t, b, ce_weight=cw, label_smoothing=0.1, use_token_scaling=True,
        return_token_accuracy=True,
    )  # fmt: skip
    torch.testing.assert_close(out.loss, want.loss)
    torch.testing.assert_close(out.token_accuracy, want.token_accuracy)
    assert "use_token_scaling=True" in repr(mod)
