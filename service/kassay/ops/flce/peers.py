"""Adapters for third-party flce kernels, written against their public APIs and registered only
when the package imports: `liger` (Liger-Kernel) and `cce` (Cut Cross-Entropy). Both are Triton
GPU kernels, so they declare CPU devices unsupported.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from kassay.ops.flce import FlceParams
from kassay.ops.flce import harness as flce_harness
from kassay.ops.registry import Impl, register

#: FlceParams options -> the keyword of liger_fused_linear_cross_entropy that carries them
_LIGER_OPTIONS = {
    "ce_weight": "ce_weight",
    "accum_dtype": "accum_dtype",
    "use_token_scaling": "use_token_scaling",
    "return_token_accuracy": "return_token_accuracy",
}


def _liger_keywords() -> set[str]:
    import inspect

    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    return set(inspect.signature(liger_fused_linear_cross_entropy).parameters)


def _liger_supports(p: FlceParams, device: torch.device) -> str | None:
    """CUDA only; an option this Liger release has no keyword for is declared unsupported
    (passed through otherwise: Liger's semantics are the op's for all four)."""
    if device.type != "cuda":
        return "Liger-Kernel runs only on CUDA devices"
    asked = [k for k in _LIGER_OPTIONS if getattr(p, k)]
    missing = [k for k in asked if _LIGER_OPTIONS[k] not in _liger_keywords()]
    if missing:
        return f"this Liger-Kernel release has no {', '.join(missing)}"
    return None


if importlib.util.find_spec("liger_kernel") is not None:

    def _liger(
        x: torch.Tensor,
        w: torch.Tensor,
        target: torch.Tensor,
        b: torch.Tensor | None,
        p: FlceParams,
        ce_weight: torch.Tensor | None = None,
    ) -> Any:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        extra: dict[str, Any] = {}
        if ce_weight is not None:
            extra["ce_weight"] = ce_weight
        if p.accum_dtype == "float32":
            extra["accum_dtype"] = torch.float32
        if p.use_token_scaling:
            extra["use_token_scaling"] = True
        if p.return_token_accuracy:
            extra["return_token_accuracy"] = True
        res = liger_fused_linear_cross_entropy(
            x,
            w,
            target,
            b,
            ignore_index=p.ignore_index,
            lse_square_scale=p.z_loss_scale,
            label_smoothing=p.label_smoothing,
            reduction=p.reduction,
            softcap=p.softcap,
            return_z_loss=p.return_z_loss,
            **extra,
        )
        if hasattr(res, "loss"):  # newer releases return a CrossEntropyOutput
            if p.return_token_accuracy:
                return res
            return (res.loss, res.z_loss) if p.return_z_loss else res.loss
        return res

    register(
        Impl(
            "flce",
            "liger",
            flce_harness.as_run(_liger),
            "Liger-Kernel LigerFusedLinearCrossEntropy",
            _liger_supports,
            "peer",
        )
    )


def _cce_supports(p: FlceParams, device: torch.device) -> str | None:
    if device.type != "cuda":
        return "Cut Cross-Entropy runs only on CUDA devices"
    if p.label_smoothing > 0 or p.z_loss_scale > 0 or p.return_z_loss:
        return "Cut Cross-Entropy has no label smoothing or z-loss"
    if p.ce_weight or p.use_token_scaling or p.return_token_accuracy or p.accum_dtype:
        return "Cut Cross-Entropy has no class weights, token scaling/accuracy or accum_dtype"
    if p.dtype not in ("bfloat16", "float16"):
        # cce_backward asserts 16-bit embeddings and does not follow autocast: float32
        # inputs fail in backward ("Backwards requires embeddings to be bf16 or fp16")
        return "Cut Cross-Entropy's backward needs bfloat16 or float16 inputs (no autocast)"
    if p.bias and not _cce_has_bias():
        return "this Cut Cross-Entropy release takes no bias"
    return None


def _cce_has_bias() -> bool:
    import inspect

    from cut_cross_entropy import linear_cross_entropy

    return "bias" in inspect.signature(linear_cross_entropy).parameters


if importlib.util.find_spec("cut_cross_entropy") is not None:

    def _cce(
        x: torch.Tensor,
        w: torch.Tensor,
        target: torch.Tensor,
        b: torch.Tensor | None,
        p: FlceParams,
    ) -> Any:
        from cut_cross_entropy import linear_cross_entropy

        # 25.1.1 has no bias parameter (supports() refuses biased cases there).
        extra = {"bias": b} if b is not None else {}
        return linear_cross_entropy(
            x,
            w,
            target,
            ignore_index=p.ignore_index,
            softcap=p.softcap,
            reduction=p.reduction,
            **extra,
        )

    register(
        Impl(
            "flce",
            "cce",
            flce_harness.as_run(_cce),
            "Apple's Cut Cross-Entropy",
            _cce_supports,
            "peer",
            # its backward accumulates with atomics: 42M grad elements differ between two runs
            # on the H200 (bf16); the spread is still checked against the tolerance
            nondeterministic=True,
        )
    )
