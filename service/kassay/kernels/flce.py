"""kassay's fused linear cross-entropy: forward and backward, chunked over rows or over the
vocabulary, AMP-safe.

Public API: `fused_linear_cross_entropy` and `FusedLinearCrossEntropyLoss`, tuned by a frozen
`FlceConfig` passed as `config=`. The layers, one module each:
  flce.py            public API and input checks (this module)
  _flce_autograd.py  the torch.autograd.Function and the chunked pass it runs
  _flce_launch.py    the planners (`plan_schedule`: which schedule and chunk fit the memory
                     budget, by a cost model; `plan_rows`) and the kernel launchers
  _flce_vocab.py     the vocabulary-panel schedule (the low-memory end; its own docstring)
  flce_config.py     `FlceConfig`, its defaults and DEFAULT_MEMORY_BUDGET_BYTES
  _flce_kernels.py   the pure @triton.jit kernels and their tuning constants

Two schedules; `memory_budget_bytes` picks the faster that fits (`plan_call`). The vocabulary
panels (`_flce_vocab`) recompute the logits in backward (8·N·H·V FLOP instead of 6) and write
every gradient once; they reach down to N·64·itemsize bytes of working memory. The row chunks
(the default at 470 MiB, the faster from a few hundred MiB up):

Row plan (counted in research/NOTES-flce.md). For each chunk of `rows` rows:
  1. logits = x_c @ W^T (+ b)                cuBLAS, written into one reused [rows, V] buffer
  2. lse / loss / z-loss / dlogits in place  Triton, a row per program at a time, float32 math
  3. grad_x[rows] = dlogits @ W              cuBLAS, disjoint rows: one rounding, as eager
  4. grad_W (+)= dlogits^T @ x_c             Triton GEMM, float32 accumulation in registers,
                                              added into a float32 or scaled-float16 accumulator
                                              (on Hopper-class GPUs a persistent TMA kernel whose
                                              epilogue hands the add to the TMA unit: a bulk
                                              reduce-add in L2, no C load on the SM)
  5. grad_b += column sums of dlogits        float32
On Hopper, when grad_x's 128 x 256 tiles would end in a partly idle wave of the SMs (1792 x 4096:
224 tiles on 132 SMs), steps 3 and 4 run as one persistent Triton kernel (`_grads_tma_kernel`):
grad_x tiles first, then grad_W tiles, with the programs that had one grad_x tile fewer taking
more grad_W tiles, so every SM finishes together (grad_W bit-identical to step 4's kernel).
Gradients are computed in forward (reduction mean/sum) and only scaled by grad_output in
backward; for reduction='none' the forward computes losses only and the backward re-runs the
pass with the per-row grad_output folded into dlogits (2·N·H·V more FLOP, but exact per row).

Why grad_W is not accumulated with `addmm_(beta=1)` in bfloat16: every chunk then rounds the
partial sum to bfloat16 and the rel-L2 error grows like sqrt((K+1)/2) with K chunks (1.6x eager's
at K=5). A float32 accumulator would cost V·H·4 bytes (2 GiB at V=128256, H=4096). Instead, for
bfloat16 weights the accumulator is float16 scaled by a power of two s chosen from a bound on
|grad_W| (so it cannot overflow): float16 has 3 more mantissa bits than bfloat16, so each of the
K roundings is 8x smaller (with the TMA reduce-add each chunk's tile is rounded to float16 once
more before the add: grad_W error 1.003x / 1.02x eager's at the two target shapes, unchanged
within 0.3%), and the final conversion to bfloat16 (with grad_output and 1/s folded
in) is the single bfloat16 rounding eager also does. The accumulator is converted in place, so
grad_W costs V·H·2 bytes like eager's. For that mode the last chunk's grad_W GEMM is run in
backward, once grad_output is known, and its epilogue writes the finished bfloat16 gradient
((acc + s·dlogits^T x) · grad_output / s, one rounding): no separate conversion pass over V·H,
at the price of keeping the last dlogits chunk allocated from forward to backward (the peak is
unchanged: that buffer is live at the forward's peak anyway).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from kassay.kernels._flce_autograd import _autocast_dtype, _FLCEFunction
from kassay.kernels._flce_launch import INTERPRETED, Plan, flop_per_byte, plan_rows, plan_schedule
from kassay.kernels.flce_config import DEFAULT_CONFIG, DEFAULT_MEMORY_BUDGET_BYTES, FlceConfig

__all__ = [
    "DEFAULT_MEMORY_BUDGET_BYTES",
    "FlceConfig",
    "FlceOutput",
    "FusedLinearCrossEntropyLoss",
    "Plan",
    "fused_linear_cross_entropy",
    "plan_call",
    "plan_rows",
    "plan_schedule",
]

_REDUCTIONS = ("mean", "sum", "none")

_MAX_VOCAB = 2**31 - 2**16


class FlceOutput(NamedTuple):
    """What `fused_linear_cross_entropy` returns when `return_token_accuracy` is set.

    The field names are those of Liger-Kernel's `CrossEntropyOutput` (`.loss`, `.z_loss`,
    `.token_accuracy`), so code written against Liger's output reads it unchanged; being a
    tuple it also unpacks as `loss, z_loss, acc = ...`.
        loss: as without the flag.
        z_loss: the z-loss term when return_z_loss, else None.
        token_accuracy: float32, no gradient: for "mean"/"sum" a scalar, the fraction of
            non-ignored rows whose argmax over the (softcapped) logits is their target (0 when
            every row is ignored); for "none" [N], 1.0 for those rows and 0.0 for the others
            (ignored rows 0.0). Ties go to the first maximal column, as torch.argmax.
    """

    loss: torch.Tensor
    z_loss: torch.Tensor | None
    token_accuracy: torch.Tensor | None


def _check_inputs(
    x,
    weight,
    target,
    bias,
    ignore_index,
    label_smoothing,
    reduction,
    softcap,
    z_loss_scale,
    memory_budget_bytes,
    ce_weight=None,
    accum_dtype=None,
) -> _TargetCheck:
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):
        raise ValueError("x and weight must be torch.Tensor")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [N, H], got shape {tuple(x.shape)}")
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [V, H], got shape {tuple(weight.shape)}")
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"x is [N, H={x.shape[1]}] but weight is [V, H={weight.shape[1]}]")
    if x.shape[0] < 1 or weight.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"empty input: x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    if weight.shape[0] > _MAX_VOCAB:  # the CE kernel's in-row offsets are int32
        raise ValueError(f"vocabulary V={weight.shape[0]} is above the supported {_MAX_VOCAB}")
    if not isinstance(target, torch.Tensor) or target.dim() != 1 or target.shape[0] != x.shape[0]:
        raise ValueError(f"target must be a 1-D tensor of N={x.shape[0]} class indices")
    if target.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"target must be int64 (or int32), got {target.dtype}")
    floats = (torch.float32, torch.float16, torch.bfloat16)
    if x.dtype not in floats or weight.dtype not in floats:
        raise ValueError(f"x/weight dtype must be one of {floats}, got {x.dtype}/{weight.dtype}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.shape != (weight.shape[0],):
            raise ValueError(f"bias must be [V={weight.shape[0]}] or None")
        if bias.dtype not in floats:
            raise ValueError(f"bias dtype must be one of {floats}, got {bias.dtype}")
    if ce_weight is not None:
        if not isinstance(ce_weight, torch.Tensor) or ce_weight.shape != (weight.shape[0],):
            raise ValueError(f"ce_weight must be a [V={weight.shape[0]}] tensor or None")
        if not ce_weight.is_floating_point():
            raise ValueError(f"ce_weight must be a floating-point tensor, got {ce_weight.dtype}")
    if accum_dtype not in (None, torch.float32):
        raise ValueError(
            f"accum_dtype must be None (the default accumulation) or torch.float32, got "
            f"{accum_dtype}: kassay never accumulates grad_weight in a 16-bit dtype over chunks"
        )
    for name, t in (
        ("weight", weight),
        ("target", target),
        ("bias", bias),
        ("ce_weight", ce_weight),
    ):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if not 0.0 <= float(label_smoothing) <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    if softcap is not None and not float(softcap) > 0.0:
        raise ValueError(f"softcap must be > 0 or None, got {softcap}")
    if not math.isfinite(float(z_loss_scale)) or float(z_loss_scale) < 0.0:
        raise ValueError(f"z_loss_scale must be finite and >= 0, got {z_loss_scale}")
    if memory_budget_bytes is not None and memory_budget_bytes != "auto":
        if isinstance(memory_budget_bytes, bool) or not isinstance(memory_budget_bytes, int):
            raise ValueError(
                f"memory_budget_bytes must be a positive int, 'auto' or None, got "
                f"{memory_budget_bytes!r}"
            )
        if memory_budget_bytes < 1:
            raise ValueError(f"memory_budget_bytes must be positive, got {memory_budget_bytes}")
    if x.device.type != "cuda" and not INTERPRETED:
        raise ValueError("kassay flce needs CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors)")
    return _TargetCheck(target, weight.shape[0], ignore_index)


class _TargetCheck:
    """Checks that every target is in [0, V) or ignore_index, without draining the GPU.

    `bool(bad.any())` at the start of a call would wait for all work queued on the stream (a
    training step's previous backward included) and then leave the GPU idle while this call
    enqueues its first kernels. On CUDA the flag is instead copied to pinned host memory behind
    an event, and `raise_if_bad()` is called once the forward's kernels are queued: it waits only
    for that event. Those kernels clamp out-of-range targets to stay in bounds, and their results
    are dropped when it raises; the caller's tensors are never written.
    """

    def __init__(self, target: torch.Tensor, v: int, ignore_index: int):
        self.message = (
            f"target holds class indices outside [0, V={v}) other than ignore_index={ignore_index}"
        )
        self.event: torch.cuda.Event | None = None
        self.flag: torch.Tensor | None = None
        if target.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # A CUDA graph cannot wait for the host: while one is being captured the check is
            # left out (the kernels still clamp out-of-range targets, so memory stays safe, but
            # such targets are not reported). Waiting here used to fail every capture.
            return
        bad = (((target < 0) & (target != ignore_index)) | (target >= v)).any()
        if target.device.type == "cuda":
            self.flag = torch.empty((), dtype=torch.bool, pin_memory=True)
            self.flag.copy_(bad, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record(torch.cuda.current_stream(target.device))
        else:
            self.flag = bad
            self.raise_if_bad()  # host tensors: no queue to keep busy, fail before any work

    def raise_if_bad(self) -> None:
        if self.flag is None:  # skipped while a CUDA graph was captured
            return
        if self.event is not None:
            self.event.synchronize()
        if bool(self.flag):
            raise ValueError(self.message)


def _resolve_budget(budget: int | str | None, cfg: FlceConfig, device: torch.device) -> int:
    """The budget in bytes: None -> the config's; "auto" -> the config's, capped at half the
    device's free memory (CUDA; elsewhere the config's)."""
    if budget is None:
        return int(cfg.memory_budget_bytes)
    if budget == "auto":
        if device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(device)
            return max(1, min(int(cfg.memory_budget_bytes), free // 2))
        return int(cfg.memory_budget_bytes)
    return int(budget)


def plan_call(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    memory_budget_bytes: int | str | None = None,
    config: FlceConfig | None = None,
    grads: bool = True,
    reduction: str = "mean",
) -> Plan:
    """The schedule and chunk `fused_linear_cross_entropy` runs for these inputs and budget
    (`Plan`: schedule "rows" or "vocab", rows or columns per chunk, working bytes); `grads`:
    a training call (every gradient, the weight's included)."""
    cfg = DEFAULT_CONFIG if config is None else config
    n = x.reshape(-1, x.shape[-1]).shape[0]
    es = x.element_size()
    cdt = _autocast_dtype(x.device.type)
    if cdt is not None:
        es = cdt.itemsize
    return plan_schedule(
        n, x.shape[-1], weight.shape[0], es, _resolve_budget(memory_budget_bytes, cfg, x.device),
        schedule=cfg.schedule, grads=grads, per_row=reduction == "none",
        min_cols=cfg.vocab_min_cols, flop_per_byte=flop_per_byte(x.device),
        keep_logits=grads and cfg.vocab_keep_logits,
    )  # fmt: skip


def fused_linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    softcap: float | None = None,
    z_loss_scale: float = 0.0,
    return_z_loss: bool = False,
    memory_budget_bytes: int | str | None = None,
    config: FlceConfig | None = None,
    ce_weight: torch.Tensor | None = None,
    accum_dtype: torch.dtype | None = None,
    use_token_scaling: bool = False,
    return_token_accuracy: bool = False,
):
    """Cross-entropy of a linear layer's logits, without materialising the [N, V] logits.

    Args:
        x: [N, H] float32, float16 or bfloat16 activations.
        weight: [V, H] float32, float16 or bfloat16 (the lm head).
        target: [N] int64 (int32 accepted) class indices in [0, V), or `ignore_index`.
        bias: [V] or None, any of the float dtypes above.
        ignore_index: rows whose target equals it contribute no loss and no gradient.
        label_smoothing: ε in [0, 1]: the target distribution is (1-ε)·onehot + ε/V.
        reduction: "mean" (over non-ignored rows), "sum", or "none" ([N] per-row losses).
        softcap: if set, logits z become softcap·tanh(z / softcap) before the softmax.
        z_loss_scale: PaLM z-loss weight: adds z_loss_scale·lse(z)² for every non-ignored row.
        return_z_loss: also return the z-loss term alone.
        memory_budget_bytes: working memory beyond the inputs and the gradients, in bytes, or
            "auto"; default the config's (`DEFAULT_MEMORY_BUDGET_BYTES`, 470 MiB: the fastest
            point at the two target shapes). The call runs the faster of two schedules that
            fits it (`plan_call` says which): row chunks (a [rows, V] logits chunk,
            grad_weight accumulated over the chunks; the default) or vocabulary panels (an
            [N, P] panel, logits recomputed in backward, every gradient written once: the
            low-memory end, down to N·64·itemsize bytes). "auto": the config's budget, or
            half the GPU's free memory when that is less.
        config: `FlceConfig` (GEMM paths, launch tuning, memory budget); default
            `FlceConfig()`, the shipped configuration.
        ce_weight: [V] per-class weights (any float dtype, used in float32; no gradient), as
            `F.cross_entropy(weight=...)` (Liger's name: `weight` here is the lm head). See
            "Class weights" below.
        accum_dtype: None (default) or torch.float32: accumulate grad_weight over the row
            chunks in a float32 buffer and round once to weight.dtype (up to V·H·4 bytes more
            at the peak: ≤ 2 GiB at V=128256, H=4096). See "Accumulation" below.
        use_token_scaling: Liger's token scaling: each non-ignored row's loss (z-loss included)
            and its gradient are multiplied by p_n = softmax(zc_n)[t_n], the probability of
            its target, detached (no gradient flows through p_n). The mean's divisor is
            unchanged.
        return_token_accuracy: also compute, in the same pass, whether each row's argmax over
            the softcapped logits is its target; the call then returns a `FlceOutput`.

    Returns:
        loss, or (loss, z_loss) when return_z_loss. Both float32 whatever the input dtype:
        scalars for mean/sum, [N] for none. z_loss is for logging (no gradient flows from it;
        its contribution is already inside loss). With return_token_accuracy: a `FlceOutput`
        (loss, z_loss or None, token_accuracy), the field names of Liger's CrossEntropyOutput.

    Semantics, with z = x @ weight^T + bias in the compute dtype, zc = softcap·tanh(z/softcap)
    (or z), lse_n = log Σ_v exp(zc_nv) (natural log, float32), for non-ignored rows:
        loss_n = lse_n - (1-ε)·zc_n,t_n - (ε/V)·Σ_v zc_nv + z_loss_scale·lse_n²
    which equals F.cross_entropy(zc, target, ignore_index=..., label_smoothing=ε,
    reduction="none") + z_loss_scale·lse². Ignored rows give 0. "mean" divides the sum by the
    number of non-ignored rows (every target ignored: loss 0 and zero gradients, never NaN);
    z_loss = Σ_n z_loss_scale·lse_n² reduced the same way.

    Class weights (ce_weight = c, c_t = c[t_n]): exactly torch.nn.functional.cross_entropy(zc,
    target, weight=c, ignore_index=..., label_smoothing=ε) — per non-ignored row
        ce_n = (1-ε)·c_t·(lse_n - zc_n,t_n) + (ε/V)·Σ_v c_v·(lse_n - zc_nv)
    (the smoothing term is weighted by each class's own weight, as torch does); "mean" divides
    Σ_n ce_n by Σ_n c_t over the non-ignored rows (0 when that sum is 0, where torch gives NaN);
    "sum" and "none" do not divide. The z-loss term is not weighted and its mean divides by the
    number of non-ignored rows (Liger's definition; torch has no z-loss).

    Accumulation of grad_weight over row chunks: one chunk is a single cuBLAS GEMM (float32
    accumulation, one rounding). Over several chunks, by default: float32 weights, AMP and
    float16 weights in a float32 buffer; bfloat16 weights in a float16 buffer scaled by a power
    of two (see the module docstring): grad_weight rel-L2 error 1.003x / 1.02x eager's at the
    two target shapes (H200; eager computes grad_weight in one GEMM), at V·H·2 bytes.
    accum_dtype=torch.float32 moves bfloat16 weights to the float32 buffer (one rounding,
    eager's error, up to V·H·4 bytes more). grad_bias is always summed in float32.

    Gradients: grad_x [N, H] in x.dtype, grad_weight [V, H] in weight.dtype, grad_bias [V] in
    bias.dtype. Softmax, lse and dloss/dlogits are float32; GEMMs accumulate in float32; float32
    inputs use IEEE (not TF32) GEMMs. For mean/sum the gradients are computed in forward and
    scaled by grad_output in backward; for "none" the backward recomputes the pass with each
    row's grad_output folded in (exact per-row scaling, 8·N·H·V FLOP in all).

    Autocast: under torch.autocast (cuda or cpu, float16/bfloat16) float32 x/weight/bias are
    cast to the autocast dtype for the GEMMs (bias too, so no addmm dtype mismatch), the logits
    chunk stays 16-bit, and gradients come back in the parameters' dtypes (grad_weight is then
    accumulated in float32 directly).

    Targets outside [0, V) other than ignore_index raise ValueError once the forward's kernels
    are queued (the host waits for one flag, not for the stream). While a CUDA graph is being
    captured that wait is impossible and the check is left out: the kernels clamp such targets
    (no out-of-bounds access), but a replayed graph does not report them.
    """
    target_check = _check_inputs(
        x,
        weight,
        target,
        bias,
        ignore_index,
        label_smoothing,
        reduction,
        softcap,
        z_loss_scale,
        memory_budget_bytes,
        ce_weight,
        accum_dtype,
    )
    compute_dtype = _autocast_dtype(x.device.type)
    if compute_dtype is None:
        compute_dtype = x.dtype
        if weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
            raise ValueError(
                f"x, weight and bias must share a dtype outside autocast, got "
                f"{x.dtype}, {weight.dtype}, {None if bias is None else bias.dtype}"
            )
    elif x.dtype not in (torch.float32, compute_dtype) or weight.dtype not in (
        torch.float32,
        compute_dtype,
    ):
        raise ValueError(
            f"under autocast({compute_dtype}) x/weight must be float32 or "
            f"{compute_dtype}, got {x.dtype}/{weight.dtype}"
        )
    cfg = DEFAULT_CONFIG if config is None else config
    if not isinstance(cfg, FlceConfig):
        raise ValueError(f"config must be a FlceConfig or None, got {type(cfg).__name__}")
    budget = _resolve_budget(memory_budget_bytes, cfg, x.device)
    loss, zl, acc = _FLCEFunction.apply(
        x,
        weight,
        target.long(),
        bias,
        ce_weight,
        int(ignore_index),
        float(label_smoothing),
        reduction,
        None if softcap is None else float(softcap),
        float(z_loss_scale),
        compute_dtype,
        budget,
        cfg,
        torch.is_grad_enabled(),
        bool(use_token_scaling),
        bool(return_token_accuracy),
        accum_dtype is not None,
    )
    target_check.raise_if_bad()
    if return_token_accuracy:
        return FlceOutput(loss, zl if return_z_loss else None, acc)
    return (loss, zl) if return_z_loss else loss


class FusedLinearCrossEntropyLoss(nn.Module):
    """Module form of `fused_linear_cross_entropy` (same options, same semantics).

    forward(x [N, H], weight [V, H], target [N] int64, bias [V] | None = None) -> loss, or
    (loss, z_loss) when return_z_loss, or a `FlceOutput` when return_token_accuracy.
    `config` (a frozen `FlceConfig`) and `ce_weight` (a [V] tensor, registered as a buffer so
    it follows the module's device) are kept as given.
    """

    def __init__(
        self,
        *,
        ignore_index: int = -100,
        label_smoothing: float = 0.0,
        reduction: str = "mean",
        softcap: float | None = None,
        z_loss_scale: float = 0.0,
        return_z_loss: bool = False,
        memory_budget_bytes: int | str | None = None,
        config: FlceConfig | None = None,
        ce_weight: torch.Tensor | None = None,
        accum_dtype: torch.dtype | None = None,
        use_token_scaling: bool = False,
        return_token_accuracy: bool = False,
    ):
        super().__init__()
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing
        self.reduction = reduction
        self.softcap = softcap
        self.z_loss_scale = z_loss_scale
        self.return_z_loss = return_z_loss
        self.memory_budget_bytes = memory_budget_bytes
        self.config = config
        self.ce_weight: torch.Tensor | None
        self.register_buffer("ce_weight", ce_weight)
        self.accum_dtype = accum_dtype
        self.use_token_scaling = use_token_scaling
        self.return_token_accuracy = return_token_accuracy

    def forward(self, x, weight, target, bias=None):
        return fused_linear_cross_entropy(
            x,
            weight,
            target,
            bias,
            ignore_index=self.ignore_index,
            label_smoothing=self.label_smoothing,
            reduction=self.reduction,
            softcap=self.softcap,
            z_loss_scale=self.z_loss_scale,
            return_z_loss=self.return_z_loss,
            memory_budget_bytes=self.memory_budget_bytes,
            config=self.config,
            ce_weight=self.ce_weight,
            accum_dtype=self.accum_dtype,
            use_token_scaling=self.use_token_scaling,
            return_token_accuracy=self.return_token_accuracy,
        )

    def extra_repr(self) -> str:
        return (
            f"reduction={self.reduction!r}, ignore_index={self.ignore_index}, "
            f"label_smoothing={self.label_smoothing}, softcap={self.softcap}, "
            f"z_loss_scale={self.z_loss_scale}, ce_weight={self.ce_weight is not None}, "
            f"accum_dtype={self.accum_dtype}, use_token_scaling={self.use_token_scaling}, "
            f"return_token_accuracy={self.return_token_accuracy}"
        )
