"""kassay's fused linear cross-entropy: forward and backward, chunked over rows, AMP-safe.

Public API: `fused_linear_cross_entropy` and `FusedLinearCrossEntropyLoss`. The Triton kernels are
in `_flce_kernels.py`; this module checks inputs, plans the row chunks from a memory budget, runs
cuBLAS GEMMs (torch.mm) and the Triton kernels, and wraps them in a torch.autograd.Function.

Plan (counted in bench/NOTES-flce.md). For each chunk of `rows` rows:
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

import contextlib
import functools
import math
import os
import warnings
from typing import Any

import torch
import triton
from torch import nn

from kassay.kernels import _flce_kernels as K

__all__ = [
    "DEFAULT_MEMORY_BUDGET_BYTES",
    "FusedLinearCrossEntropyLoss",
    "fused_linear_cross_entropy",
    "plan_rows",
]

#: Default bytes for the transient logits chunk. With the gradients themselves (V·H + N·H
#: elements) this keeps the peak extra memory at N=8192, H=4096, V=128256 bf16 near 1.47 GiB
#: (1792-row chunks; target 1.5) and at N=8192, H=2304, V=256000 at 1.59 GiB (960-row chunks;
#: target 1.6). 470 rather than 448 MiB: the second shape then gets 64-aligned chunks (960
#: rows, not 911), 2.3% faster on the H200 (bench/results/flce-rows-probe-h200-2026-12-02.json).
DEFAULT_MEMORY_BUDGET_BYTES = 470 * 1024 * 1024

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
_REDUCTIONS = ("mean", "sum", "none")
# grad_weight accumulation for 16-bit weights with more than one chunk: "auto" (scaled float16
# for bfloat16, float32 for float16) or "cublas" (addmm_ in the weight dtype: the drifting
# baseline, kept for the benchmark only).
GW_ACCUMULATION = os.environ.get("KASSAY_FLCE_GW", "auto")
# grad_weight GEMM on Hopper-class GPUs: persistent TMA kernel (1) or the plain Triton one (0).
USE_TMA_GEMM = os.environ.get("KASSAY_FLCE_TMA", "1") == "1"
# bfloat16 weights over several chunks: run the last chunk's grad_weight GEMM in backward, where
# grad_output is known, and let it write the finished bfloat16 gradient (no separate conversion
# pass over V·H; the last chunk's dlogits stay allocated until backward).
DEFER_LAST_GW = os.environ.get("KASSAY_FLCE_DEFER", "1") == "1"


def plan_rows(n_rows: int, vocab: int, elem_bytes: int, budget_bytes: int) -> int:
    """Rows per chunk: as few chunks as `budget_bytes` of [rows, vocab] logits allow, each as
    equal as possible, rounded up to a multiple of 256 (else 128, else 64) when that fits the
    budget without adding a chunk. cuBLAS runs the chunk GEMMs faster at such row counts (H200,
    H=4096, V=128256: grad_x 659 TFLOP/s at 1792 rows against 554 at 1664; logits 680 vs 669)."""
    cap = max(1, budget_bytes // max(1, vocab * elem_bytes))
    if cap >= n_rows:
        return n_rows
    n_chunks = -(-n_rows // cap)
    rows = -(-n_rows // n_chunks)
    for align in (256, 128, 64):
        rounded = -(-rows // align) * align
        if rounded <= cap and -(-n_rows // rounded) == n_chunks:
            return min(rounded, n_rows)
    return rows


@contextlib.contextmanager
def _ieee_fp32_matmul(enabled: bool):
    """Full-precision (IEEE, not TF32) cuBLAS float32 GEMMs inside the block."""
    if not enabled or not torch.cuda.is_available():
        yield
        return
    mm = torch.backends.cuda.matmul
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        old = mm.allow_tf32
        mm.allow_tf32 = False
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mm.allow_tf32 = old


def _on_cpu_backend(t: torch.Tensor) -> bool:
    return t.device.type != "cuda"


def _launch_ce(
    z,
    tgt,
    loss,
    zloss,
    lse,
    scale,
    per_row_scale,
    *,
    V,
    ignore_index,
    label_smoothing,
    z_loss_scale,
    softcap,
    compute_grad,
    programs: int | None = None,
    pair: bool | None = None,
    hints: bool | None = None,
):
    """Cross-entropy of a logits chunk z [n, V] (16-bit or float32), dlogits written over it.

    programs: grid size (rows are taken with a grid stride); default from the GPU launch
    configs in `_flce_kernels` (one program per row under the interpreter). pair: two blocks
    per loop step (default `CE_PAIR`); hints: L2 eviction hints (default `CE_L2_HINTS`)."""
    n = z.shape[0]
    if n == 0:
        return
    interp = _INTERPRET or _on_cpu_backend(z)
    if interp:
        block_v, num_warps, per_sm = K.CE_BLOCK_V_INTERP, 4, 0
    elif V >= K.CE_LONG_ROW_V:
        block_v, num_warps, per_sm = K.CE_CONFIG_LONG_GPU
    else:
        block_v, num_warps, per_sm = K.CE_CONFIG_GPU
    block_v = min(block_v, triton.next_power_of_2(V))
    if block_v < 2048:  # short rows: a few warps cover the block
        num_warps = min(num_warps, 4)
    grid = n
    if programs is not None:
        grid = min(n, programs)
    elif per_sm > 0:
        grid = min(n, per_sm * _num_sms(z.device.index or 0))
    K._ce_rows_kernel[(grid,)](
        z,
        z.stride(0),
        tgt,
        loss,
        zloss,
        lse,
        scale,
        1 if per_row_scale else 0,
        V,
        ignore_index,
        float(label_smoothing),
        float(z_loss_scale),
        float(softcap) if softcap is not None else 1.0,
        n,
        grid,
        HAS_SOFTCAP=softcap is not None,
        HAS_LS=label_smoothing != 0.0,
        COMPUTE_GRAD=compute_grad,
        BLOCK_V=block_v,
        PAIR=K.CE_PAIR if pair is None else pair,
        HINTS=K.CE_L2_HINTS if hints is None else hints,
        num_warps=num_warps,
    )


def _tma_ok(*ts: torch.Tensor) -> bool:
    """TMA descriptors need a Hopper-class GPU, unit inner strides and 16-byte aligned rows."""
    if _INTERPRET or not USE_TMA_GEMM or ts[0].device.type != "cuda":
        return False
    if any(t.element_size() != 2 for t in ts):  # 16-bit operands and accumulator only
        return False
    if torch.cuda.get_device_capability(ts[0].device)[0] < 9:
        return False
    return all(
        t.dim() == 2
        and t.stride(1) == 1
        and t.data_ptr() % 16 == 0
        and (t.stride(0) * t.element_size()) % 16 == 0
        for t in ts
    )


@functools.lru_cache(maxsize=8)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _launch_gemm_tn(a, b, c, scale, accumulate, out=None, fin=None):
    """c (+)= scale * a^T @ b ; a [K, M], b [K, N], c [M, N].

    With `out` (same shape and strides as c, may alias it) and `fin` (float32 [1]) the result
    (c + scale * a^T b) * fin is written to out instead of c: the last chunk's GEMM also
    finalises the gradient, saving a separate pass over it."""
    k_dim, m = a.shape
    n = b.shape[1]
    final = out is not None
    if not final:
        out, fin = c, scale
    if _tma_ok(a, b, c, out):
        from triton.tools.tensor_descriptor import TensorDescriptor

        loads_c = final or (accumulate and not K.GEMM_TMA_REDUCE)
        cfg = K.GEMM_TMA_RMW_CONFIG_GPU if loads_c else K.GEMM_TMA_CONFIG_GPU
        bm, bn, bk, gm, warps, stages, split, ctas = cfg
        sms = _num_sms(a.device.index or 0) * ctas
        eb = [bm, bn // split]
        K._gemm_tn_acc_tma_kernel[(min(sms, triton.cdiv(m, bm) * triton.cdiv(n, bn)),)](
            TensorDescriptor.from_tensor(a, [bk, bm]),
            TensorDescriptor.from_tensor(b, [bk, bn]),
            TensorDescriptor.from_tensor(c, eb),
            TensorDescriptor.from_tensor(out, eb),
            scale,
            fin,
            m,
            n,
            k_dim,
            ACCUMULATE=accumulate,
            FINAL=final,
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=bk,
            GROUP_M=gm,
            EPI_SPLIT=split,
            NUM_SMS=sms,
            REDUCE=K.GEMM_TMA_REDUCE,
            num_warps=warps,
            num_stages=stages,
        )
        return
    interp = _INTERPRET or _on_cpu_backend(a)
    bm, bn, bk, gm, warps, stages = K.GEMM_CONFIG_INTERP if interp else K.GEMM_CONFIG_GPU
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    K._gemm_tn_acc_kernel[grid](
        a,
        b,
        c,
        scale,
        m,
        n,
        k_dim,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        c.stride(0),
        c.stride(1),
        out,
        fin,
        ACCUMULATE=accumulate,
        FINAL=final,
        IEEE=a.dtype == torch.float32,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=gm,
        num_warps=warps,
        num_stages=stages,
    )


def _grads_fused_ok(z, w, gx, xc, acc) -> bool:
    """Whether `_launch_grads` should run this chunk's grad_x and grad_W GEMMs as one kernel:
    Hopper TMA operands, and a grad_x tile count whose last wave leaves SMs idle (at least one
    full wave, the last one at most `GRADS_FUSED_MAX_LAST_WAVE` full)."""
    # the fused kernel's shared memory has no room for a load-add-store epilogue's C tile
    if not (K.GRADS_FUSED and K.GEMM_TMA_REDUCE) or not _tma_ok(z, w, gx, xc, acc):
        return False
    bm, bn = K.GRADS_FUSED_CONFIG_GPU[:2]
    tiles = triton.cdiv(z.shape[0], bm) * triton.cdiv(w.shape[1], bn)
    sms = _num_sms(z.device.index or 0)
    last = tiles % sms
    return tiles >= sms and 0 < last <= K.GRADS_FUSED_MAX_LAST_WAVE * sms


def _launch_grads(z, w, gx, xc, acc, scale, accumulate: bool) -> None:
    """gx = z @ w and acc (+)= scale * z^T @ xc in one `_grads_tma_kernel` launch.

    z [rows, V] dlogits, w [V, H], gx [rows, H] and xc [rows, H] 16-bit, acc [V, H] float16,
    scale float32 [1]; callers check `_grads_fused_ok` first."""
    from triton.tools.tensor_descriptor import TensorDescriptor as TD

    rows, v = z.shape
    h = w.shape[1]
    bm, bn, bk, gm, warps, stages = K.GRADS_FUSED_CONFIG_GPU
    sms = _num_sms(z.device.index or 0)
    K._grads_tma_kernel[(sms,)](
        TD.from_tensor(z, [bm, bk]),
        TD.from_tensor(w, [bk, bn]),
        TD.from_tensor(gx, [bm, bn]),
        TD.from_tensor(z, [bk, bm]),
        TD.from_tensor(xc, [bk, bn]),
        TD.from_tensor(acc, [bm, bn // 2]),
        scale,
        rows,
        h,
        v,
        ACCUMULATE=accumulate,
        REDUCE=K.GEMM_TMA_REDUCE,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=gm,
        NUM_SMS=sms,
        num_warps=warps,
        num_stages=stages,
    )


def _scale_(t: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """t *= factor in place (t any shape, factor float32 [1]); returns t.

    On CUDA a 16-bit t goes through `_finalize_kernel` (vectorised, product in float32, one
    rounding): torch's `mul_` of a 16-bit tensor by a float32 tensor takes its unvectorised
    mixed-dtype path (0.15 ms for the 8192 x 4096 grad_x on the H200, ~4x the traffic floor)."""
    if t.device.type == "cuda" and t.element_size() == 2 and t.is_contiguous():
        _launch_finalize(t, t, factor.reshape(1).float().contiguous())
        return t
    return t.mul_(factor)


def _launch_finalize(c, out, factor):
    n = c.numel()
    interp = _INTERPRET or _on_cpu_backend(c)
    block = K.FIN_BLOCK_INTERP if interp else K.FIN_BLOCK_GPU
    K._finalize_kernel[(triton.cdiv(n, block),)](
        c, out, n, factor, BLOCK=block, num_warps=4 if interp else 8
    )


class _GradW:
    """The grad_weight accumulator of one pass and how to turn it into the final gradient.

    mode "direct": one chunk, computed by cuBLAS in the weight dtype (one rounding, as eager).
    mode "f32":    float32 accumulator (float32 weights, AMP with float32 weights, float16
                   weights with several chunks).
    mode "f16s":   float16 accumulator holding s·grad_W, s a power of two (bfloat16 weights with
                   several chunks); converted in place to bfloat16.
    mode "cublas": addmm_ in the weight dtype over the chunks (drifts; benchmark only).
    """

    def __init__(self, mode: str, acc: torch.Tensor, scale: torch.Tensor):
        self.mode = mode
        self.acc = acc
        self.scale = scale  # float32 [1]: the accumulator holds scale * grad_W
        self.inv_scale = 1.0 / scale
        # "f16s": (dlogits, x) of the last chunk, whose GEMM is run by finalize (DEFER_LAST_GW)
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
                _launch_gemm_tn(z, xc, acc, self.scale, accumulate=True, out=out, fin=fin)
            else:
                _launch_finalize(acc, out, fin)
            return out
        if acc.dtype == out_dtype:
            if factor is not None:
                _scale_(acc, f.to(acc.dtype) if acc.dtype == torch.float64 else f)
            return acc
        return (acc.float() * f).to(out_dtype) if factor is not None else acc.to(out_dtype)


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
):
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
    grad_x = torch.empty((n, h), dtype=cdt, device=dev) if need_gx else None
    grad_b = torch.zeros(v, dtype=torch.float32, device=dev) if need_gb else None

    gw: _GradW | None = None
    one = torch.ones(1, dtype=torch.float32, device=dev)
    if need_gw:
        if cdt == torch.float32:
            gw = _GradW("f32", torch.empty((v, h), dtype=cdt, device=dev), one)
        elif n_chunks == 1 and w_out_dtype == cdt:
            gw = _GradW("direct", torch.empty((v, h), dtype=cdt, device=dev), one)
        elif w_out_dtype == cdt and GW_ACCUMULATION == "cublas":
            gw = _GradW("cublas", torch.empty((v, h), dtype=cdt, device=dev), one)
        elif w_out_dtype == torch.bfloat16 and cdt == torch.bfloat16:
            s = _f16_accumulator_scale(
                x, w, b, target, ignore_index, z_loss_scale, softcap, row_scale, per_row_scale
            )
            gw = _GradW(
                "f16s", torch.empty((v, h), dtype=torch.float16, device=dev), s.reshape(1).float()
            )
        else:
            gw = _GradW("f32", torch.empty((v, h), dtype=torch.float32, device=dev), one)

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
            )
            if not compute_grad:
                continue
            if grad_b is not None:
                grad_b += z.sum(0, dtype=torch.float32)
            gx = grad_x[r0:r1] if grad_x is not None else None
            f16s = gw is not None and gw.mode == "f16s"
            deferred = f16s and DEFER_LAST_GW and i > 0 and r1 == n
            if gx is not None and f16s and not deferred and _grads_fused_ok(z, w, gx, xc, gw.acc):
                _launch_grads(z, w, gx, xc, gw.acc, gw.scale, accumulate=i > 0)
                continue
            if gx is not None:
                torch.mm(z, w, out=gx)
            if gw is not None:
                if deferred:
                    gw.pending = (z, xc)  # run by gw.finalize (backward): fused conversion
                else:
                    _accumulate_gw(gw, z, xc, first=i == 0)
    del zbuf
    return loss_rows, zloss_rows, lse_rows, grad_x, gw, grad_b


def _accumulate_gw(gw: _GradW, z: torch.Tensor, xc: torch.Tensor, first: bool) -> None:
    if gw.mode in ("direct", "cublas") or (gw.mode == "f32" and z.dtype == gw.acc.dtype):
        if first:
            torch.mm(z.t(), xc, out=gw.acc)
        else:
            gw.acc.addmm_(z.t(), xc)
    else:  # "f16s", or a float32 accumulator with 16-bit operands
        _launch_gemm_tn(z, xc, gw.acc, gw.scale, accumulate=not first)


def _f16_accumulator_scale(
    x, w, b, target, ignore_index, z_loss_scale, softcap, row_scale, per_row_scale
) -> torch.Tensor:
    """Power of two s with s·|grad_W| ≤ 2^15 guaranteed (float16 max is 65504), on device.

    |grad_W[v,h]| ≤ max|x| · Σ_n |g_n| · max_v |dlogits_nv / g_n|, and |dL/dz| ≤ 1 + 2·zls·|lse|
    (probabilities ≤ 1, label-smoothing targets ≤ 1, softcap derivative ≤ 1), with
    |lse_n| ≤ max_v |z_nv| + log V ≤ softcap + log V, or ‖x_n‖·max_v‖w_v‖ + max|b| + log V.
    """
    valid = (target != ignore_index).float()
    if per_row_scale:
        gsum = (row_scale.float().abs() * valid).sum()
    else:
        gsum = row_scale.float().abs().reshape(()) * valid.sum()
    amax = x.abs().amax().float().clamp_min(1e-30)
    bound = amax * gsum.clamp_min(1e-30)
    if z_loss_scale != 0.0:
        logv = math.log(w.shape[0])
        if softcap is not None:
            lmax = torch.tensor(abs(softcap) + logv, device=x.device)
        else:
            xn = x.float().norm(dim=1).amax()
            wn = torch.stack([c.float().norm(dim=1).amax() for c in w.split(16384)]).amax()
            bm = b.abs().amax().float() if b is not None else 0.0
            lmax = xn * wn + bm + logv
        bound = bound * (1.0 + 2.0 * abs(z_loss_scale) * lmax)
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
        ignore_index,
        label_smoothing,
        reduction,
        softcap,
        z_loss_scale,
        compute_dtype,
        budget,
        grad_enabled,
    ):
        dev_type = x.device.type
        with torch.autocast(dev_type, enabled=False):
            # Under autocast the logits GEMM runs in the autocast dtype (like F.linear would) and
            # the logits chunk stays in that 16-bit dtype: an fp32 copy of a chunk would cost
            # rows·V·4 bytes. The CE kernel upcasts each element to float32 in registers, so
            # softmax/lse are float32 anyway. Bias is cast with x and W: no addmm dtype mismatch.
            xc = x.reshape(-1, x.shape[-1]).to(compute_dtype).contiguous()
            wc = weight.to(compute_dtype).contiguous()
            bc = bias.to(compute_dtype).contiguous() if bias is not None else None
            tgt = target.reshape(-1).contiguous()
            valid = tgt != ignore_index
            n_valid = valid.sum().to(torch.float32)
            need_gx = grad_enabled and ctx.needs_input_grad[0]
            need_gw = grad_enabled and ctx.needs_input_grad[1]
            need_gb = grad_enabled and bias is not None and ctx.needs_input_grad[3]
            defer = reduction == "none"
            if reduction == "mean":
                scale = (1.0 / n_valid.clamp_min(1.0)).reshape(1)
            else:
                scale = torch.ones(1, dtype=torch.float32, device=xc.device)
            common = dict(
                ignore_index=ignore_index,
                label_smoothing=label_smoothing,
                z_loss_scale=z_loss_scale,
                softcap=softcap,
                budget=budget,
            )
            loss_rows, zl_rows, _lse, gx, gw, gb = _flce_pass(
                xc,
                wc,
                bc,
                tgt,
                row_scale=scale,
                per_row_scale=False,
                need_gx=need_gx and not defer,
                need_gw=need_gw and not defer,
                need_gb=need_gb and not defer,
                w_out_dtype=weight.dtype,
                **common,
            )
            if reduction == "none":
                loss, zl = loss_rows, zl_rows
            elif reduction == "sum":
                loss, zl = loss_rows.sum(), zl_rows.sum()
            else:
                loss = loss_rows.sum() / n_valid.clamp_min(1.0)
                zl = zl_rows.sum() / n_valid.clamp_min(1.0)
        ctx.defer = defer
        ctx.common = common
        ctx.dtypes = (x.dtype, weight.dtype, bias.dtype if bias is not None else None)
        ctx.x_shape = x.shape
        ctx.needs = (need_gx, need_gw, need_gb)
        if defer:
            ctx.save_for_backward(xc, wc, bc, tgt)
        else:
            ctx.saved = (gx, gw, gb)
        ctx.mark_non_differentiable(zl)
        return loss, zl

    @staticmethod
    def backward(ctx: Any, grad_loss, _grad_zl):
        x_dt, w_dt, b_dt = ctx.dtypes
        need_gx, need_gw, need_gb = ctx.needs
        if ctx.defer:
            xc, wc, bc, tgt = ctx.saved_tensors
            with torch.autocast(xc.device.type, enabled=False):
                go = grad_loss.reshape(-1).float().contiguous()
                _l, _z, _s, gx, gw, gb = _flce_pass(
                    xc,
                    wc,
                    bc,
                    tgt,
                    row_scale=go,
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
            grad_x = gx if factor is None else _scale_(gx, factor)
            grad_x = grad_x.to(x_dt).reshape(ctx.x_shape)
        if need_gw and gw is not None:
            grad_w = gw.finalize(factor, w_dt)
        if need_gb and gb is not None:
            grad_b = (gb if factor is None else gb * factor).to(b_dt)
        return grad_x, grad_w, None, grad_b, None, None, None, None, None, None, None, None


_MAX_VOCAB = 2**31 - 2**16


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
    for name, t in (("weight", weight), ("target", target), ("bias", bias)):
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
    if memory_budget_bytes is not None and int(memory_budget_bytes) < 1:
        raise ValueError(f"memory_budget_bytes must be positive, got {memory_budget_bytes}")
    if x.device.type != "cuda" and not _INTERPRET:
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
        bad = (((target < 0) & (target != ignore_index)) | (target >= v)).any()
        self.event: torch.cuda.Event | None = None
        if target.device.type == "cuda":
            self.flag = torch.empty((), dtype=torch.bool, pin_memory=True)
            self.flag.copy_(bad, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record(torch.cuda.current_stream(target.device))
        else:
            self.flag = bad
            self.raise_if_bad()  # host tensors: no queue to keep busy, fail before any work

    def raise_if_bad(self) -> None:
        if self.event is not None:
            self.event.synchronize()
        if bool(self.flag):
            raise ValueError(self.message)


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
    memory_budget_bytes: int | None = None,
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
        memory_budget_bytes: bytes for the transient logits chunk (rows·V·itemsize); default
            `DEFAULT_MEMORY_BUDGET_BYTES` (470 MiB). More bytes: fewer, larger chunks.

    Returns:
        loss, or (loss, z_loss) when return_z_loss. Both float32 whatever the input dtype:
        scalars for mean/sum, [N] for none. z_loss is for logging (no gradient flows from it;
        its contribution is already inside loss).

    Semantics, with z = x @ weight^T + bias in the compute dtype, zc = softcap·tanh(z/softcap)
    (or z), lse_n = log Σ_v exp(zc_nv) (natural log, float32), for non-ignored rows:
        loss_n = lse_n - (1-ε)·zc_n,t_n - (ε/V)·Σ_v zc_nv + z_loss_scale·lse_n²
    which equals F.cross_entropy(zc, target, ignore_index=..., label_smoothing=ε,
    reduction="none") + z_loss_scale·lse². Ignored rows give 0. "mean" divides the sum by the
    number of non-ignored rows (every target ignored: loss 0 and zero gradients, never NaN);
    z_loss = Σ_n z_loss_scale·lse_n² reduced the same way.

    Gradients: grad_x [N, H] in x.dtype, grad_weight [V, H] in weight.dtype, grad_bias [V] in
    bias.dtype. Softmax, lse and dloss/dlogits are float32; GEMMs accumulate in float32; float32
    inputs use IEEE (not TF32) GEMMs. For mean/sum the gradients are computed in forward and
    scaled by grad_output in backward; for "none" the backward recomputes the pass with each
    row's grad_output folded in (exact per-row scaling, 8·N·H·V FLOP in all).

    Autocast: under torch.autocast (cuda or cpu, float16/bfloat16) float32 x/weight/bias are
    cast to the autocast dtype for the GEMMs (bias too, so no addmm dtype mismatch), the logits
    chunk stays 16-bit, and gradients come back in the parameters' dtypes (grad_weight is then
    accumulated in float32 directly).
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
    budget = (
        DEFAULT_MEMORY_BUDGET_BYTES if memory_budget_bytes is None else int(memory_budget_bytes)
    )
    loss, zl = _FLCEFunction.apply(
        x,
        weight,
        target.long(),
        bias,
        int(ignore_index),
        float(label_smoothing),
        reduction,
        None if softcap is None else float(softcap),
        float(z_loss_scale),
        compute_dtype,
        budget,
        torch.is_grad_enabled(),
    )
    target_check.raise_if_bad()
    return (loss, zl) if return_z_loss else loss


class FusedLinearCrossEntropyLoss(nn.Module):
    """Module form of `fused_linear_cross_entropy` (same options, same semantics).

    forward(x [N, H], weight [V, H], target [N] int64, bias [V] | None = None) -> loss, or
    (loss, z_loss) when return_z_loss.
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
        memory_budget_bytes: int | None = None,
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
        )

    def extra_repr(self) -> str:
        return (
            f"reduction={self.reduction!r}, ignore_index={self.ignore_index}, "
            f"label_smoothing={self.label_smoothing}, softcap={self.softcap}, "
            f"z_loss_scale={self.z_loss_scale}"
        )
