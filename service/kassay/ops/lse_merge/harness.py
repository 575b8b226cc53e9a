"""The calling convention every lse_merge impl shares.

An lse_merge impl provides up to two functions, typed by the protocols below:
`LseMerge` (the K-way out-of-place merge) and `LseUpdate` (one in-place step). `as_run` drives
them for the op's three modes. For the step modes the accumulator is created here from state 0
(with a float32 accumulator of its own storage, even when out is float32) and the result is read
back from it: whatever the update returns is ignored, so an update that writes to a copy, or
forgets one of the two accumulators, leaves a stale one and is caught. `step_update` builds an
LseUpdate from the math of one step alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from kassay.ops.lse_merge import LseMergeParams
from kassay.ops.lse_merge.runtime import lse_to_th

Tensors = dict[str, torch.Tensor]


class LseMerge(Protocol):
    """K-way merge. outs [K, T, Hh, D] (out dtype), lses [K, Hh, T] ("hT") or [K, T, Hh] ("Th")
    float32, natural log; accumulate "float32" or "out". Returns out [T, Hh, D] (out dtype) and
    lse (float32, the input layout)."""

    def __call__(
        self, outs: torch.Tensor, lses: torch.Tensor, *, lse_layout: str, accumulate: str
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class LseUpdate(Protocol):
    """One in-place step. out [T, Hh, D] and lse (layout) are the caller's accumulator;
    out_step / lse_step hold one new state (T or, with second_half, T - T//2 positions); acc is
    None or a float32 [T, Hh, D] accumulator that must be updated too (then out = acc rounded).
    The return value is ignored."""

    def __call__(
        self,
        out: torch.Tensor,
        lse: torch.Tensor,
        out_step: torch.Tensor,
        lse_step: torch.Tensor,
        *,
        lse_layout: str,
        second_half: bool,
        acc: torch.Tensor | None,
    ) -> object: ...


# deprecated aliases (before the protocols)
MergeFn = LseMerge
UpdateFn = LseUpdate


def lse_seq_slice(lse: torch.Tensor, layout: str, start: int) -> torch.Tensor:
    """View of lse positions start.. along the sequence dim, for either layout."""
    return lse[..., start:] if layout == "hT" else lse[..., start:, :]


def as_run(
    merge: LseMerge | None = None, update: LseUpdate | None = None
) -> Callable[[Tensors, Any], Tensors]:
    def run(inputs: Tensors, params: LseMergeParams) -> Tensors:
        outs, lses, p = inputs["outs"], inputs["lses"], params
        if p.mode == "merge":
            if merge is None:
                raise RuntimeError("this impl has no K-way merge")
            out, lse = merge(outs, lses, lse_layout=p.lse_layout, accumulate=p.accumulate)
            return {"out": out, "lse": lse}
        if update is None:
            raise RuntimeError("this impl has no in-place update")
        acc_out = outs[0].clone()
        acc_lse = lses[0].clone()
        # its own storage: `out.float()` would alias a float32 out, and an update that forgets
        # one of the two accumulators would go unnoticed
        acc = (
            torch.empty_like(acc_out, dtype=torch.float32).copy_(acc_out)
            if p.accumulate == "float32"
            else None
        )
        half = p.mode == "step_second_half"
        h = p.T // 2 if half else 0
        for i in range(1, p.K):
            update(
                acc_out,
                acc_lse,
                outs[i, h:],
                lse_seq_slice(lses[i], p.lse_layout, h),
                lse_layout=p.lse_layout,
                second_half=half,
                acc=acc,
            )
        return {"out": acc_out, "lse": acc_lse}

    return run


def supports_modes(merge: bool, update: bool) -> Callable[[Any, torch.device], str | None]:
    def supports(params: LseMergeParams, _device: torch.device) -> str | None:
        if params.mode == "merge" and not merge:
            return "no K-way merge (in-place step updates only)"
        if params.mode != "merge" and not update:
            return "no in-place update (K-way merge only)"
        return None

    return supports


class StepView:
    """The rows one in-place step updates, as views of the caller's tensors.

    out [rows, Hh, D] and lse [rows, Hh] (viewed token-major whatever the layout) alias the
    accumulator, so `write` updates it in place; base is the float32 value to update (the
    float32 accumulator when one is given, else out upcast)."""

    def __init__(
        self,
        out: torch.Tensor,
        lse: torch.Tensor,
        out_step: torch.Tensor,
        *,
        lse_layout: str,
        second_half: bool,
        acc: torch.Tensor | None,
    ) -> None:
        h = out.shape[0] - out_step.shape[0] if second_half else 0
        self.out = out[h:]
        self.lse = lse_to_th(lse, lse_layout)[h:]
        self.acc = acc[h:] if acc is not None else None
        self.base = self.acc if self.acc is not None else self.out.float()

    def write(self, res: torch.Tensor, new_lse: torch.Tensor) -> None:
        if self.acc is not None:
            self.acc.copy_(res)
        self.out.copy_(res)
        self.lse.copy_(new_lse)


StepMath = Callable[[StepView, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def step_update(step: StepMath) -> LseUpdate:
    """An LseUpdate from the math of one step: step(view, out_step, lse_step_th) returns the
    new out (float32, [rows, Hh, D]) and lse ([rows, Hh]) of the rows the step covers, given
    their StepView and the new state (out_step in its dtype, lse_step viewed token-major); the
    result is written into the caller's accumulator in place."""

    def update(
        out: torch.Tensor,
        lse: torch.Tensor,
        out_step: torch.Tensor,
        lse_step: torch.Tensor,
        *,
        lse_layout: str,
        second_half: bool,
        acc: torch.Tensor | None,
    ) -> None:
        v = StepView(out, lse, out_step, lse_layout=lse_layout, second_half=second_half, acc=acc)
        res, new_lse = step(v, out_step, lse_to_th(lse_step, lse_layout))
        v.write(res, new_lse)

    update.__doc__ = step.__doc__
    return update


__all__ = [
    "LseMerge",
    "LseUpdate",
    "MergeFn",
    "StepMath",
    "StepView",
    "Tensors",
    "UpdateFn",
    "as_run",
    "from_callable",
    "lse_seq_slice",
    "step_update",
    "supports_modes",
]


def from_callable(
    fn: Callable[..., Any],
) -> tuple[Callable[[Tensors, Any], Tensors], Callable[[Any, torch.device], str | None]]:
    """A user's function as an impl's run (kassay.testing): a K-way merge (LseMerge) or an
    in-place step (LseUpdate), told apart by what it takes; TypeError saying what does not fit
    when it is neither."""
    from kassay.ops.callables import signature_misfit

    as_merge = signature_misfit(fn, ("outs", "lses"), ("lse_layout", "accumulate"))
    if as_merge is None:
        return as_run(merge=fn), supports_modes(merge=True, update=False)
    as_update = signature_misfit(
        fn, ("out", "lse", "out_step", "lse_step"), ("lse_layout", "second_half", "acc")
    )
    if as_update is None:
        return as_run(update=fn), supports_modes(merge=False, update=True)
    name = getattr(fn, "__qualname__", fn)
    raise TypeError(
        f"{name!r} does not fit op 'lse_merge': as a K-way merge "
        f"merge(outs, lses, *, lse_layout, accumulate): {as_merge}; as an in-place step "
        f"update(out, lse, out_step, lse_step, *, lse_layout, second_half, acc): {as_update}"
    )
