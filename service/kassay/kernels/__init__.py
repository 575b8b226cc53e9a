"""kassay's Triton kernels, usable as a library without the service.

    from kassay.kernels import fused_linear_cross_entropy, merge_state

Fused linear cross-entropy (forward and backward, chunked over rows or over vocabulary panels
by a memory budget, AMP-safe):
    fused_linear_cross_entropy, FusedLinearCrossEntropyLoss (an nn.Module), FlceConfig (frozen
    tuning passed as `config=`), FlceOutput (what a call with return_token_accuracy returns),
    plan_call (the schedule and chunk a call runs), DEFAULT_MEMORY_BUDGET_BYTES.
Attention-state merge (softmax log-sum-exp correction, natural-log LSE):
    merge_state (two states into new tensors), merge_states (K states, one pass),
    merge_state_ (fold one state into an accumulator in place), MergeConfig (frozen launch
    tuning passed as `config=`).

Only torch and triton are imported (nothing of the service: no pydantic, grpc, fastapi or
sqlalchemy); `pip install 'kassay[kernels]'` adds those two to kassay's small base dependencies,
which the kernels do not import. On a host without a GPU, set
TRITON_INTERPRET=1 before the first import to run the kernels on CPU tensors (slowly; the
interpreter computes tl.dot on bfloat16 wrongly, so use float32 or float16 there).
"""

from kassay.kernels.flce import (
    DEFAULT_MEMORY_BUDGET_BYTES,
    FlceConfig,
    FlceOutput,
    FusedLinearCrossEntropyLoss,
    fused_linear_cross_entropy,
    plan_call,
)
from kassay.kernels.lse_merge import MergeConfig, merge_state, merge_state_, merge_states

__all__ = [
    "DEFAULT_MEMORY_BUDGET_BYTES",
    "FlceConfig",
    "FlceOutput",
    "FusedLinearCrossEntropyLoss",
    "MergeConfig",
    "fused_linear_cross_entropy",
    "merge_state",
    "merge_state_",
    "merge_states",
    "plan_call",
]
