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

This is the op's torch-free contract; its inputs and float64 reference live in
`kassay.ops.lse_merge.runtime`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from kassay.ops.base import ITEMSIZE, Op, OpParams, OutputSpec, Tensors
from kassay.ops.base import torch_dtype as _torch_dtype

if TYPE_CHECKING:
    import torch


class LseMergeParams(OpParams):
    T: int = Field(gt=0, lt=2**63, description="sequence length (query positions)")
    Hh: int = Field(gt=0, lt=2**63, description="attention heads")
    D: int = Field(gt=0, lt=2**63, description="head dimension")
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
        """The dtype of the states' out as a torch dtype (imports torch)."""
        return _torch_dtype(self.dtype)


REGIMES = ("normal", "huge", "empty_rows", "fa2_inf")


class LseMergeOp(Op):
    name = "lse_merge"
    params_model = LseMergeParams
    regimes = REGIMES
    description = "softmax log-sum-exp correction: merge partial attention states"
    runtime_module = "kassay.ops.lse_merge.runtime"
    impl_modules = ("kassay.ops.lse_merge.baseline", "kassay.ops.lse_merge.kassay_impl")
    corpus_modules = ("kassay.ops.lse_merge.mutants", "kassay.ops.lse_merge.alternatives")
    coverage_module = "kassay.ops.lse_merge.coverage"
    probes = "kassay.ops.lse_merge.probes"
    harness_module = "kassay.ops.lse_merge.harness"
    harness_doc = (
        "merge(outs, lses, *, lse_layout, accumulate) -> (out, lse), or the in-place step "
        "update(out, lse, out_step, lse_step, *, lse_layout, second_half, acc)"
    )
    convergence_module = "kassay.ops.lse_merge.convergence"
    speed_unit = "gbps"  # ~1 FLOP per byte: memory-bound

    CONVERGENCE_OPTIONS = frozenset({"dtype", "mode", "accumulate"})

    def convergence_params(self, shape: dict[str, int], params: dict[str, Any]) -> dict[str, Any]:
        """Each layer's merge: T = batch x seq query rows, Hh = heads, D = dim / heads, K =
        chunks, lse laid out [Hh, T]; `mode: step` merges the chunks as ring attention does
        (state 0, then K - 1 in-place updates)."""
        other = sorted(set(params) - self.CONVERGENCE_OPTIONS)
        if other:
            raise ValueError(
                "a convergence suite of lse_merge sets only dtype, mode and accumulate (the "
                f"model sets the shape); not {', '.join(other)}"
            )
        if params.get("mode") == "step_second_half":
            raise ValueError("mode step_second_half has no place in the convergence model")
        return {
            "T": shape["batch"] * shape["seq"],
            "Hh": shape["heads"],
            "D": shape["dim"] // shape["heads"],
            "K": shape["chunks"],
            "dtype": "float32",
            "lse_layout": "hT",
            **params,
        }

    def outputs(self, params: LseMergeParams) -> list[OutputSpec]:
        return [
            OutputSpec("out", params.dtype, strict_dtype=True, reduction=params.K),
            OutputSpec("lse", "float32", strict_dtype=True, reduction=params.K),
        ]

    def _state_bytes(self, params: LseMergeParams) -> int:
        p = params
        return p.T * p.Hh * (p.D * ITEMSIZE[p.dtype] + 4)

    def flops(self, params: LseMergeParams) -> float:
        # Per element of out: K multiply-adds; per row: K exps, a log, a max. Memory-bound.
        p = params
        return float(2 * p.K * p.T * p.Hh * p.D)

    def bytes_moved(self, params: LseMergeParams) -> float:
        """Bytes the timed call cannot avoid moving. merge: (K + 1) * T * Hh * (D * out bytes +
        4), K states read and one written (TARGETS.md's model). The step modes time the
        harness's whole sequence (kassay.ops.lse_merge.harness): state 0 copied into the
        accumulator (out and lse, and a float32 copy of out when accumulate is float32), then
        K - 1 in-place updates, each reading its state and the accumulator and writing the
        accumulator back (float32 and out, or out alone), over the rows it covers (half of them
        for step_second_half). Counting only the merge's states understated the step modes'
        traffic ~3.7x at K=2 (kassay's step read as 0.22 of the copy roofline)."""
        p = params
        state = self._state_bytes(p)
        if p.mode == "merge":
            return float((p.K + 1) * state)
        elems, rows, b = p.T * p.Hh * p.D, p.T * p.Hh, ITEMSIZE[p.dtype]
        acc = p.accumulate == "float32"
        init = 2 * state + (elems * b + 4 * elems if acc else 0)
        frac = (p.T - p.T // 2) / p.T if p.mode == "step_second_half" else 1.0
        # the step's state, the lse accumulator read and written, and out (+ float32) r/w
        step = state + 8 * rows + (8 * elems + elems * b if acc else 2 * elems * b)
        return float(init + (p.K - 1) * frac * step)

    def unavoidable_bytes(self, params: LseMergeParams) -> int:
        p = params
        if p.mode == "merge":
            return self._state_bytes(p)
        # In place: the accumulator the harness hands in, plus a float32 out accumulator.
        acc = p.T * p.Hh * p.D * 4 if p.accumulate == "float32" else 0
        return self._state_bytes(p) + acc

    def input_bytes(self, params: LseMergeParams) -> int:
        return params.K * self._state_bytes(params)

    def reference_noise(
        self, inputs: Tensors, params: LseMergeParams
    ) -> tuple[Tensors, dict[str, float]]:
        runtime = importlib.import_module(self.runtime_module)
        ref: Tensors = runtime.reference(inputs, params)
        return ref, runtime.conditioning(inputs, params, ref)

    def reference_bytes(self, params: LseMergeParams) -> int:
        p = params
        return 3 * p.K * p.T * p.Hh * (p.D + 1) * 8


OP = LseMergeOp()
