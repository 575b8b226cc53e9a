"""flce mutants (known bugs 1-5, 10-18 and 23)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from kassay.ops.flce import FlceParams
from kassay.ops.flce import harness as flce_harness
from kassay.ops.registry import Impl, register


def _mutant(name: str, fn: Any, bug: str, exposes: tuple[str, ...] = ("normal",)) -> None:
    register(
        Impl("flce", name, flce_harness.as_run(fn), bug, kind="mutant", bug=bug, exposes=exposes)
    )


def _ce_rows(
    z: torch.Tensor, target: torch.Tensor, p: FlceParams, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """Correct per-row cross-entropy of logits z [N, V] (class weights `weight` [V] or none)."""
    return F.cross_entropy(
        z,
        target,
        weight=weight,
        ignore_index=p.ignore_index,
        label_smoothing=p.label_smoothing,
        reduction="none",
    )


def _rows(
    x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, b: torch.Tensor | None, p: FlceParams
) -> torch.Tensor:
    """Correct per-row losses (float32 logits), for mutants that break something else."""
    return _ce_rows(F.linear(x, w, b).float(), target, p)


def autocast_bias_none(
    x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, b: torch.Tensor | None, p: FlceParams
) -> Any:
    """Liger-Kernel under AMP: the fused op casts the input to the autocast dtype but runs its
    matmul outside autocast, so with bias None mm gets a bf16 mat1 and a float32 mat2 ("mat1 and
    mat2 must have the same dtype"); with a bias the cast happened to be done on every operand."""
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        x = x.to(torch.get_autocast_dtype(dev))
    with torch.autocast(dev, enabled=False):
        if b is not None:
            z = torch.addmm(b.to(x.dtype), x, w.t().to(x.dtype))
        else:
            z = torch.mm(x, w.t())
        return F.cross_entropy(
            z.float(),
            target,
            ignore_index=p.ignore_index,
            label_smoothing=p.label_smoothing,
            reduction=p.reduction,
        )


def ignored_zero_div(
    x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, b: torch.Tensor | None, p: FlceParams
) -> Any:
    """Mean reduction as sum / number of non-ignored rows with no guard: every target ignored
    gives 0/0 = NaN in the loss and the gradients."""
    rows = _rows(x, w, target, b, p)
    if p.reduction != "mean":
        return rows if p.reduction == "none" else rows.sum()
    return rows.sum() / (target != p.ignore_index).sum()


class _RowScaleBug(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, p: FlceParams
    ) -> torch.Tensor:
        with torch.enable_grad():
            xx, ww = x.detach().requires_grad_(), w.detach().requires_grad_()
            rows = _rows(xx, ww, target, None, p)
            gx, gw = torch.autograd.grad(rows.sum(), (xx, ww))
        ctx.save_for_backward(gx, gw)
        return rows.detach()

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        gx, gw = ctx.saved_tensors
        s = grad_output[0]  # the bug: one scalar for every row
        return gx * s, gw * s, None, None


def none_grad_scale(
    x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, b: torch.Tensor | None, p: FlceParams
) -> Any:
    """Liger-Kernel's FLCE with reduction='none': gradients computed in forward are scaled in
    backward by grad_output[0] instead of each row's grad_output."""
    if p.reduction != "none":
        return _rows(x, w, target, b, p).sum()
    return _RowScaleBug.apply(x, w, target, p)


class _ChunkAccumBug(torch.autograd.Function):
    CHUNK = 16

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, p: FlceParams
    ) -> torch.Tensor:
        gx = torch.empty_like(x)
        gw = torch.zeros_like(w)  # accumulated in the weight's dtype: bf16 rounding per chunk
        total = torch.zeros((), dtype=torch.float32, device=x.device)
        n_valid = max(int((target != p.ignore_index).sum()), 1)
        for s in range(0, x.shape[0], _ChunkAccumBug.CHUNK):
            with torch.enable_grad():
                xc = x[s : s + _ChunkAccumBug.CHUNK].detach().requires_grad_()
                wc = w.detach().requires_grad_()
                rows = _rows(xc, wc, target[s : s + _ChunkAccumBug.CHUNK], None, p)
                loss_c = rows.sum() / n_valid if p.reduction == "mean" else rows.sum()
                g_x, g_w = torch.autograd.grad(loss_c, (xc, wc))
            gx[s : s + _ChunkAccumBug.CHUNK] = g_x
            gw += g_w
            total += loss_c.detach()
        ctx.save_for_backward(gx, gw)
        return total

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        gx, gw = ctx.saved_tensors
        return gx * grad_output, gw * grad_output, None, None


def bf16_chunk_accum(
    x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, b: torch.Tensor | None, p: FlceParams
) -> Any:
    """Liger-Kernel issues #512/#827/#1472: grad_weight accumulated in bf16 across many small
    row chunks (16 rows here) drifts with the number of chunks."""
    if p.reduction == "none":
        return _rows(x, w, target, b, p)
    return _ChunkAccumBug.apply(x, w, target, p)


def label_smoothing_weight(
    x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, b: torch.Tensor | None, p: FlceParams
) -> Any:
    """Label smoothing mixed with the wrong weight: nll + eps * smooth instead of
    (1 - eps) * nll + eps * smooth."""
    z = F.linear(x, w, b).float()
    logp = torch.log_softmax(z, dim=-1)
    valid = target != p.ignore_index
    nll = -logp.gather(1, torch.where(valid, target, 0)[:, None])[:, 0]
    smooth = -logp.mean(dim=-1)
    rows = (nll + p.label_smoothing * smooth) * valid
    if p.reduction == "none":
        return rows
    return rows.sum() / valid.sum().clamp_min(1) if p.reduction == "mean" else rows.sum()


def zeros(
    x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, b: torch.Tensor | None, p: FlceParams
) -> Any:
    """A kernel that never writes its outputs (here: every output and gradient is zero)."""
    rows = (x.sum(dim=1) * 0.0).float()
    out = rows + (w.sum() * 0.0).float() + ((b.sum() * 0.0).float() if b is not None else 0.0)
    return out if p.reduction == "none" else out.sum()


def grad_softmax_lost(
    x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, b: torch.Tensor | None, p: FlceParams
) -> Any:
    """A fused kernel whose backward reads a probabilities buffer that was never written (or
    was zeroed): d logits = 0 - target distribution instead of softmax - target distribution.
    The loss is right; every gradient is wrong, and training grows the logits of frequent
    targets without bound."""
    z = F.linear(x, w, b).float()
    valid = target != p.ignore_index
    eps, v = p.label_smoothing, z.shape[-1]
    onehot = F.one_hot(torch.where(valid, target, 0), v).float()
    q = ((1 - eps) * onehot + eps / v) * valid[:, None]  # the target distribution per row
    # forward: the true losses; backward: the gradient of -q . z, the softmax term lost
    linear = -(q * z).sum(dim=-1)
    rows = _ce_rows(z.detach(), target, p) + (linear - linear.detach())
    return _reduce(rows, valid.sum(), p)


_mutant(
    "m_autocast_bias_none",
    autocast_bias_none,
    "1: autocast + bias None -> mm dtype mismatch (Liger-Kernel)",
)
_mutant(
    "m_ignored_zero_div", ignored_zero_div, "2: every target ignored -> 0/0 NaN", ("all_ignored",)
)
_mutant(
    "m_none_grad_scale",
    none_grad_scale,
    "3: reduction none scales all gradients by grad_output[0] (Liger-Kernel)",
)
_mutant(
    "m_bf16_chunk_accum",
    bf16_chunk_accum,
    "4: grad_weight accumulated in bf16 over many small chunks (Liger-Kernel)",
)
_mutant(
    "m_label_smoothing_weight",
    label_smoothing_weight,
    "5: label smoothing applied with the wrong weight",
)
_mutant("m_zeros", zeros, "10: outputs all zeros / never written")
_mutant(
    "m_grad_softmax_lost",
    grad_softmax_lost,
    "23: backward drops the softmax term (d logits = -target); the loss is right",
)


# ------------------------------------------------------------------------------------------
# Bugs a plain spec (no regimes listed, the user's shapes and options) misses unless default
# coverage reaches their code path; `kassay selftest` runs them under such a spec.


def softcap_before_bias(
    x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, b: torch.Tensor | None, p: FlceParams
) -> Any:
    """Softcap applied to x @ W^T before the bias is added (c*tanh(xW/c) + b instead of
    c*tanh((xW + b)/c)): right whenever there is no bias or no softcap."""
    z = F.linear(x, w).float()
    if p.softcap is not None:
        z = p.softcap * torch.tanh(z / p.softcap)
    if b is not None:
        z = z + b.float()
    return F.cross_entropy(
        z,
        target,
        ignore_index=p.ignore_index,
        label_smoothing=p.label_smoothing,
        reduction=p.reduction,
    )


def tail_rows_dropped(
    x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, b: torch.Tensor | None, p: FlceParams
) -> Any:
    """A kernel launched over N // 16 row blocks with no mask for the last partial block: rows
    past the last multiple of 16 contribute nothing (no loss, zero gradient)."""
    full = (x.shape[0] // 16) * 16
    keep = torch.arange(x.shape[0], device=x.device) < full
    t = torch.where(keep, target, torch.full_like(target, p.ignore_index))
    rows = _rows(x, w, t, b, p)
    if p.reduction == "none":
        return rows
    return (
        rows.sum() / (target != p.ignore_index).sum().clamp_min(1)
        if p.reduction == "mean"
        else rows.sum()
    )


def count_in_bf16(
    x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, b: torch.Tensor | None, p: FlceParams
) -> Any:
    """The mean's divisor (non-ignored rows) counted in a bfloat16 register: exact up to 256
    rows, rounded beyond (750 rows count as 752): loss and gradients off by a fraction of a
    percent, only at scale."""
    rows = _rows(x, w, target, b, p)
    if p.reduction != "mean":
        return rows if p.reduction == "none" else rows.sum()
    n = (target != p.ignore_index).to(torch.bfloat16).sum(dtype=torch.bfloat16).float()
    return rows.sum() / n.clamp_min(1)


_mutant(
    "m_softcap_before_bias",
    softcap_before_bias,
    "11: softcap applied before the bias is added (only wrong with both)",
)
_mutant(
    "m_tail_rows_dropped",
    tail_rows_dropped,
    "12: rows past the last multiple of 16 dropped (no tail mask)",
)
_mutant(
    "m_count_in_bf16",
    count_in_bf16,
    "13: mean divisor counted in bfloat16 (wrong beyond 256 rows)",
)


# ------------------------------------------------------------------------------------------
# Bugs of the options Liger-Kernel has and kassay gained (issue 21): class weights, token
# scaling, token accuracy, accumulation dtype. One per option; each is right when its option
# is off.


def _weighted_rows(
    x: torch.Tensor,
    w: torch.Tensor,
    target: torch.Tensor,
    b: torch.Tensor | None,
    p: FlceParams,
    ce_weight: torch.Tensor | None,
) -> torch.Tensor:
    return _ce_rows(F.linear(x, w, b).float(), target, p, ce_weight)


def _reduce(rows: torch.Tensor, divisor: torch.Tensor, p: FlceParams) -> torch.Tensor:
    if p.reduction == "none":
        return rows
    return rows.sum() / divisor.clamp_min(1) if p.reduction == "mean" else rows.sum()


def ce_weight_row_mean(
    x: torch.Tensor,
    w: torch.Tensor,
    target: torch.Tensor,
    b: torch.Tensor | None,
    p: FlceParams,
    ce_weight: torch.Tensor | None = None,
) -> Any:
    """Class-weighted rows, but the mean divides by the number of non-ignored rows instead of
    the sum of their targets' weights (the weights then scale the loss instead of reweighting
    it)."""
    rows = _weighted_rows(x, w, target, b, p, ce_weight)
    return _reduce(rows, (target != p.ignore_index).sum(), p)


def ce_weight_smoothing(
    x: torch.Tensor,
    w: torch.Tensor,
    target: torch.Tensor,
    b: torch.Tensor | None,
    p: FlceParams,
    ce_weight: torch.Tensor | None = None,
) -> Any:
    """Label smoothing with class weights done the intuitive way: the whole smoothed row
    loss times the target's weight, c_y·((1-ε)·nll + ε·mean_j(-log p_j)), where torch weighs
    each class's smoothing term by its own weight, Σ_j (ε/V)·c_j·(-log p_j)."""
    logp = torch.log_softmax(F.linear(x, w, b).float(), dim=-1)
    valid = target != p.ignore_index
    safe = torch.where(valid, target, 0)
    c_y = ce_weight[safe] * valid if ce_weight is not None else valid.float()
    nll = -logp.gather(1, safe[:, None])[:, 0]
    rows = c_y * ((1 - p.label_smoothing) * nll - p.label_smoothing * logp.mean(dim=-1))
    if p.reduction == "mean":
        return rows.sum() / c_y.sum()
    return _reduce(rows, c_y.sum(), p)


def token_scaling_grad(
    x: torch.Tensor,
    w: torch.Tensor,
    target: torch.Tensor,
    b: torch.Tensor | None,
    p: FlceParams,
) -> Any:
    """Token scaling whose target probability is not detached: the loss is right, but the
    gradient also flows through p_y (d(p·ce) = p·dce + ce·dp instead of p·dce)."""
    z = F.linear(x, w, b).float()
    rows = _ce_rows(z, target, p)
    valid = target != p.ignore_index
    if p.use_token_scaling:
        rows = (
            rows * torch.softmax(z, dim=-1).gather(1, torch.where(valid, target, 0)[:, None])[:, 0]
        )
    return _reduce(rows, valid.sum(), p)


def accuracy_counts_ignored(
    x: torch.Tensor,
    w: torch.Tensor,
    target: torch.Tensor,
    b: torch.Tensor | None,
    p: FlceParams,
) -> Any:
    """Token accuracy over every row: ignored rows count in the denominator (a mean over N
    instead of over the non-ignored rows)."""
    z = F.linear(x, w, b).float()
    valid = target != p.ignore_index
    rows = _ce_rows(z, target, p)
    hits = ((z.detach().argmax(dim=-1) == target) & valid).float()
    acc = hits if p.reduction == "none" else hits.mean()
    return _reduce(rows, valid.sum(), p), None, acc


def accum_bf16_when_f32(
    x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, b: torch.Tensor | None, p: FlceParams
) -> Any:
    """accum_dtype='float32' accepted and ignored: grad_weight still accumulated in bf16 over
    16-row chunks (Liger-Kernel's default mode, bugs 4)."""
    return bf16_chunk_accum(x, w, target, b, p)


_mutant(
    "m_ce_weight_row_mean",
    ce_weight_row_mean,
    "14: class-weighted mean divided by the row count, not the targets' weight sum",
)
_mutant(
    "m_ce_weight_smoothing",
    ce_weight_smoothing,
    "15: label smoothing with class weights weighted by the target's weight only",
)
_mutant(
    "m_token_scaling_grad",
    token_scaling_grad,
    "16: token scaling's target probability not detached (gradient through it)",
)
_mutant(
    "m_accuracy_counts_ignored",
    accuracy_counts_ignored,
    "17: token accuracy averaged over all rows, ignored ones included",
)
_mutant(
    "m_accum_bf16_when_f32",
    accum_bf16_when_f32,
    "18: accum_dtype=float32 ignored: grad_weight accumulated in bf16 over chunks",
)
