"""The op contract: what every op module provides to the API, the engine and the reports.

An op is a mathematical contract, independent of any implementation: a params model, named input
regimes, the outputs an impl returns, a FLOP/byte model for throughput and a model of the bytes
an implementation cannot avoid allocating (its outputs and gradients).

This module and the op modules beside it import no torch: the API admits and prices jobs with
them. What needs torch — the seeded input generator and the float64 reference — is the op's
*runtime* (`kassay.ops.<op>.runtime`), imported only when `make_inputs` or `reference` is called,
i.e. on a worker.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    import torch

#: Op.reference_noise's key prefix for the noise of an output's fitted scale (the bias check's
#: s in out = (1 + s) ref), as opposed to the noise of its elements (plain output name)
SCALE_NOISE = "scale:"
#: ... and for what a sound design may lose to the op's conditioning at the inputs, per output:
#: CONDITIONING + "abs:" + name its largest element error, CONDITIONING + "rel:" + name its
#: rel_l2 (flce: a row's lse rounded to float32 scales its softmax by 1 + d, |d| ~ u |lse|)
CONDITIONING = "cond:"

#: Bytes per element of every dtype an op's tensors come in (the cost models use it).
ITEMSIZE: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a dtype name ("float32", "bfloat16", ...): imports torch."""
    from kassay.ops.runtime import DTYPES

    return DTYPES[name]


class OpParams(BaseModel):
    """Base of every op's params model: strict (an int is an int: not "16", 16.0 or true),
    finite floats, no unknown fields, hashable dump."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    def label(self) -> str:
        """Short, stable text naming this point of the grid (JUnit names, tables)."""
        return ",".join(f"{k}={v}" for k, v in self.model_dump().items())


@dataclass(frozen=True)
class OutputSpec:
    """One output of an op.

    dtype_name: the dtype an impl is expected to return it in ("float32", "bfloat16", ...; used
    for ULP distances and for the rounding floor of the tolerance). strict_dtype: a different
    dtype is itself a failure (e.g. gradients must come back in the parameters' dtype under
    autocast). reduction: the length of the longest sum behind one element (the K of a GEMM):
    the tolerance's float32 accumulation floor grows with it. precision_name: the least precise
    dtype the computation rounds to (the autocast dtype of an AMP case whose outputs are
    float32); None: the output's dtype. It sets the floor against which the baseline's own error
    is judged.
    """

    name: str
    dtype_name: str
    strict_dtype: bool = False
    reduction: int = 1
    precision_name: str | None = None

    @property
    def dtype(self) -> torch.dtype:
        """The expected dtype as a torch dtype (imports torch: runtime side only)."""
        return torch_dtype(self.dtype_name)

    @property
    def precision(self) -> torch.dtype | None:
        """precision_name as a torch dtype (imports torch), None when not set."""
        return torch_dtype(self.precision_name) if self.precision_name else None


Tensors = dict[str, "torch.Tensor"]


def _name(fn: Any) -> str:
    return f"function {getattr(fn, '__qualname__', None) or fn!r}"


class Op(ABC):
    """Base class of an op. Subclasses are stateless singletons registered in `kassay.ops`."""

    name: ClassVar[str]
    params_model: ClassVar[type[OpParams]]
    regimes: ClassVar[tuple[str, ...]]
    description: ClassVar[str] = ""
    #: module holding `make_inputs(params, regime, seed, device)` and `reference(inputs, params)`
    runtime_module: ClassVar[str]
    #: modules whose import registers the op's impls (kassay.impls.load): its baseline, its own
    #: and its peers' kernels (a module that fails to import, e.g. without Triton, is skipped)
    impl_modules: ClassVar[tuple[str, ...]] = ()
    #: ... and the self-test's corpora: mutants and correct alternatives (kassay.impls.load with
    #: mutants=True)
    corpus_modules: ClassVar[tuple[str, ...]] = ()
    #: module whose `points(points, regimes, all_regimes)` yields the op's default coverage
    #: (kassay.ops.coverage); None: none (torch-free: the API expands grids)
    coverage_module: ClassVar[str | None] = None
    #: module with the self-test's PROBES, PLAIN_PROBES and FAIRNESS (kassay.ops.probes)
    probes: ClassVar[str | None] = None
    #: module holding the op's place in the convergence model (kassay.validate.convergence):
    #: SLOT ("head" | "merge"), wrap(impl, params, calls) and, optionally, CONTROL (the correct
    #: alternative impl trained as the control arm); None: no convergence suite for this op
    convergence_module: ClassVar[str | None] = None
    #: module whose `from_callable(fn) -> (run, supports | None)` turns a function written in
    #: the op's calling convention (its harness) into an impl's run (kassay.testing); None:
    #: a function must be the registry's own `run(inputs, params) -> outputs`
    harness_module: ClassVar[str | None] = None
    #: the calling convention in one line, for errors (kassay.testing)
    harness_doc: ClassVar[str] = "run(inputs, params) -> {output name: tensor}"
    #: the unit its speed is shown in by default: "tflops" (compute-bound) or "gbps"
    #: (memory-bound); the plots offer the others too
    speed_unit: ClassVar[str] = "tflops"

    def parse_params(self, raw: dict[str, Any]) -> OpParams:
        return self.params_model.model_validate(raw)

    def coverage(
        self, points: list[dict[str, Any]], regimes: list[str]
    ) -> list[tuple[dict[str, Any], str, str]]:
        """The (params, regime, note) points default coverage adds to a suite whose grid is
        `points` (validated params dumps) run in `regimes`; may repeat a user point (the
        caller drops those)."""
        if self.coverage_module is None or not points:
            return []
        gen = importlib.import_module(self.coverage_module).points
        return list(gen(points, regimes, tuple(self.regimes)))

    def convergence_params(self, shape: dict[str, int], params: dict[str, Any]) -> dict[str, Any]:
        """The params the convergence model (kassay.validate.convergence.model.Shape, as a
        dict) calls this op with, from a suite's `params` (its options: the model sets the
        shape fields). ValueError saying why for an op without a convergence slot or options
        the model cannot train with. Torch-free: the API expands suites with it."""
        raise ValueError(f"op {self.name!r} has no place in the convergence model")

    def from_callable(self, fn: Any) -> tuple[Any, Any]:
        """(run, supports or None) of a user's function in this op's calling convention;
        TypeError saying what does not fit (kassay.testing)."""
        if self.harness_module is not None:
            return importlib.import_module(self.harness_module).from_callable(fn)
        from kassay.ops.callables import signature_misfit

        misfit = signature_misfit(fn, ("inputs", "params"))
        if misfit:
            raise TypeError(
                f"{_name(fn)} does not fit op {self.name!r}: {misfit}; expected {self.harness_doc}"
            )
        return fn, None

    def probes_module(self) -> ModuleType | None:
        """The self-test's probes of this op (kassay.ops.probes), None where it has none."""
        return importlib.import_module(self.probes) if self.probes else None

    @abstractmethod
    def outputs(self, params: Any) -> list[OutputSpec]:
        """The outputs an impl must return for these params, in report order."""

    def make_inputs(self, params: Any, regime: str, seed: int, device: torch.device) -> Tensors:
        """Seeded inputs: the same (params, regime, seed) give bit-identical tensors on every
        machine of the same device type (the op's runtime; imports torch)."""
        self.check_regime(regime)
        inputs: Tensors = importlib.import_module(self.runtime_module).make_inputs(
            params, regime, seed, device
        )
        return inputs

    def reference(self, inputs: Tensors, params: Any) -> Tensors:
        """The float64 truth for every output, computed on the inputs' device in bounded memory
        (the op's runtime; imports torch)."""
        out: Tensors = importlib.import_module(self.runtime_module).reference(inputs, params)
        return out

    def reference_noise(self, inputs: Tensors, params: Any) -> tuple[Tensors, dict[str, float]]:
        """The float64 reference and, per output, its rounding noise: the standard deviation
        (in the output's units) a correct impl's result carries from an intermediate every impl
        rounds, each in its own way (flce: the 16-bit logits, for the scalar loss). The engine
        widens that output's floor by it: two correct impls' errors there are partly
        independent draws, and one draw of the baseline's is no limit. Under SCALE_NOISE + an
        output's name: the standard deviation of that output's fitted scale s from rounding
        shared along a structure of the output (flce, reduction none: each row's grad_output
        rounded once for the row's whole gradient), which widens the bias check's limit.
        Under CONDITIONING + "abs:"/"rel:" + an output's name: the max_abs and rel_l2 a sound
        design of the params' precision may lose to the op's conditioning at these inputs (a
        float32 lse rounded once, then used in exp(z - lse)), which joins that output's floor.
        Default: no noise."""
        return self.reference(inputs, params), {}

    def precision_rounding(self, params: Any) -> str | None:
        """In words, the rounding every correct impl at these params' precision does that the
        exact reference does not and that can cost it far more than the rounding floor (flce in
        a 16-bit compute dtype: "logits rounded to float16"); None (the default): none. The
        engine then explains a baseline that looks suspect with `precision_reference`."""
        return None

    def precision_reference(self, inputs: Tensors, params: Any) -> Tensors:
        """The float64 reference with the rounding `precision_rounding` names done: the result
        a correct impl of this precision computes (imports torch; as costly as `reference`).
        Only for params whose `precision_rounding` is not None."""
        raise NotImplementedError(f"op {self.name!r} has no precision reference")

    @abstractmethod
    def flops(self, params: Any) -> float:
        """Nominal floating-point operations of one call (the convention used for TFLOP/s)."""

    @abstractmethod
    def bytes_moved(self, params: Any) -> float:
        """Fewest bytes one call must move through device memory (inputs read once, outputs
        written once): the convention used for GB/s."""

    @abstractmethod
    def unavoidable_bytes(self, params: Any) -> int:
        """Bytes an impl must hold beyond its inputs (outputs, gradients): the memory model."""

    @abstractmethod
    def input_bytes(self, params: Any) -> int:
        """Bytes of the generated inputs (for the API's device-memory estimate)."""

    def reference_bytes(self, params: Any) -> int:
        """Peak bytes the float64 reference holds (outputs in float64 plus its working chunk)."""
        return 2 * self.input_bytes(params) * 4

    def precision_reference_bytes(self, params: Any) -> int:
        """Bytes the precision reference's outputs hold while a group keeps them (an explained
        baseline; see `precision_rounding`): 0 (the default) where these params have none.
        Computing it peaks like `reference` (its working set is gone before an impl runs)."""
        return 0

    def estimate_device_bytes(self, params: Any) -> int:
        """Upper estimate of device memory needed to run one input group of these params:
        inputs, the float64 reference, the precision reference's outputs (kept for the group
        when its baseline's error is explained by them) and an impl at ~4x the unavoidable
        bytes. Counted whatever the regime: the estimate is per params, and a baseline may be
        explained in any regime."""
        return (
            self.input_bytes(params)
            + self.reference_bytes(params)
            + self.precision_reference_bytes(params)
            + 4 * self.unavoidable_bytes(params)
        )

    def default_regime_ok(self, params: Any, regime: str) -> bool:
        """Whether a suite that lists no regimes (and default coverage) runs `regime` at these
        params; a regime listed explicitly always runs."""
        return True

    def case_dtype(self, params: Any) -> str:
        """The dtype that names a case in tables (the params' `dtype` field by default)."""
        return str(getattr(params, "dtype", "float32"))

    def check_regime(self, regime: str) -> None:
        if regime not in self.regimes:
            from kassay.errors import InvalidSpecError

            raise InvalidSpecError(
                f"op {self.name!r} has no regime {regime!r}; known regimes: "
                + ", ".join(self.regimes),
                details={"field": "regimes", "allowed": list(self.regimes)},
            )
