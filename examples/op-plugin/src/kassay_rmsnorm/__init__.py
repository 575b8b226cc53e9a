"""rmsnorm: root-mean-square layer normalisation, forward and backward, as a kassay op.

    y = x * rsqrt(mean(x^2, over H) + eps) * weight

Inputs: x [N, H] and weight [H] in `dtype`, grad_y [N, H] in `dtype` (the seeded upstream
gradient). Outputs: y [N, H], grad_x [N, H] and grad_weight [H], all in `dtype`.

This module is the op's contract and imports no torch: the API admits, expands and prices jobs
with it. Beside it, the op's folder holds what a worker needs: `runtime` (seeded inputs, float64
reference), `impls` (the torch baseline and a Triton kernel), `mutants`, `coverage` and `probes`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kassay.ops.base import ITEMSIZE, Op, OpParams, OutputSpec


class RmsNormParams(OpParams):
    N: int = Field(gt=0, lt=2**31, description="rows (tokens)")
    H: int = Field(gt=0, le=65536, description="hidden size (normalised over)")
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    eps: float = Field(1e-6, gt=0, lt=1, description="added to the mean square")


class RmsNormOp(Op):
    name = "rmsnorm"
    params_model = RmsNormParams
    #: large: rows with |x| ~ 300, whose squares overflow float16 if summed there
    regimes = ("normal", "large")
    description = "RMSNorm forward and backward (a plugin op: examples/op-plugin)"
    # the op's modules, named after this package (renaming the package renames them)
    runtime_module = f"{__name__}.runtime"
    impl_modules = (f"{__name__}.impls",)
    corpus_modules = (f"{__name__}.mutants",)
    coverage_module = f"{__name__}.coverage"
    probes = f"{__name__}.probes"
    speed_unit = "gbps"  # a few FLOPs per byte: memory-bound

    def outputs(self, params: RmsNormParams) -> list[OutputSpec]:
        p = params
        return [
            OutputSpec("y", p.dtype, strict_dtype=True, reduction=p.H),
            OutputSpec("grad_x", p.dtype, strict_dtype=True, reduction=p.H),
            OutputSpec("grad_weight", p.dtype, strict_dtype=True, reduction=p.N),
        ]

    def flops(self, params: RmsNormParams) -> float:
        # forward ~4 per element (square, sum, two multiplies), backward ~8
        return float(12 * params.N * params.H)

    def bytes_moved(self, params: RmsNormParams) -> float:
        p = params
        # x, grad_y read, y and grad_x written (x read twice by an unfused pair is not counted)
        return float((4 * p.N * p.H + 2 * p.H) * ITEMSIZE[p.dtype])

    def unavoidable_bytes(self, params: RmsNormParams) -> int:
        p = params
        return (2 * p.N * p.H + p.H) * ITEMSIZE[p.dtype]

    def input_bytes(self, params: RmsNormParams) -> int:
        p = params
        return (2 * p.N * p.H + p.H) * ITEMSIZE[p.dtype]


OP = RmsNormOp()
