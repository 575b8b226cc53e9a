"""The autograd Function of kassay's fused linear cross-entropy and the chunked pass it runs.

`_FLCEFunction` runs `_flce_pass` in forward (and again in backward for reduction='none'); the
pass walks the row chunks planned by `plan_rows`, with cuBLAS GEMMs (torch.mm) and the launchers
of `_flce_launch`, and accumulates grad_weight in a `_GradW`. The plan, and why grad_weight is
accumulated the way it is, are in the docstring of `kassay.kernels.flce`. Every tuning choice
comes from the `FlceConfig` the public function passes down.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kassay.kernels._flce_launch import (
    INTERPRETED,
    _grads_fused_ok,
    _ieee_fp32_matmul,
    _launch_ce,
    _launch_finalize,
    _launch_gemm_tn,
    _launch_grads,
    _scale_,
    flop_per_byte,
    plan_rows,
    plan_schedule,
)
from kassay.kernels._flce_vocab import (
    KeptLogits,
    VocabStats,
    plan_kept,
    vocab_backward,
    vocab_forward,
)
from kassay.kernels.flce_config import FlceConfig


class _GradW:
    """The grad_weight accumulator of one pass and how to turn it into the final gradient.

    mode "direct": one chunk, computed by cuBLAS in the weight dtype (one rounding, as eager).
    mode "f32":    float32 accumulator (float32 weights, AMP with float32 weights, float16
                   weights with several chunks).
    mode "f16s":   float16 accumulator holding s·grad_W, s a power of two (bfloat16 weights with
                   several chunks); converted in place to bfloat16.
    mode "cublas": addmm_ in the weight dtype over the chunks (drifts; benchmark only).
    """

    def __init__(self, mode: str, acc: torch.Tensor, scale: torch.Tensor, cfg: FlceConfig):
        self.mode = mode
        self.cfg = cfg
        self.acc = acc
        self.scale = scale  # float32 [1]: the accumulator holds scale * grad_W
        self.inv_scale = 1.0 / scale
        # "f16s": (dlogits, x) of the last chunk, whose GEMM is run by finalize (defer_last_gw)
        self.pending: tuple[torch.Tensor, torch.Tensor] | None = None

    def finalize(self, factor: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
        """grad_W = acc / s * factor in out_dtype (factor: float32 scalar tensor or None)."""
        f = self.inv_scale if factor is None else self.inv_scale * factor.float()
        acc = self.acc
        if self.mode == "f16s":
            out = (
                acc.view(out_dtype)
                if out_dtype.itemsize == 2
                else torch.empty(acc.shape, dtype=out_dtype, device=acc.device)
            )
            fin = f.reshape(1).contiguous()
            if self.pending is not None:  # last chunk's GEMM writes the finished gradient
                z, xc = self.pending
                self.pending = None
                _launch_gemm_tn(
                    z, xc, acc, self.scale, accumulate=True, out=out, fin=fin, cfg=self.cfg
                )
            else:
                _launch_finalize(acc, out, fin, cfg=self.cfg)
            return out
        if acc.dtype == out_dtype:
            if factor is not None:
                _scale_(acc, f.to(acc.dtype) if acc.dtype == torch.float64 else f, cfg=self.cfg)
            return acc
        # a float32 accumulator into a 16-bit gradient: one rounding of acc * f, and no float32
        # temporary of V·H (acc.float() * f would add 4·V·H bytes to the peak)
        out = torch.empty(acc.shape, dtype=out_dtype, device=acc.device)
        fin = f.reshape(1).float().contiguous()
        if acc.device.type == "cuda" or INTERPRETED:
            _launch_finalize(acc, out, fin, cfg=self.cfg)
        else:
            out.copy_(acc * fin)
        return out


def _flce_pass(
    x: torch.Tensor,  # [N, H] compute dtype, contiguous
    w: torch.Tensor,  # [V, H] compute dtype, contiguous
    b: torch.Tensor | None,  # [V] compute dtype
    target: torch.Tensor,  # [N] int64
    *,
    ignore_index: int,
    label_smoothing: float,
    z_loss_scale: float,
    softcap: float | None,
    row_scale: torch.Tensor,  # float32 scalar [1] or per-row [N]
    per_row_scale: bool,
    need_gx: bool,
    need_gw: bool,
    need_gb: bool,
    w_out_dtype: torch.dtype,
    budget: int,
    cfg: FlceConfig,
    cew: torch.Tensor | None = None,  # [V] float32 class weights
    cew_sum: torch.Tensor | None = None,  # float32 [1]: their sum
    zrow_scale: torch.Tensor | None = None,  # with cew: the z-loss factor, shaped as row_scale
    token_scaling: bool = False,
    want_accuracy: bool = False,
    accum_f32: bool = False,  # grad_weight accumulated in float32 over the chunks
):
    """One walk over the row chunks: per-row loss, z-loss, lse (and argmax hits with
    want_accuracy), and the gradients asked for, scaled by row_scale (the class-weighted CE
    part) and zrow_scale (the z-loss part; the same as row_scale without class weights)."""
    n, h = x.shape
    v = w.shape[0]
    dev = x.device
    cdt = x.dtype
    compute_grad = need_gx or need_gw or need_gb
    rows = plan_rows(n, v, x.element_size(), budget)
    n_chunks = -(-n // rows)

    loss_rows = torch.empty(n, dtype=torch.float32, device=dev)
    zloss_rows = torch.empty(n, dtype=torch.float32, device=dev)
    lse_rows = torch.empty(n, dtype=torch.float32, device=dev)
    acc_rows = torch.empty(n, dtype=torch.float32, device=dev) if want_accuracy else None
    grad_x = torch.empty((n, h), dtype=cdt, device=dev) if need_gx else None
    grad_b = torch.zeros(v, dtype=torch.float32, device=dev) if need_gb else None

    gw: _GradW | None = None
    one = torch.ones(1, dtype=torch.float32, device=dev)
    if need_gw:
        if cdt == torch.float32:
            gw = _GradW("f32", torch.empty((v, h), dtype=cdt, device=dev), one, cfg)
        elif n_chunks == 1 and w_out_dtype == cdt:
            # one cuBLAS GEMM: float32 accumulation and one rounding (also what accum_f32 asks)
            gw = _GradW("direct", torch.empty((v, h), dtype=cdt, device=dev), one, cfg)
        elif accum_f32:
            gw = _GradW("f32", torch.empty((v, h), dtype=torch.float32, device=dev), one, cfg)
        elif w_out_dtype == cdt and cfg.gw_accumulation == "cublas":
            gw = _GradW("cublas", torch.empty((v, h), dtype=cdt, device=dev), one, cfg)
        elif w_out_dtype == torch.bfloat16 and cdt == torch.bfloat16:
            s = _f16_accumulator_scale(
                x, w, b, target, ignore_index, z_loss_scale, softcap, row_scale, per_row_scale,
                cew, zrow_scale,
            )  # fmt: skip
            acc16 = torch.empty((v, h), dtype=torch.float16, device=dev)
            gw = _GradW("f16s", acc16, s.reshape(1).float(), cfg)
        else:
            gw = _GradW("f32", torch.empty((v, h), dtype=torch.float32, device=dev), one, cfg)

    zbuf = torch.empty((rows, v), dtype=cdt, device=dev)
    wt = w.t()
    with _ieee_fp32_matmul(cdt == torch.float32):
        for i, r0 in enumerate(range(0, n, rows)):
            r1 = min(n, r0 + rows)
            z = zbuf[: r1 - r0]
            xc = x[r0:r1]
            if b is not None:
                torch.addmm(b, xc, wt, out=z)
            else:
                torch.mm(xc, wt, out=z)
            _launch_ce(
                z,
                target[r0:r1],
                loss_rows[r0:r1],
                zloss_rows[r0:r1],
                lse_rows[r0:r1],
                row_scale[r0:r1] if per_row_scale else row_scale,
                per_row_scale,
                V=v,
                ignore_index=ignore_index,
                label_smoothing=label_smoothing,
                z_loss_scale=z_loss_scale,
                softcap=softcap,
                compute_grad=compute_grad,
                cfg=cfg,
                cew=cew,
                cew_sum=cew_sum,
                zscale=(
                    None
                    if cew is None or zrow_scale is None
                    else zrow_scale[r0:r1]
                    if per_row_scale
                    else zrow_scale
                ),
                acc=acc_rows[r0:r1] if acc_rows is not None else None,
                token_scaling=token_scaling,
            )
            if not compute_grad:
                continue
            if grad_b is not None:
                grad_b += z.sum(0, dtype=torch.float32)
            gx = grad_x[r0:r1] if grad_x is not None else None
            f16s = gw is not None and gw.mode == "f16s"
            deferred = f16s and cfg.defer_last_gw and i > 0 and r1 == n
            if (
                gx is not None
                and f16s
                and not deferred
                and _grads_fused_ok(z, w, gx, xc, gw.acc, cfg=cfg)
            ):
                _launch_grads(z, w, gx, xc, gw.acc, gw.scale, accumulate=i > 0, cfg=cfg)
                continue
            if gx is not None:
                torch.mm(z, w, out=gx)
            if gw is not None:
                if deferred:
                    gw.pending = (z, xc)  # run by gw.finalize (backward): fused conversion
                else:
                    _accumulate_gw(gw, z, xc, first=i == 0)
    del zbuf
    return loss_rows, zloss_rows, lse_rows, grad_x, gw, grad_b, acc_rows


def _accumulate_gw(gw: _GradW, z: torch.Tensor, xc: torch.Tensor, first: bool) -> None:
    if gw.mode in ("direct", "cublas") or (gw.mode == "f32" and z.dtype == gw.acc.dtype):
        if first:
            torch.mm(z.t(), xc, out=gw.acc)
        else:
            gw.acc.addmm_(z.t(), xc)
    else:  # "f16s", or a float32 accumulator with 16-bit operands
        _launch_gemm_tn(z, xc, gw.acc, gw.scale, accumulate=not first, cfg=gw.cfg)


def _f16_accumulator_scale(
    x, w, b, target, ignore_index, z_loss_scale, softcap, row_scale, per_row_scale,
    cew=None, zrow_scale=None,
) -> torch.Tensor:  # fmt: skip
    """Power of two s with s·|grad_W| ≤ 2^15 guaranteed (float16 max is 65504), on device.

    |grad_W[v,h]| ≤ max|x| · Σ_n |g_n| · max_v |dlogits_nv / g_n|, and |dL/dz| ≤ 1 + 2·zls·|lse|
    (probabilities ≤ 1, label-smoothing targets ≤ 1, softcap derivative ≤ 1), with
    |lse_n| ≤ max_v |z_nv| + log V ≤ softcap + log V, or ‖x_n‖·max_v‖w_v‖ + max|b| + log V.
    With class weights (max |w_c| = M; the z-loss scaled by gz_n): |dL/dz| ≤ 2·M·|g_n| +
    2·zls·|lse|·|gz_n|. Token scaling multiplies both by a probability ≤ 1.
    """
    valid = (target != ignore_index).float()

    def gsum_of(rs: torch.Tensor) -> torch.Tensor:
        if per_row_scale:
            return (rs.float().abs() * valid).sum()
        return rs.float().abs().reshape(()) * valid.sum()

    gsum = gsum_of(row_scale)
    amax = x.abs().amax().float().clamp_min(1e-30)
    if cew is not None:
        m_w = cew.abs().amax().float()
        gz = gsum_of(zrow_scale if zrow_scale is not None else row_scale)
        bound = amax * (2.0 * m_w * gsum)
        if z_loss_scale != 0.0:
            bound = bound + amax * 2.0 * abs(z_loss_scale) * _lse_bound(x, w, b, softcap) * gz
        return _pow2_scale(bound.clamp_min(1e-30))
    bound = amax * gsum.clamp_min(1e-30)
    if z_loss_scale != 0.0:
        bound = bound * (1.0 + 2.0 * abs(z_loss_scale) * _lse_bound(x, w, b, softcap))
    return _pow2_scale(bound)


def _lse_bound(x, w, b, softcap) -> torch.Tensor:
    """A bound on |lse| of every row (see `_f16_accumulator_scale`)."""
    logv = math.log(w.shape[0])
    if softcap is not None:
        return torch.tensor(abs(softcap) + logv, device=x.device)
    xn = x.float().norm(dim=1).amax()
    wn = torch.stack([c.float().norm(dim=1).amax() for c in w.split(16384)]).amax()
    bm = b.abs().amax().float() if b is not None else 0.0
    return xn * wn + bm + logv


def _pow2_scale(bound: torch.Tensor) -> torch.Tensor:
    return torch.exp2(torch.floor(torch.log2(32768.0 / bound))).clamp(2.0**-120, 2.0**120)


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    except TypeError:  # older torch: no device_type argument
        if device_type == "cuda" and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
    return None


class _FLCEFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x,
        weight,
        target,
        bias,
        ce_weight,
        ignore_index,
        label_smoothing,
        reduction,
        softcap,
        z_loss_scale,
        compute_dtype,
        budget,
        cfg,
        grad_enabled,
        token_scaling,
        want_accuracy,
        accum_f32,
    ):
        dev_type = x.device.type
        with torch.autocast(dev_type, enabled=False):
            # Under autocast the logits GEMM runs in the autocast dtype (like F.linear would) and
            # the logits chunk stays in that 16-bit dtype: an fp32 copy of a chunk would cost
            # rows·V·4 bytes. The CE kernel upcasts each element to float32 in registers, so
            # softmax/lse are float32 anyway. Bias is cast with x and W: no addmm dtype mismatch.
            xc = x.reshape(-1, x.shape[-1]).to(compute_dtype).contiguous()
            tgt = target.reshape(-1).contiguous()
            valid = tgt != ignore_index
            n_valid = valid.sum().to(torch.float32)
            need_gx = grad_enabled and ctx.needs_input_grad[0]
            need_gw = grad_enabled and ctx.needs_input_grad[1]
            need_gb = grad_enabled and bias is not None and ctx.needs_input_grad[3]
            defer = reduction == "none"
            cew = cew_sum = None
            if ce_weight is not None:
                cew = ce_weight.detach().float().contiguous()
                cew_sum = cew.sum().reshape(1)
            if reduction == "mean":
                scale = (1.0 / n_valid.clamp_min(1.0)).reshape(1)
            else:
                scale = torch.ones(1, dtype=torch.float32, device=xc.device)
            zscale = scale
            if cew is not None and reduction == "mean":
                # torch's weighted mean: divide by the sum of the non-ignored targets' weights
                # (0 when that sum is 0: every target ignored or weighted 0); z-loss per row
                wsum = _target_weight_sum(cew, tgt, valid)
                scale = torch.where(wsum != 0, 1.0 / wsum, torch.zeros_like(wsum)).reshape(1)
            plan = plan_schedule(
                xc.shape[0],
                xc.shape[1],
                weight.shape[0],
                xc.element_size(),
                budget,
                schedule=cfg.schedule,
                grads=need_gx or need_gw or need_gb,
                per_row=defer,
                min_cols=cfg.vocab_min_cols,
                flop_per_byte=flop_per_byte(xc.device),
                keep_logits=need_gw and cfg.vocab_keep_logits,
            )
            if plan.schedule == "vocab":
                return _vocab_forward(
                    ctx, x, weight, bias, xc, tgt, valid, n_valid, cew, cew_sum, scale, zscale,
                    reduction=reduction, ignore_index=ignore_index,
                    label_smoothing=label_smoothing, softcap=softcap, z_loss_scale=z_loss_scale,
                    token_scaling=token_scaling, want_accuracy=want_accuracy, cols=plan.cols,
                    cfg=cfg, needs=(need_gx, need_gw, need_gb),
                )  # fmt: skip
            wc = weight.to(compute_dtype).contiguous()
            bc = bias.to(compute_dtype).contiguous() if bias is not None else None
            common = dict(
                ignore_index=ignore_index,
                label_smoothing=label_smoothing,
                z_loss_scale=z_loss_scale,
                softcap=softcap,
                budget=budget,
                cfg=cfg,
                cew=cew,
                cew_sum=cew_sum,
                token_scaling=token_scaling,
                accum_f32=accum_f32,
            )
            loss_rows, zl_rows, _lse, gx, gw, gb, acc_rows = _flce_pass(
                xc,
                wc,
                bc,
                tgt,
                row_scale=scale,
                zrow_scale=zscale,
                per_row_scale=False,
                need_gx=need_gx and not defer,
                need_gw=need_gw and not defer,
                need_gb=need_gb and not defer,
                w_out_dtype=weight.dtype,
                want_accuracy=want_accuracy,
                **common,
            )
            loss, zl, acc = _reduce(
                loss_rows, zl_rows, acc_rows, reduction, n_valid, scale, zscale, cew is not None
            )
        ctx.defer = defer
        ctx.common = common
        ctx.dtypes = (x.dtype, weight.dtype, bias.dtype if bias is not None else None)
        ctx.x_shape = x.shape
        ctx.needs = (need_gx, need_gw, need_gb)
        if defer:
            ctx.save_for_backward(xc, wc, bc, tgt)
        else:
            ctx.saved = (gx, gw, gb)
        # acc stays None unless asked: no extra allocation or launch on the default path
        ctx.mark_non_differentiable(zl, *([acc] if acc is not None else []))
        return loss, zl, acc

    @staticmethod
    def backward(ctx: Any, grad_loss, _grad_zl, _grad_acc):
        x_dt, w_dt, b_dt = ctx.dtypes
        need_gx, need_gw, need_gb = ctx.needs
        if getattr(ctx, "vocab", None) is not None:
            return _vocab_backward(ctx, grad_loss)
        if ctx.defer:
            xc, wc, bc, tgt = ctx.saved_tensors
            with torch.autocast(xc.device.type, enabled=False):
                go = grad_loss.reshape(-1).float().contiguous()
                _l, _z, _s, gx, gw, gb, _a = _flce_pass(
                    xc,
                    wc,
                    bc,
                    tgt,
                    row_scale=go,
                    zrow_scale=go,
                    per_row_scale=True,
                    need_gx=need_gx,
                    need_gw=need_gw,
                    need_gb=need_gb,
                    w_out_dtype=w_dt,
                    **ctx.common,
                )
            factor = None
        else:
            gx, gw, gb = ctx.saved
            ctx.saved = None
            factor = grad_loss.reshape(1).float()
        grad_x = grad_w = grad_b = None
        if need_gx and gx is not None:
            grad_x = gx if factor is None else _scale_(gx, factor, cfg=ctx.common["cfg"])
            grad_x = grad_x.to(x_dt).reshape(ctx.x_shape)
        if need_gw and gw is not None:
            grad_w = gw.finalize(factor, w_dt)
        if need_gb and gb is not None:
            grad_b = (gb if factor is None else gb * factor).to(b_dt)
        # one gradient per forward input: x, weight, target, bias, ce_weight (none: torch's
        # cross_entropy gives class weights no gradient either), then 12 options
        return grad_x, grad_w, None, grad_b, None, *([None] * 12)


def _target_weight_sum(cew: torch.Tensor, tgt: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Σ over non-ignored rows of cew[target], float32 scalar (out-of-range targets, reported
    by the caller, are clamped here to stay in bounds)."""
    idx = torch.where(valid, tgt, torch.zeros_like(tgt)).clamp(0, cew.shape[0] - 1)
    return (cew[idx] * valid).sum()


def _reduce(loss_rows, zl_rows, acc_rows, reduction, n_valid, scale, zscale, weighted):
    """(loss, z_loss, accuracy) of the per-row values, as the reduction asks."""
    if reduction == "none":
        loss, zl = loss_rows, zl_rows
    elif reduction == "sum":
        loss, zl = loss_rows.sum(), zl_rows.sum()
    elif weighted:
        zl = zl_rows.sum() * zscale.reshape(())
        loss = (loss_rows.sum() - zl_rows.sum()) * scale.reshape(()) + zl
    else:
        loss = loss_rows.sum() / n_valid.clamp_min(1.0)
        zl = zl_rows.sum() / n_valid.clamp_min(1.0)
    acc = None
    if acc_rows is not None:
        acc = acc_rows if reduction == "none" else acc_rows.sum() / n_valid.clamp_min(1.0)
    return loss, zl, acc


def _vocab_forward(
    ctx, x, weight, bias, xc, tgt, valid, n_valid, cew, cew_sum, scale, zscale, *, reduction,
    ignore_index, label_smoothing, softcap, z_loss_scale, token_scaling, want_accuracy, cols,
    cfg, needs,
):  # fmt: skip
    """Forward of the vocabulary-panel schedule (`_flce_vocab`): row statistics; every
    gradient is computed in backward, grad_output folded in. Where grad_weight is computed
    (and `cfg.vocab_keep_logits`), its buffer is allocated here and the logits of its first
    columns are left in it for the backward (`_flce_vocab.plan_kept`)."""
    w = weight if weight.is_contiguous() else weight.contiguous()
    b = None if bias is None else bias.contiguous()
    v = w.shape[0]
    keep = None
    if needs[1]:
        kp = plan_kept(xc.shape[0], xc.shape[1], v, xc.dtype, weight.dtype, needs[0], cfg)
        if kp is not None:
            gw = torch.empty((v, xc.shape[1]), dtype=weight.dtype, device=xc.device)
            keep = KeptLogits(gw, *kp)
    stats, sz, idx = vocab_forward(
        xc, w, b, tgt, cols=_forward_cols(xc, w, cols, needs, x.dtype, cfg), softcap=softcap,
        label_smoothing=label_smoothing, cew=cew, want_accuracy=want_accuracy, cfg=cfg,
        keep=keep,
    )  # fmt: skip
    lse, zt = stats.lse, stats.z_t
    eps_v = label_smoothing / v
    w_t = None
    if cew is not None:
        w_t = cew[_safe_targets(tgt, valid, v)]
        loss = (1.0 - label_smoothing) * w_t * (lse - zt)
        if sz is not None:
            loss = loss + eps_v * (cew_sum * lse - sz)
    else:
        loss = lse - (1.0 - label_smoothing) * zt
        if sz is not None:
            loss = loss - eps_v * sz
    zl = z_loss_scale * lse * lse
    if token_scaling:
        p_t = torch.exp(zt - lse)
        loss = loss * p_t
        zl = zl * p_t
    zero = torch.zeros((), dtype=torch.float32, device=xc.device)
    loss_rows = torch.where(valid, loss + zl, zero)
    zl_rows = torch.where(valid, zl, zero)
    acc_rows = None
    if idx is not None:
        acc_rows = (valid & (idx.long() == tgt)).float()
    out = _reduce(loss_rows, zl_rows, acc_rows, reduction, n_valid, scale, zscale, cew is not None)
    ctx.vocab = dict(
        reduction=reduction, label_smoothing=label_smoothing, softcap=softcap,
        z_loss_scale=z_loss_scale, token_scaling=token_scaling, cols=cols, cfg=cfg,
    )  # fmt: skip
    ctx.dtypes = (x.dtype, weight.dtype, bias.dtype if bias is not None else None)
    ctx.x_shape = x.shape
    ctx.needs = needs
    # the kept logits are read once: a second backward (retain_graph) recomputes every panel
    ctx.kept = keep
    if any(needs):
        ctx.save_for_backward(
            xc, w, b, tgt, stats.m, stats.log_s, stats.lse, zt, cew, cew_sum, w_t, scale,
            zscale, valid,
        )  # fmt: skip
    ctx.mark_non_differentiable(out[1], *([out[2]] if out[2] is not None else []))
    return out


def _forward_cols(xc, w, cols, needs, x_dtype, cfg) -> int:
    """Forward panel width: the backward's peak holds the gradients beside its panels, so the
    forward (which holds no gradient yet) may spend the gradients' bytes as well as the budget
    on wider panels without raising the call's peak (under autocast a panel also casts its
    [P, H] weight rows)."""
    need_gx, need_gw, _ = needs
    n, h = xc.shape
    v = w.shape[0]
    cs = xc.element_size()
    grads = (v * h * w.element_size() if need_gw else 0) + (
        n * h * x_dtype.itemsize if need_gx else 0
    )
    per_col = n * cs + (h * cs if w.dtype != xc.dtype else 0)
    wide = min(int(cfg.vocab_forward_max_cols), v, (cols * n * cs + grads) // per_col)
    if wide >= 256:
        wide -= wide % 128
    return max(cols, wide)


def _vocab_backward(ctx, grad_loss):
    """Backward of the vocabulary-panel schedule: each row's dlogits coefficients (as
    `_ce_rows_kernel` computes them) from the saved statistics and grad_output, then the
    panels walked once more."""
    x_dt, w_dt, b_dt = ctx.dtypes
    need_gx, need_gw, need_gb = ctx.needs
    o = ctx.vocab
    (xc, w, b, tgt, m, log_s, lse, zt, cew, cew_sum, w_t, scale, zscale, valid) = ctx.saved_tensors
    kept, ctx.kept = ctx.kept, None
    with torch.autocast(xc.device.type, enabled=False):
        go = grad_loss.float()
        if o["reduction"] == "none":
            rs = zrs = go.reshape(-1)
        else:
            rs = scale.reshape(()) * go.reshape(())
            zrs = zscale.reshape(()) * go.reshape(())
        vf = valid.float()
        g = rs * vf
        gz = zrs * vf
        if o["token_scaling"]:
            p_t = torch.exp(zt - lse)
            g = g * p_t
            gz = gz * p_t
        eps = o["label_smoothing"]
        eps_v = eps / w.shape[0]
        zls = o["z_loss_scale"]
        if cew is not None:
            cg = ((1.0 - eps) * w_t + eps_v * cew_sum) * g + 2.0 * zls * lse * gz
            tg = (1.0 - eps) * w_t * g
        else:
            cg = (1.0 + 2.0 * zls * lse) * g
            tg = (1.0 - eps) * g
        eg = eps_v * g
        coef = tuple(c.float().expand(xc.shape[0]).contiguous() for c in (cg, eg, tg))
        gx, gw, gb = vocab_backward(
            xc, w, b, tgt, VocabStats(m, log_s, lse, zt), coef, cols=o["cols"],
            softcap=o["softcap"], cew=cew, label_smoothing=eps, need_gx=need_gx,
            need_gw=need_gw, need_gb=need_gb, gx_dtype=x_dt, gw_dtype=w_dt, cfg=o["cfg"],
            kept=kept,
        )  # fmt: skip
    grad_x = gx.reshape(ctx.x_shape) if gx is not None else None
    grad_b = gb.to(b_dt) if gb is not None else None
    return grad_x, gw, None, grad_b, None, *([None] * 12)


def _safe_targets(tgt: torch.Tensor, valid: torch.Tensor, v: int) -> torch.Tensor:
    """Targets usable as indices: ignored and out-of-range ones (reported by the caller) -> 0."""
    ok = valid & (tgt >= 0) & (tgt < v)
    return torch.where(ok, tgt, torch.zeros_like(tgt))
