"""Shared by the CPU and GPU tests of kassay's fused linear cross-entropy kernel.

The torch formula of the op (eager baseline in the input dtype, and the float64 reference when
given float64 tensors), the three runs every grid case makes (float64 reference, torch eager,
kassay), and the baseline policy they are judged by: for each output,
rel-L2(kassay) <= factor * rel-L2(torch eager, same dtype) + floor.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

II = -100
OUTPUT_NAMES = ("loss", "z_loss", "grad_input", "grad_weight", "grad_bias")


def random_case(
    n: int,
    h: int,
    v: int,
    dtype: torch.dtype,
    bias: bool,
    ignore_frac: float,
    seed: int,
    *,
    wscale: float,
    gen_device: str,
    device: str,
    class_weights: bool = False,
) -> tuple:
    """(x [n, h], w [v, h] scaled by wscale/sqrt(h), t [n] with about ignore_frac of II, b [v]
    or None) in `dtype` on `device`, drawn from one generator on `gen_device`; with
    class_weights also cw [v] float32 in [0.5, 3) (mean 1.75: far from the row count), drawn
    after the rest so the other tensors do not depend on it."""
    g = torch.Generator(device=gen_device).manual_seed(seed)
    kw = {"device": gen_device, "generator": g}
    x = torch.randn(n, h, **kw).to(dtype).to(device)
    w = (torch.randn(v, h, **kw) * wscale / h**0.5).to(dtype).to(device)
    b = torch.randn(v, **kw).to(dtype).to(device) if bias else None
    t = torch.randint(0, v, (n,), **kw)
    t[torch.rand(n, **kw) < ignore_frac] = II
    t = t.to(device)
    if not class_weights:
        return x, w, t, b
    return x, w, t, b, (torch.rand(v, **kw) * 2.5 + 0.5).to(device)


def flce_kernel() -> Callable[..., object]:
    from kassay.kernels.flce import fused_linear_cross_entropy

    return fused_linear_cross_entropy


def loss_fn(x, w, t, b, ls, red, cap, zls):
    """Eager formula: logits in the input dtype, CE in float32 (float64 stays float64)."""
    z = F.linear(x, w, b)
    if z.dtype != torch.float64:
        z = z.float()
    if cap is not None:
        z = cap * torch.tanh(z / cap)
    ce = F.cross_entropy(z, t, ignore_index=II, label_smoothing=ls, reduction="none")
    valid = t != II
    zl = zls * torch.logsumexp(z, -1) ** 2 * valid
    tot = ce + zl
    if red == "mean":
        nv = valid.sum().clamp_min(1)
        return tot.sum() / nv, zl.sum() / nv
    if red == "sum":
        return tot.sum(), zl.sum()
    return tot, zl


def run_grads(fn, x, w, t, b, go):
    """(loss, z_loss, grad_input, grad_weight, grad_bias) of fn on fresh leaf copies."""
    xr = x.detach().clone().requires_grad_()
    wr = w.detach().clone().requires_grad_()
    br = None if b is None else b.detach().clone().requires_grad_()
    loss, zl = fn(xr, wr, t, br)
    loss.backward(go.to(loss.dtype))
    return loss.detach(), zl.detach(), xr.grad, wr.grad, None if b is None else br.grad


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    nb = b.norm()
    return float((a - b).norm() / nb) if nb > 0 else float(a.norm())


def assert_baseline_policy(ref, eag, got, x_dtype, factor: float, floor: float) -> None:
    """For each output of run_grads: kassay's dtype, shape, finiteness, exact zeros where the
    reference is zero, and rel-L2(kassay) <= factor * rel-L2(eager) + floor."""
    for name, r, e, k in zip(OUTPUT_NAMES, ref, eag, got, strict=True):
        if r is None:
            continue
        assert k.dtype == (torch.float32 if name in ("loss", "z_loss") else x_dtype), name
        assert k.shape == r.shape, name
        assert torch.isfinite(k).all(), name
        if float(r.abs().max()) == 0.0:
            assert float(k.abs().max()) == 0.0, f"{name}: expected exact zeros"
            continue
        ek, ee = rel_l2(k, r), rel_l2(e, r)
        assert ek <= factor * ee + floor, f"{name}: kassay {ek:.3e} vs eager {ee:.3e}"


def check_against_reference(
    x, w, t, b, go, *, ls, red, cap, zls, budget=None, factor=1.5, floor=0.0, config=None
) -> None:
    """Run reference, eager and kassay on the same inputs and assert the baseline policy."""
    d = torch.float64
    ref = run_grads(
        lambda xx, ww, tt, bb: loss_fn(xx, ww, tt, bb, ls, red, cap, zls),
        x.to(d), w.to(d), t, None if b is None else b.to(d), go.to(d),
    )  # fmt: skip
    eag = run_grads(
        lambda xx, ww, tt, bb: loss_fn(xx, ww, tt, bb, ls, red, cap, zls), x, w, t, b, go
    )
    got = run_grads(
        lambda xx, ww, tt, bb: flce_kernel()(
            xx, ww, tt, bb, label_smoothing=ls, reduction=red, softcap=cap, z_loss_scale=zls,
            return_z_loss=True, memory_budget_bytes=budget, config=config,
        ),
        x, w, t, b, go,
    )  # fmt: skip
    assert_baseline_policy(ref, eag, got, x.dtype, factor, floor)


# ---- the options Liger-Kernel names (issue 21): class weights, token scaling, token accuracy


def options_loss_fn(x, w, t, b, *, cw=None, ls=0.0, red="mean", cap=None, zls=0.0, ts=False):
    """Eager formula with torch's own weighted cross-entropy: F.cross_entropy(weight=cw,
    label_smoothing=ls) per row; z-loss unweighted; token scaling multiplies each row's loss
    (z-loss included) by its detached target probability; mean divides the CE part by the sum
    of the non-ignored targets' weights (0/0 = 0) and the z-loss part by the row count."""
    z = F.linear(x, w, b)
    if z.dtype != torch.float64:
        z = z.float()
    if cap is not None:
        z = cap * torch.tanh(z / cap)
    valid = t != II
    safe = torch.where(valid, t, 0)
    cwz = None if cw is None else cw.to(z.dtype)
    rows = F.cross_entropy(z, t, weight=cwz, ignore_index=II, label_smoothing=ls, reduction="none")
    lse = torch.logsumexp(z, -1)
    zl = zls * lse**2 * valid
    if ts:
        p_t = torch.exp(z.gather(1, safe[:, None])[:, 0] - lse).detach()
        rows, zl = rows * p_t, zl * p_t
    if red == "none":
        return rows + zl, zl
    if red == "sum":
        return rows.sum() + zl.sum(), zl.sum()
    den = valid.sum().to(z.dtype) if cwz is None else (cwz[safe] * valid).sum()
    nv = valid.sum().clamp_min(1)
    ce = rows.sum() / den if float(den) != 0 else rows.sum() * 0.0
    return ce + zl.sum() / nv, zl.sum() / nv


def argmax_hits(x, w, t, b, cap=None):
    """[N] float64 1.0 where the float64 logits' argmax (first maximal column) is the target."""
    z = F.linear(x.double(), w.double(), None if b is None else b.double())
    if cap is not None:
        z = cap * torch.tanh(z / cap)
    return ((z.argmax(-1) == t) & (t != II)).double()


def check_options(
    x, w, t, b, go, *, cw=None, ls=0.0, red="mean", cap=None, zls=0.0, ts=False, budget=None,
    factor=1.5, floor=0.0, accum_dtype=None, config=None,
):  # fmt: skip
    """Reference (float64), eager (input dtype) and kassay with the options; asserts the
    baseline policy on every output (loss, z_loss, grads) and returns kassay's output."""
    d = torch.float64
    cw64 = None if cw is None else cw.to(d)

    def fn(cwx):
        return lambda xx, ww, tt, bb: options_loss_fn(
            xx, ww, tt, bb, cw=cwx, ls=ls, red=red, cap=cap, zls=zls, ts=ts
        )

    ref = run_grads(fn(cw64), x.to(d), w.to(d), t, None if b is None else b.to(d), go.to(d))
    eag = run_grads(fn(cw), x, w, t, b, go)
    holder = {}

    def kassay(xx, ww, tt, bb):
        out = flce_kernel()(
            xx, ww, tt, bb, label_smoothing=ls, reduction=red, softcap=cap, z_loss_scale=zls,
            return_z_loss=True, memory_budget_bytes=budget, ce_weight=cw, use_token_scaling=ts,
            return_token_accuracy=True, accum_dtype=accum_dtype, config=config,
        )  # fmt: skip
        holder["out"] = out
        return out.loss, out.z_loss

    got = run_grads(kassay, x, w, t, b, go)
    assert_baseline_policy(ref, eag, got, x.dtype, factor, floor)
    return holder["out"]
