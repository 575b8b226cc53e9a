"""lse_merge mutants (known bugs 6-10)."""

from __future__ import annotations

from typing import Any

import torch

from kassay.impls import lse_harness
from kassay.impls.registry import Impl, register
from kassay.impls.torch_impls import _torch_step, merge_torch, update_te_style
from kassay.ops.lse_merge import lse_to_th as _th


def _mutant(
    name: str, merge: Any, update: Any, bug: str, exposes: tuple[str, ...] = ("normal",)
) -> None:
    register(
        Impl(
            "lse_merge",
            name,
            lse_harness.as_run(merge, update),
            bug,
            lse_harness.supports_modes(merge is not None, update is not None),
            kind="mutant",
            bug=bug,
            exposes=exposes,
        )
    )


def naive_merge(
    outs: torch.Tensor, lses: torch.Tensor, *, lse_layout: str, accumulate: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """TransformerEngine before the fix: lse = log(sum exp(lse_i)) with no max shift; exp
    overflows for |lse| > 88 in float32 (709 in float64)."""
    lse = _th(lses, lse_layout).float()
    total = torch.log(torch.exp(lse).sum(dim=0))
    w = torch.exp(lse - total)
    out = (w[..., None] * outs.float()).sum(dim=0).to(outs.dtype)
    return out, (total.transpose(0, 1).contiguous() if lse_layout == "hT" else total)


def _copy_step(
    v: lse_harness.StepView, out_step: torch.Tensor, lse_step: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The correction written to a copy (the TransformerEngine review caught this): the step's
    result goes to a clone, the caller's accumulator is written back unchanged."""
    scratch = lse_harness.StepView(
        v.out.clone(), v.lse.clone(), out_step, lse_layout="Th", second_half=False, acc=None
    )
    _torch_step(scratch, out_step, lse_step)
    return v.base, v.lse.clone()


copy_update = lse_harness.step_update(_copy_step)


def _out_dtype_step(
    v: lse_harness.StepView, out_step: torch.Tensor, lse_step: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ignores the float32 accumulator and accumulates out in its own dtype (bf16) across the
    K steps: one bf16 rounding per step."""
    v.acc = None
    v.base = v.out.float()
    return _torch_step(v, out_step, lse_step)


out_dtype_accum = lse_harness.step_update(_out_dtype_step)


def zeros_merge(
    outs: torch.Tensor, lses: torch.Tensor, *, lse_layout: str, accumulate: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """A kernel that never writes out (zeros), with a correct lse."""
    out, lse = merge_torch(outs, lses, lse_layout=lse_layout, accumulate=accumulate)
    return torch.zeros_like(out), lse


_mutant("m_naive_logaddexp", naive_merge, None, "6: log(exp(a)+exp(b)) overflows", ("huge",))
_mutant(
    "m_empty_nan",
    None,
    update_te_style,  # the published formula itself has no guard for rows empty in both states
    "7: both states empty (-inf) -> NaN (TransformerEngine's max + log1p form, unguarded)",
    ("empty_rows",),
)
_mutant("m_copy_update", None, copy_update, "8: correction written to a copy, accumulator stale")
_mutant("m_out_dtype_accum", None, out_dtype_accum, "9: outputs accumulated in bf16 over K steps")
_mutant("m_zeros", zeros_merge, None, "10: out all zeros / never written")
