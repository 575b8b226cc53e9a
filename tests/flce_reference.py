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


def check_against_reference(
    x, w, t, b, go, *, ls, red, cap, zls, budget=None, factor=1.5, floor=0.0
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
            return_z_loss=True, memory_budget_bytes=budget,
        ),
        x, w, t, b, go,
    )  # fmt: skip
    for name, r, e, k in zip(OUTPUT_NAMES, ref, eag, got, strict=True):
        if r is None:
            continue
        assert k.dtype == (torch.float32 if name in ("loss", "z_loss") else x.dtype), name
        assert k.shape == r.shape, name
        assert torch.isfinite(k).all(), name
        if float(r.abs().max()) == 0.0:
            assert float(k.abs().max()) == 0.0, f"{name}: expected exact zeros"
            continue
        ek, ee = rel_l2(k, r), rel_l2(e, r)
        assert ek <= factor * ee + floor, f"{name}: kassay {ek:.3e} vs eager {ee:.3e}"
