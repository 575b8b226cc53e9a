"""What kassay loads: the `kassay.impls` entry point of this package."""

from __future__ import annotations

from kassay.impls import Impl
from kassay.ops.lse_merge.harness import as_run, supports_modes


def _merge(outs, lses, *, lse_layout, accumulate):  # accumulates in float32 either way
    from kassay_example_kernels.merge import merge_states

    return merge_states(outs, lses, lse_layout=lse_layout)


def impls() -> list[Impl]:
    return [
        Impl(
            "lse_merge",
            "example_merge",
            as_run(merge=_merge),
            "example package: a Triton K-way merge (one program per row)",
            supports=supports_modes(merge=True, update=False),
        )
    ]
