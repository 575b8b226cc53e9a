"""The op contract: what every op module provides to the engine.

An op is a mathematical contract, independent of any implementation: a params model, a seeded
input generator with named regimes, a float64 reference, a FLOP/byte model for throughput and a
model of the bytes an implementation cannot avoid allocating (its outputs and gradients).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


class OpParams(BaseModel):
    """Base of every op's params model: strict, no unknown fields, hashable dump."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def label(self) -> str:
        """Short, stable text naming this point of the grid (JUnit names, tables)."""
        return ",".join(f"{k}={v}" for k, v in self.model_dump().items())


@dataclass(frozen=True)
class OutputSpec:
    """One output of an op.

    dtype: the dtype an impl is expected to return it in (used for ULP distances and for the
    rounding floor of the tolerance). strict_dtype: a different dtype is itself a failure (e.g.
    gradients must come back in the parameters' dtype under autocast). reduction: the length of
    the longest sum behind one element (the K of a GEMM): the tolerance's float32 accumulation
    floor grows with it. precision: the least precise dtype the computation rounds to (the
    autocast dtype of an AMP case whose outputs are float32); None: `dtype`. It sets the floor
    against which the baseline's own error is judged.
    """

    name: str
    dtype: torch.dtype
    strict_dtype: bool = False
    reduction: int = 1
    precision: torch.dtype | None = None


Tensors = dict[str, torch.Tensor]


class Op(ABC):
    """Base class of an op. Subclasses are stateless singletons registered in `kassay.ops`."""

    name: ClassVar[str]
    params_model: ClassVar[type[OpParams]]
    regimes: ClassVar[tuple[str, ...]]
    description: ClassVar[str] = ""

    def parse_params(self, raw: dict[str, Any]) -> OpParams:
        return self.params_model.model_validate(raw)

    @abstractmethod
    def outputs(self, params: Any) -> list[OutputSpec]:
        """The outputs an impl must return for these params, in report order."""

    @abstractmethod
    def make_inputs(self, params: Any, regime: str, seed: int, device: torch.device) -> Tensors:
        """Seeded inputs: the same (params, regime, seed) give bit-identical tensors on every
        machine of the same device type."""

    @abstractmethod
    def reference(self, inputs: Tensors, params: Any) -> Tensors:
        """The float64 truth for every output, computed on the inputs' device in bounded memory."""

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

    def estimate_device_bytes(self, params: Any) -> int:
        """Upper estimate of device memory needed to run one input group of these params:
        inputs, the float64 reference, and an impl at ~4x the unavoidable bytes."""
        return (
            self.input_bytes(params)
            + self.reference_bytes(params)
            + 4 * self.unavoidable_bytes(params)
        )

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


def generator(seed: int, device: torch.device, salt: int = 0) -> torch.Generator:
    """A torch generator on `device` seeded from (seed, salt): one stream per input tensor so
    that adding an input never shifts the values of the others."""
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + salt) % (2**63 - 1))
    return g
