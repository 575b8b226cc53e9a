"""PyTorch flce impls: the baseline (`torch`), `torch_compile` and `torch_native`
(F.linear_cross_entropy where the installed torch has it)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from kassay.ops.flce import FlceParams
from kassay.ops.flce import harness as flce_harness
from kassay.ops.registry import Impl, register

# ----------------------------------------------------------------------------------------- flce


def flce_eager(
    x: torch.Tensor,
    w: torch.Tensor,
    target: torch.Tensor,
    b: torch.Tensor | None,
    p: FlceParams,
    ce_weight: torch.Tensor | None = None,
) -> Any:
    """Eager PyTorch: F.linear in the case dtype, then CE on float32 logits (the usual recipe).

    Class weights go to F.cross_entropy(weight=...) itself; token scaling multiplies its
    per-row losses by the detached target probability; grad_weight comes from one GEMM
    (float32 accumulation), so accum_dtype="float32" is what it always does."""
    z = F.linear(x, w, b).float()
    if p.softcap is not None:
        z = p.softcap * torch.tanh(z / p.softcap)
    valid = target != p.ignore_index
    cw = ce_weight.float() if ce_weight is not None else None
    if p.use_token_scaling:
        loss, zl = _eager_token_scaled(z, target, valid, cw, p)
    else:
        # mean as sum / non-ignored rows (or their classes' weights) with 0/0 = 0 (the op's
        # contract): F.cross_entropy's own mean gives NaN when every target is ignored
        loss = F.cross_entropy(
            z,
            target,
            weight=cw,
            ignore_index=p.ignore_index,
            label_smoothing=p.label_smoothing,
            reduction="sum" if p.reduction == "mean" else p.reduction,
        )
        if p.reduction == "mean":
            loss = _safe_div(loss, _mean_divisor(target, valid, cw))
        zl = None
        if p.z_loss_scale != 0 or p.return_z_loss:
            zl = flce_harness.z_loss_term(torch.logsumexp(z, dim=-1), valid, p)
            loss = loss + zl
    acc = flce_harness.token_accuracy(z, target, valid, p) if p.return_token_accuracy else None
    if acc is not None:
        return loss, zl, acc
    return loss if zl is None else (loss, zl)


def _mean_divisor(
    target: torch.Tensor, valid: torch.Tensor, cw: torch.Tensor | None
) -> torch.Tensor:
    if cw is None:
        return valid.sum().float()
    return (cw[torch.where(valid, target, 0)] * valid).sum()


def _safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den, 0 where den is 0 (no NaN in the gradient either)."""
    nz = den != 0
    return num / torch.where(nz, den, torch.ones_like(den)) * nz


def _eager_token_scaled(
    z: torch.Tensor,
    target: torch.Tensor,
    valid: torch.Tensor,
    cw: torch.Tensor | None,
    p: FlceParams,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Liger's token scaling in eager ops: per-row CE and z-loss times the detached target
    probability, then reduced (mean: CE over rows or the targets' weights, z-loss over rows)."""
    rows = F.cross_entropy(
        z,
        target,
        weight=cw,
        ignore_index=p.ignore_index,
        label_smoothing=p.label_smoothing,
        reduction="none",
    )
    lse = torch.logsumexp(z, dim=-1)
    tp = torch.exp(z.gather(1, torch.where(valid, target, 0)[:, None])[:, 0] - lse).detach()
    zrows = p.z_loss_scale * lse**2 * valid * tp
    rows = rows * tp
    if p.reduction == "none":
        return rows + zrows, zrows
    if p.reduction == "sum":
        return rows.sum() + zrows.sum(), zrows.sum()
    zl = _safe_div(zrows.sum(), valid.sum().float())
    return _safe_div(rows.sum(), _mean_divisor(target, valid, cw)) + zl, zl


register(
    Impl(
        "flce",
        "torch",
        flce_harness.as_run(flce_eager),
        "eager PyTorch: F.linear + F.cross_entropy on float32 logits (the baseline)",
        # seen on the H200 (bf16, large logits): two runs on the same inputs differed in 8408
        # grad_input elements by up to 1.5e-5 (cuBLAS's and the CE backward's reductions are not
        # bit-reproducible on every path); its run-to-run spread is still checked
        nondeterministic=True,
    )
)

_compiled: dict[Any, Any] = {}


def _flce_compiled(
    x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, b: torch.Tensor | None, p: FlceParams
) -> Any:
    fn = _compiled.get(p)
    if fn is None:
        fn = _compiled[p] = torch.compile(flce_eager, dynamic=False)
    return fn(x, w, target, b, p)


register(
    Impl(
        "flce",
        "torch_compile",
        flce_harness.as_run(_flce_compiled),
        "torch.compile of the eager baseline (inductor)",
    )
)


def _native_supports(p: FlceParams, _device: torch.device) -> str | None:
    if not hasattr(F, "linear_cross_entropy"):
        return f"torch {torch.__version__} has no F.linear_cross_entropy (added in 2.13)"
    if p.softcap is not None or p.z_loss_scale > 0 or p.return_z_loss:
        return "F.linear_cross_entropy has no softcap or z-loss"
    if p.use_token_scaling or p.return_token_accuracy:
        return "F.linear_cross_entropy has no token scaling or token accuracy"
    return None


def _flce_native(
    x: torch.Tensor,
    w: torch.Tensor,
    target: torch.Tensor,
    b: torch.Tensor | None,
    p: FlceParams,
    ce_weight: torch.Tensor | None = None,
) -> Any:
    # accum_dtype float32: its "accurate" policy keeps the chunked intermediates in acc_dtype
    acc: dict[str, Any] = (
        {"acc_policy": "accurate", "acc_dtype": torch.float32} if p.accum_dtype else {}
    )
    return F.linear_cross_entropy(  # type: ignore[attr-defined]
        x,
        w,
        target,
        linear_bias=b,
        weight=ce_weight,  # float32 (it takes float32 class weights with 16-bit inputs too)
        reduction=p.reduction,
        ignore_index=p.ignore_index,
        label_smoothing=p.label_smoothing,
        options=torch.nn.LinearCrossEntropyOptions(**acc),  # type: ignore[attr-defined]
    )


register(
    Impl(
        "flce",
        "torch_native",
        flce_harness.as_run(_flce_native),
        "torch's own F.linear_cross_entropy, chunked path",
        _native_supports,
        "peer",
    )
)
