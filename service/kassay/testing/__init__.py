"""kassay's verdicts from a kernel repository's own tests.

    import kassay.testing as kt

    def my_merge(outs, lses, *, lse_layout, accumulate):  # the op's calling convention
        ...

    @kt.parametrize("lse_merge", T=64, Hh=4, D=32, K=[2, 4], dtype=["float32", "float16"])
    def test_my_merge(case):
        kt.assert_kernel("lse_merge", my_merge, case)

`assert_kernel` runs in this process, on CUDA when present else the CPU (Triton kernels under
its interpreter), through the engine a job runs on: the same seeded inputs, the same float64
reference (cached per process), the same baseline, policy and verdict checks. A case key and
its verdict are those `kassay run` gives for a suite of the same grid (tests/unit prove it).
On a verdict other than passed it raises `KernelAssertionError` (an AssertionError) whose first
line names the op, the impl, the case, the output, the metric, its value, the limit and how the
limit was formed; the worst elements follow. A case the op or the impl cannot run (a
combination the op refuses, `unsupported`, a bfloat16 Triton case under the CPU interpreter) is
skipped with the reason: `pytest.skip` inside pytest, `KernelSkipped` elsewhere.

`impl` is a function in the op's calling convention (`Op.harness_doc`: flce's
loss_fn(x, weight, target, bias, params), lse_merge's merge(outs, lses, *, lse_layout,
accumulate) or in-place step), the registry's own `run(inputs, params)` for an op without a
harness, an `Impl`, or the name of a registered impl ("torch", "kassay", a plugin's).

The pytest plugin (`kassay.testing.plugin`, entry point `pytest11`) adds the `kassay` fixture
and marker, `--kassay-report PATH` and `--kassay-timing`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kassay.testing.assertion import (
        Case,
        KernelAssertionError,
        KernelSkipped,
        assert_kernel,
        cases,
        parametrize,
    )

__all__ = [
    "Case",
    "KernelAssertionError",
    "KernelSkipped",
    "assert_kernel",
    "cases",
    "parametrize",
]


def __getattr__(name: str) -> Any:
    # imported on first use: the pytest plugin (kassay.testing.plugin) loads with every pytest
    # run where kassay is installed, and must not import torch for a run that never asserts
    if name in __all__:
        from kassay.testing import assertion

        return getattr(assertion, name)
    raise AttributeError(f"module 'kassay.testing' has no attribute {name!r}")
