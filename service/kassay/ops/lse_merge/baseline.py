"""PyTorch lse_merge impls: the baseline (`torch`) and re-implementations of two published
update formulas (`te_style`: TransformerEngine's max/log1p in-place steps; `ring_style`:
ring-flash-attention's sigmoid/logsigmoid update), written here from their formulas.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kassay.ops.lse_merge import LseMergeParams
from kassay.ops.lse_merge import harness as lse_harness
from kassay.ops.lse_merge.runtime import lse_to_th as _th
from kassay.ops.registry import Impl, register


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
