"""Adapters for third-party flce kernels, written against their public APIs and registered only
when the package imports: `liger` (Liger-Kernel) and `cce` (Cut Cross-Entropy). Both are Triton
GPU kernels, so they declare CPU devices unsupported.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from kassay.impls import flce_harness
from kassay.impls.registry import Impl, register
from kassay.ops.flce import FlceParams


def _cuda_only(name: str):
    def supports(p: FlceParams, device: torch.device) -> str | None:
        if device.type != "cuda":
            return f"{name} runs only on CUDA devices"
        return None

    return supports


if importlib.util.find_spec("liger_kernel") is not None:

    def _liger(
        x: torch.Tensor,
        w: torch.Tensor,
        target: torch.Tensor,
        b: torch.Tensor | None,
        p: FlceParams,
    ) -> Any:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

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
        )
        if hasattr(res, "loss"):  # newer releases return a CrossEntropyOutput
            return (res.loss, res.z_loss) if p.return_z_loss else res.loss
        return res

    register(
        Impl(
            "flce",
            "liger",
            flce_harness.as_run(_liger),
            "Liger-Kernel LigerFusedLinearCrossEntropy",
            _cuda_only("Liger-Kernel"),
            "peer",
        )
    )


if importlib.util.find_spec("cut_cross_entropy") is not None:

    def _cce_supports(p: FlceParams, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "Cut Cross-Entropy runs only on CUDA devices"
        if p.label_smoothing > 0 or p.z_loss_scale > 0 or p.return_z_loss:
            return "Cut Cross-Entropy has no label smoothing or z-loss"
        if p.bias and not _cce_has_bias():
            return "this Cut Cross-Entropy release takes no bias"
        return None

    def _cce_has_bias() -> bool:
        import inspect

        from cut_cross_entropy import linear_cross_entropy

        return "bias" in inspect.signature(linear_cross_entropy).parameters

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
