"""kassay's Triton fused linear cross-entropy (kassay.kernels.flce) as the `kassay` impl."""

from __future__ import annotations

import os
from typing import Any

import torch

from kassay.kernels import fused_linear_cross_entropy
from kassay.ops.flce import FlceParams
from kassay.ops.flce import harness as flce_harness
from kassay.ops.registry import Impl, register


def _loss(
    x: torch.Tensor,
    w: torch.Tensor,
    target: torch.Tensor,
    b: torch.Tensor | None,
    p: FlceParams,
    ce_weight: torch.Tensor | None = None,
) -> Any:
    return fused_linear_cross_entropy(
        x,
        w,
        target,
        b,
        ignore_index=p.ignore_index,
        label_smoothing=p.label_smoothing,
        reduction=p.reduction,
        softcap=p.softcap,
        z_loss_scale=p.z_loss_scale,
        return_z_loss=p.return_z_loss,
        ce_weight=ce_weight,
        accum_dtype=torch.float32 if p.accum_dtype == "float32" else None,
        use_token_scaling=p.use_token_scaling,
        return_token_accuracy=p.return_token_accuracy,
        memory_budget_bytes=p.memory_budget_bytes,
    )


def _supports(p: FlceParams, device: torch.device) -> str | None:
    low = p.dtype == "bfloat16" or p.autocast == "bfloat16"
    if low and os.environ.get("TRITON_INTERPRET") == "1":
        return "the Triton interpreter computes tl.dot on bfloat16 wrongly: bf16 runs on GPUs"
    return None


register(
    Impl(
        "flce",
        "kassay",
        flce_harness.as_run(_loss),
        "kassay's Triton fused linear cross-entropy (row chunks with gradients in forward, or "
        "vocabulary panels recomputed in backward at low memory budgets)",
        _supports,
    )
)
