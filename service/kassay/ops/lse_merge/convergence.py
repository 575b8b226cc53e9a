"""lse_merge's place in the convergence model (kassay.validate.convergence): merging the
attention states of the context-parallel chunks, in every layer.

An lse_merge impl has no backward: it is trained through an autograd Function whose forward is
the impl's merge and whose backward is the merge's exact derivative taken at the impl's own
result, each state weighted by exp(lse_i - lse) with the lse the impl returned:
    d out_i = w_i * g,   d lse_i = w_i * sum_D(g * (out_i - out)).
A merge whose lse is wrong (never updated, overflowed) trains with wrong weights even where its
out is right; one whose out is wrong feeds it forward.
"""

from __future__ import annotations

from typing import Any

import torch

from kassay.ops.lse_merge import LseMergeParams
from kassay.ops.registry import Impl

SLOT = "merge"
#: the correct alternative trained as the control arm (the benign band between correct kernels)
CONTROL = "alt_pairwise"


def wrap(impl: Impl, params: LseMergeParams, calls: list[int]) -> Any:
    """(outs [K, T, Hh, D] float32, lses [K, Hh, T] float32) -> out [T, Hh, D] float32,
    differentiable through the merge's derivative at the impl's result; calls[0] counts."""
    dt = params.torch_dtype

    class _Merge(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, outs: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            calls[0] += 1
            inputs = {"outs": outs.detach().to(dt).contiguous(), "lses": lses.detach().contiguous()}
            res = impl.run(inputs, params)
            out, lse = res["out"].float(), res["lse"].float()
            ctx.save_for_backward(outs.detach(), lses.detach(), out, lse)
            return out

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> Any:  # type: ignore[override]
            outs, lses, out, lse = ctx.saved_tensors
            finite = torch.isfinite(lse)[None] & torch.isfinite(lses)
            w = torch.where(finite, torch.exp(lses - torch.where(finite, lse[None], lses)), 0.0)
            w = w.transpose(1, 2)  # [K, T, Hh]
            g_outs = w[..., None] * g[None]
            g_lses = (w * (g[None] * (outs - out[None])).sum(-1)).transpose(1, 2)
            return g_outs, g_lses

    return _Merge.apply
