"""lse_merge — softmax log-sum-exp correction (attention-state merge).

K partial attention states (out_i [T, Hh, D] in `dtype`, lse_i float32 natural-log, laid out
[Hh, T] ("hT") or [T, Hh] ("Th")) merge into
    lse = log(sum_i exp(lse_i)),   out = sum_i exp(lse_i - lse) * out_i.
Empty rows: a state whose lse is -inf (or +inf, FlashAttention-2's mark of an empty row)
contributes nothing; a row empty in every state has out 0 and lse -inf.

Modes: `merge` (one K-way out-of-place merge), `step` (K-1 in-place updates of an accumulator
initialised with state 0, as ring attention does), `step_second_half` (state 0 covers the whole
sequence; states 1..K-1 cover only its second half, positions T//2.., and the updates touch only
that half). `accumulate`: float32 (a float32 accumulator across steps) or `out` (accumulate in the
output dtype, rounding after every step).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator

from kassay.ops.base import DTYPES, Op, OpParams, OutputSpec, Tensors, generator


class LseMergeParams(OpParams):
    T: int = Field(gt=0, description="sequence length (query positions)")
    Hh: int = Field(gt=0, description="attention heads")
    D: int = Field(gt=0, description="head dimension")
    K: int = Field(2, ge=2, le=64, description="number of partial states")
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    lse_layout: Literal["hT", "Th"] = "hT"
    mode: Literal["merge", "step", "step_second_half"] = "merge"
    accumulate: Literal["float32", "out"] = "float32"

    @model_validator(mode="after")
    def _check(self) -> LseMergeParams:
        if self.mode == "step_second_half" and self.T < 2:
            raise ValueError("mode='step_second_half' needs T >= 2")
        return self

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


REGIMES = ("normal", "huge", "empty_rows", "fa2_inf")


def lse_to_th(lse: torch.Tensor, layout: str) -> torch.Tensor:
    """View lse [..., Hh, T] ("hT") or [..., T, Hh] ("Th") as [..., T, Hh]."""
    return lse.transpose(-1, -2) if layout == "hT" else lse


def th_to_layout(lse_th: torch.Tensor, layout: str) -> torch.Tensor:
    return lse_th.transpose(-1, -2).contiguous() if layout == "hT" else lse_th.contiguous()


def merge_float64(outs: torch.Tensor, lses_th: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 K-way merge with the max/log-sum form. outs [K, T, Hh, D], lses_th [K, T, Hh]
    (natural log; +inf and -inf both mean an empty state). Returns out [T, Hh, D] float64 and
    lse [T, Hh] float64 (-inf where every state is empty)."""
    lse = lses_th.double()
    lse = torch.where(torch.isposinf(lse), torch.full_like(lse, -torch.inf), lse)
    m = lse.max(dim=0).values
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp(lse - m_safe)  # exp(-inf) = 0: empty states weigh nothing
    s = w.sum(dim=0)
    lse_out = m_safe + torch.log(s)  # s = 0 -> -inf
    coef = torch.where(s > 0, w / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(w))
    out = (coef[..., None] * outs.double()).sum(dim=0)
    return out, lse_out


class LseMergeOp(Op):
    name = "lse_merge"
    params_model = LseMergeParams
    regimes = REGIMES
    description = "softmax log-sum-exp correction: merge partial attention states"

    def outputs(self, params: LseMergeParams) -> list[OutputSpec]:
        return [
            OutputSpec("out", params.torch_dtype, strict_dtype=True, reduction=params.K),
            OutputSpec("lse", torch.float32, strict_dtype=True, reduction=params.K),
        ]

    def make_inputs(
        self, params: LseMergeParams, regime: str, seed: int, device: torch.device
    ) -> Tensors:
        """outs [K, T, Hh, D] in params.dtype; lses float32 [K, Hh, T] ("hT") or [K, T, Hh]."""
        self.check_regime(regime)
        p = params
        outs = torch.randn(p.K, p.T, p.Hh, p.D, generator=generator(seed, device, 1), device=device)
        lse = torch.randn(p.K, p.T, p.Hh, generator=generator(seed, device, 2), device=device)
        if regime == "huge":
            # A shared per-row magnitude up to 1e4 (either sign) plus a spread of a few units,
            # so states stay comparable: exp of any unshifted lse overflows even in float64.
            mag = torch.rand(p.T, p.Hh, generator=generator(seed, device, 3), device=device)
            sign = (
                torch.randint(
                    0, 2, (p.T, p.Hh), generator=generator(seed, device, 4), device=device
                )
                * 2
                - 1
            )
            lse = lse * 3.0 + (sign * (1e3 + 9e3 * mag))[None]
        else:
            lse = lse * 2.0 + 3.0
        if regime in ("empty_rows", "fa2_inf"):
            mark = torch.inf if regime == "fa2_inf" else -torch.inf
            u = torch.rand(p.T, p.Hh, generator=generator(seed, device, 5), device=device)
            which = torch.randint(
                0, p.K, (p.T, p.Hh), generator=generator(seed, device, 6), device=device
            )
            one_empty = u < 0.2  # ~20% of rows: one state empty
            all_empty = u > 0.9  # ~10% of rows: every state empty
            k_idx = torch.arange(p.K, device=device)[:, None, None]
            empty = (one_empty[None] & (k_idx == which[None])) | all_empty[None]
            lse = torch.where(empty, torch.full_like(lse, mark), lse)
        lse = lse.float()
        lses = lse.transpose(-1, -2).contiguous() if p.lse_layout == "hT" else lse.contiguous()
        return {"outs": outs.to(p.torch_dtype), "lses": lses}

    def reference(self, inputs: Tensors, params: LseMergeParams) -> Tensors:
        p = params
        outs, lses_th = inputs["outs"], lse_to_th(inputs["lses"], p.lse_layout)
        if p.mode == "step_second_half":
            # The first half is never touched by the updates: it stays state 0 exactly as given
            # (an empty row there keeps its stored out and its -inf/+inf mark).
            h = p.T // 2
            out = outs[0].double().clone()
            lse = lses_th[0].double().clone()
            o2, l2 = merge_float64(outs[:, h:], lses_th[:, h:])
            out[h:] = o2
            lse[h:] = l2
        else:
            out, lse = merge_float64(outs, lses_th)
        return {"out": out, "lse": th_to_layout(lse, p.lse_layout)}

    def _state_bytes(self, params: LseMergeParams) -> int:
        p = params
        return p.T * p.Hh * (p.D * p.torch_dtype.itemsize + 4)

    def flops(self, params: LseMergeParams) -> float:
        # Per element of out: K multiply-adds; per row: K exps, a log, a max. Memory-bound.
        p = params
        return float(2 * p.K * p.T * p.Hh * p.D)

    def bytes_moved(self, params: LseMergeParams) -> float:
        # (K + 1) * T * Hh * (D * out bytes + 4): K states read, one written (TARGETS.md's model).
        return float((params.K + 1) * self._state_bytes(params))

    def unavoidable_bytes(self, params: LseMergeParams) -> int:
        p = params
        if p.mode == "merge":
            return self._state_bytes(p)
        # In place: the accumulator the harness hands in, plus a float32 out accumulator.
        acc = p.T * p.Hh * p.D * 4 if p.accumulate == "float32" else 0
        return self._state_bytes(p) + acc

    def input_bytes(self, params: LseMergeParams) -> int:
        return params.K * self._state_bytes(params)

    def reference_bytes(self, params: LseMergeParams) -> int:
        p = params
        return 3 * p.K * p.T * p.Hh * (p.D + 1) * 8


OP = LseMergeOp()
