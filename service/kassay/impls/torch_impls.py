"""PyTorch impls: the baselines (`torch`), `torch_compile`, `torch_native` (F.linear_cross_entropy
where the installed torch has it), and re-implementations of two published lse-merge update
formulas (`te_style`: TransformerEngine's max/log1p in-place steps; `ring_style`:
ring-flash-attention's sigmoid/logsigmoid update), written here from their formulas.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from kassay.impls import flce_harness, lse_harness
from kassay.impls.registry import Impl, register
from kassay.ops.flce import FlceParams
from kassay.ops.lse_merge import LseMergeParams
from kassay.ops.runtime.lse_merge import lse_to_th as _th

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

# ------------------------------------------------------------------------------------ lse_merge


def _empty_to_neginf(lse: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isposinf(lse), torch.full_like(lse, -torch.inf), lse)


def merge_torch(
    outs: torch.Tensor, lses: torch.Tensor, *, lse_layout: str, accumulate: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """K-way merge with float32 weights. accumulate='out' sums the weighted states in the out
    dtype (one rounding per state), 'float32' in float32."""
    lse = _empty_to_neginf(_th(lses, lse_layout).float())  # [K, T, Hh]
    m = lse.max(dim=0).values
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp(lse - m_safe)
    s = w.sum(dim=0)
    lse_out = m_safe + torch.log(s)
    coef = torch.where(s > 0, w / s.clamp_min(torch.finfo(torch.float32).tiny), 0.0)
    acc_dtype = torch.float32 if accumulate == "float32" else outs.dtype
    out = torch.zeros(outs.shape[1:], dtype=acc_dtype, device=outs.device)
    for k in range(outs.shape[0]):
        out += (coef[k, ..., None] * outs[k].float()).to(acc_dtype)
    lse_res = lse_out.transpose(0, 1).contiguous() if lse_layout == "hT" else lse_out
    return out.to(outs.dtype), lse_res


def _torch_step(
    v: lse_harness.StepView, out_step: torch.Tensor, lse_step: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """In-place step in float32, guarding empty rows: a row empty in both states stays -inf
    with out 0 (what the op's reference gives a row empty in every state)."""
    l_old = _empty_to_neginf(v.lse.float())
    l_new = _empty_to_neginf(lse_step.float())
    m = torch.maximum(l_old, l_new)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w_old, w_new = torch.exp(l_old - m_safe), torch.exp(l_new - m_safe)
    s = w_old + w_new
    s_safe = torch.where(s > 0, s, torch.ones_like(s))
    res_lse = torch.where(s > 0, m_safe + torch.log(s_safe), l_old)
    res = (w_old / s_safe)[..., None] * v.base + (w_new / s_safe)[..., None] * out_step.float()
    return torch.where((s > 0)[..., None], res, torch.zeros_like(res)), res_lse


update_torch = lse_harness.step_update(_torch_step)


register(
    Impl(
        "lse_merge",
        "torch",
        lse_harness.as_run(merge_torch, update_torch),
        "eager PyTorch, float32 weights, empty rows guarded (the baseline)",
    )
)


def _te_step(
    v: lse_harness.StepView, out_step: torch.Tensor, l_new: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """TransformerEngine's fixed formula: new = max + log1p(exp(min - max)), applied in place;
    out scaled by exp(lse - new) in float32. Like the original, rows empty in both states give
    NaN (-inf - -inf) and +inf marks are not special-cased."""
    l_new = l_new.float()
    mx = torch.maximum(v.lse, l_new)
    mn = torch.minimum(v.lse, l_new)
    new_lse = mx + torch.log1p(torch.exp(mn - mx))
    c_old = torch.exp(v.lse - new_lse)[..., None]
    c_new = torch.exp(l_new - new_lse)[..., None]
    return c_old * v.base + c_new * out_step.float(), new_lse


update_te_style = lse_harness.step_update(_te_step)


def _steps_only(p: LseMergeParams, _d: torch.device) -> str | None:
    return "published as an in-place step update only" if p.mode == "merge" else None


register(
    Impl(
        "lse_merge",
        "te_style",
        lse_harness.as_run(None, update_te_style),
        "TransformerEngine-style torch ops (max + log1p, in place)",
        _steps_only,
        "peer",
    )
)


def _ring_step(
    v: lse_harness.StepView, out_step: torch.Tensor, l_new: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """ring-flash-attention's update: out -= sigmoid(l_new - l) * (out - out_new);
    lse -= logsigmoid(l - l_new). Float32 math; empty rows are not special-cased."""
    l_new = l_new.float()
    res = v.base - torch.sigmoid(l_new - v.lse)[..., None] * (v.base - out_step.float())
    return res, v.lse - F.logsigmoid(v.lse - l_new)


update_ring_style = lse_harness.step_update(_ring_step)


register(
    Impl(
        "lse_merge",
        "ring_style",
        lse_harness.as_run(None, update_ring_style),
        "ring-flash-attention-style torch ops (sigmoid / logsigmoid)",
        _steps_only,
        "peer",
    )
)
