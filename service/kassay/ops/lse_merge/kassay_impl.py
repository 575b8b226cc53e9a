"""kassay's Triton attention-state merge (kassay.kernels.lse_merge) as the `kassay` impl."""

from __future__ import annotations

from typing import Literal, cast

import torch

from kassay.kernels import merge_state_, merge_states
from kassay.ops.lse_merge import harness as lse_harness
from kassay.ops.registry import Impl, register


def _merge(
    outs: torch.Tensor, lses: torch.Tensor, *, lse_layout: str, accumulate: str
) -> tuple[torch.Tensor, torch.Tensor]:
    # The kernel always accumulates in float32 registers: `accumulate` changes nothing here.
    return merge_states(outs, lses, lse_layout=cast(Literal["hT", "Th"], lse_layout))


# merge_state_ has the LseUpdate signature itself (its lse_layout a Literal of the two layouts)
_update = cast(lse_harness.LseUpdate, merge_state_)


register(
    Impl(
        "lse_merge",
        "kassay",
        lse_harness.as_run(_merge, _update),
        "kassay's Triton merge: K-way and in-place, float32 accumulation",
    )
)
