"""lse_merge mutants (known bugs 6-10)."""

from __future__ import annotations

from typing import Any

import torch

from kassay.ops.lse_merge import harness as lse_harness
from kassay.ops.lse_merge.baseline import _torch_step, merge_torch, update_te_style
from kassay.ops.lse_merge.runtime import lse_to_th as _th
from kassay.ops.registry import Impl, register


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


# ------------------------------------------------------------------------------------------
# Bugs a plain spec misses unless default coverage reaches their code path (selftest runs them
# under a spec with no regimes listed), and bugs only the verdict checks see.


def layout_from_shape(
    outs: torch.Tensor, lses: torch.Tensor, *, lse_layout: str, accumulate: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Infers the lse layout from its shape instead of taking it from the caller: [K, T, Hh]
    when the last dim is Hh, else [K, Hh, T]; with T == Hh it reads an "hT" lse as "Th"."""
    guessed = "Th" if lses.shape[-1] == outs.shape[2] else "hT"
    return merge_torch(outs, lses, lse_layout=guessed, accumulate=accumulate)


def states_capped(
    outs: torch.Tensor, lses: torch.Tensor, *, lse_layout: str, accumulate: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """A kernel that keeps at most 32 states in registers and silently ignores the rest."""
    return merge_torch(outs[:32], lses[:32], lse_layout=lse_layout, accumulate=accumulate)


def truncating_merge(
    outs: torch.Tensor, lses: torch.Tensor, *, lse_layout: str, accumulate: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rounds the float32 result to a 16-bit out dtype toward zero (a bit mask instead of
    round-to-nearest): each element within one ULP, but all of them pulled toward zero."""
    out, lse = merge_torch(outs, lses, lse_layout=lse_layout, accumulate="float32")
    if out.dtype == torch.float32:
        return out, lse
    exact = _merge_f32(outs, lses, lse_layout)
    toward0 = torch.where(
        (out.float().abs() > exact.abs()), torch.nextafter(out, torch.zeros_like(out)), out
    )
    return toward0, lse


def _merge_f32(outs: torch.Tensor, lses: torch.Tensor, lse_layout: str) -> torch.Tensor:
    out, _ = merge_torch(outs.float(), lses, lse_layout=lse_layout, accumulate="float32")
    return out


def unordered_merge(
    outs: torch.Tensor, lses: torch.Tensor, *, lse_layout: str, accumulate: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums the weighted states in whatever order they arrive (as atomics do): float32 addition
    is not associative, so two runs give different bits."""
    order = torch.randperm(outs.shape[0], device=outs.device)
    return merge_torch(outs[order], lses[order], lse_layout=lse_layout, accumulate=accumulate)


def merge_out_accum(
    outs: torch.Tensor, lses: torch.Tensor, *, lse_layout: str, accumulate: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """A K-way merge that sums the weighted states in the out dtype whatever `accumulate`
    asks: at float32 nothing shows; at 16 bits the error grows with K."""
    return merge_torch(outs, lses, lse_layout=lse_layout, accumulate="out")


def _stale_acc_step(
    v: lse_harness.StepView, out_step: torch.Tensor, lse_step: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Updates out and lse but never the float32 accumulator it reads from: each step merges
    into state 0 again (unseen in float32 while the harness aliased the two)."""
    res, new_lse = _torch_step(v, out_step, lse_step)
    v.acc = None
    return res, new_lse


stale_acc_update = lse_harness.step_update(_stale_acc_step)


def _stale_empty_step(
    v: lse_harness.StepView, out_step: torch.Tensor, lse_step: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch baseline before kassay's fix: rows empty in both states keep state 0's out
    (the reference says 0). As a baseline its errors would have widened everyone's limits."""
    res, new_lse = _torch_step(v, out_step, lse_step)
    empty = torch.isneginf(new_lse) | torch.isposinf(new_lse)
    return torch.where(empty[..., None], v.base, res), new_lse


def _garbage_empty_step(
    v: lse_harness.StepView, out_step: torch.Tensor, lse_step: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows empty in both states get out = 1 instead of 0: within twice the error of a baseline
    that keeps state 0 there."""
    res, new_lse = _torch_step(v, out_step, lse_step)
    empty = torch.isneginf(new_lse) | torch.isposinf(new_lse)
    return torch.where(empty[..., None], torch.ones_like(res), res), new_lse


_mutant(
    "m_layout_from_shape",
    layout_from_shape,
    None,
    "14: lse layout guessed from its shape (wrong when T == Hh)",
)
_mutant("m_states_capped", states_capped, None, "15: states beyond 32 ignored (K = 64)")
_mutant(
    "m_truncating_round",
    truncating_merge,
    None,
    "16: out rounded toward zero (each element within one ULP, all biased)",
)
_mutant("m_unordered_merge", unordered_merge, None, "17: states summed in arrival order")


def _stale_lse_step(
    v: lse_harness.StepView, out_step: torch.Tensor, lse_step: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Out corrected, the running lse left at state 0's: every later step weighs the
    accumulated out as if it held one state (the convergence pilot's stale lse)."""
    res, _ = _torch_step(v, out_step, lse_step)
    return res, v.lse.clone()


_mutant(
    "m_stale_lse",
    None,
    lse_harness.step_update(_stale_lse_step),
    "22: the running lse never updated (out is)",
)
_mutant(
    "m_stale_acc",
    None,
    stale_acc_update,
    "18: float32 accumulator never updated (out and lse are)",
)
_mutant(
    "m_merge_out_accum",
    merge_out_accum,
    None,
    "21: K-way merge accumulates in the out dtype when float32 is asked",
)
_mutant(
    "m_stale_empty_baseline",
    None,
    lse_harness.step_update(_stale_empty_step),
    "19: all-empty rows keep state 0's out (a wrong baseline)",
)
_mutant(
    "m_garbage_empty",
    None,
    lse_harness.step_update(_garbage_empty_step),
    "20: all-empty rows get out 1 (hidden by a wrong baseline)",
)
