"""The vocabulary-panel schedule of kassay's fused linear cross-entropy (the low-memory end).

The row schedule (`_flce_autograd._flce_pass`) keeps a [rows, V] logits chunk and accumulates
grad_weight over the row chunks: every chunk reads and writes the whole grad_weight, and at a
few hundred rows per chunk that traffic, not the GEMMs, is the time. This schedule cuts the
vocabulary instead, into panels of P columns, and keeps no logits between the passes:

  forward    for each panel: z = x @ W_p^T (+ b_p) (cuBLAS, into one reused [N, P] buffer), then
             `_panel_stats_kernel` merges the panel's row max / sum of exp / (weighted) sum of
             logits / target logit / argmax into per-row float32 state. 2·N·H·V FLOP.
  backward   for each panel, grad_output known: the logits again, `_panel_grad_kernel` turns
             them into dlogits in place, then
               grad_W[p] = dlogits^T @ x      every row at once: one GEMM, one rounding, no
                                              accumulation over chunks (eager's error)
               grad_b[p] = column sums        float32, once
               grad_x   += dlogits @ W_p      into a float32 accumulator [N, H]
             6·N·H·V FLOP, plus 2·N·H·R for the tail below.

Memory beyond the inputs and gradients is the panel buffer (N·P·itemsize) and a few [N] vectors.
The float32 grad_x accumulator (N·H·4 bytes, 128 MiB at N=8192, H=4096) would otherwise double
that at the low end, so when grad_weight is computed it lives in grad_weight's own last R rows
(R·H·itemsize >= N·H·4), which no panel has written yet: the panels before them are walked
first; then the tail's panels contribute their grad_x (no grad_W), grad_x is rounded out of the
accumulator, and the tail's panels are walked once more for their grad_W (their logits
recomputed: 2·N·H·R FLOP more, R = 2N rows for 16-bit weights, 3.2% at N=8192, V=128256).

Panels wider than the budget pays for. A panel of P columns costs N·P·itemsize bytes, and
narrow panels are slow (a [N, 64] panel's GEMMs run far below the GPU's peak). In backward,
grad_weight's unwritten rows are free memory: the panels are walked at `cfg.vocab_inplace_cols`
columns (capped so their scratch takes at most N/2 rows of grad_weight), each held in the S rows
just before the accumulator's R rows; once grad_x is finished, the rows from the scratch on are
walked with the scratch at the very end, the panels narrowing as the rows left shrink, and only
the last few rows use the budget's own [N, P] buffer. The forward has no gradient rows to
borrow, but no gradient exists yet either, and the budget counts bytes beyond the gradients: its
panels may spend the gradients' bytes as well as the budget (`_flce_autograd._forward_cols`,
capped at `cfg.vocab_forward_max_cols`, 128 MiB of bf16 panel at N=8192) without raising the
call's peak, which is the backward's (gradients + budget). A caller whose gradients already
exist (gradient accumulation) still gets a new gradient from autograd before it is added, so
that peak holds there too.

Gradients are computed in backward with grad_output folded into each row's coefficients, so
reduction='none' costs no second pass here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from kassay.kernels import _flce_kernels as K
from kassay.kernels._flce_launch import (
    INTERPRETED,
    _ieee_fp32_matmul,
    _launch_finalize,
    _launch_gemm_tn,
    _num_sms,
)
from kassay.kernels.flce_config import FlceConfig

LOG2E = 1.4426950408889634


@dataclass
class VocabStats:
    """Per-row float32 state the forward leaves for the backward ([N] each).

    m: row max of the (softcapped) logits; log_s: log Σ exp(z - m); lse = m + log_s;
    z_t: the target's logit (0 for ignored rows); p_t: exp(z_t - lse) (token scaling)."""

    m: torch.Tensor
    log_s: torch.Tensor
    lse: torch.Tensor
    z_t: torch.Tensor


def _panel_launch(z: torch.Tensor, cfg: FlceConfig) -> tuple[int, int, int]:
    """(grid, BLOCK_V, num_warps) of the panel kernels for a [rows, P] panel."""
    rows, p = z.shape
    if INTERPRETED or z.device.type != "cuda":
        return rows, min(cfg.ce_block_v_interp, triton.next_power_of_2(p)), 4
    block_v, warps, _ = cfg.vocab_ce_config_gpu
    block_v = min(block_v, triton.next_power_of_2(p))
    if block_v < 2048:
        warps = min(warps, 4)
    return min(rows, 8 * _num_sms(z.device.index or 0)), block_v, warps


def _w_panel(w: torch.Tensor, v0: int, v1: int, cdt: torch.dtype) -> torch.Tensor:
    """W[v0:v1] in the compute dtype (under autocast the float32 weights are cast a panel at a
    time, never copied whole)."""
    wp = w[v0:v1]
    return wp if wp.dtype == cdt else wp.to(cdt)


def _logits(z, xc, wp, b, v0, v1, cdt) -> None:
    """z [N, P] = x @ W_p^T (+ b[v0:v1]) in the compute dtype."""
    if b is not None:
        bp = b[v0:v1]
        torch.addmm(bp if bp.dtype == cdt else bp.to(cdt), xc, wp.t(), out=z)
    else:
        torch.mm(xc, wp.t(), out=z)


def _panel(zbuf: torch.Tensor, n: int, p: int) -> torch.Tensor:
    """A contiguous [n, p] view of the panel buffer."""
    return zbuf[: n * p].view(n, p)


def vocab_forward(
    xc: torch.Tensor,  # [N, H] compute dtype, contiguous
    w: torch.Tensor,  # [V, H] weight (any float dtype: cast per panel)
    b: torch.Tensor | None,  # [V]
    tgt: torch.Tensor,  # [N] int64
    *,
    cols: int,
    softcap: float | None,
    label_smoothing: float,
    cew: torch.Tensor | None,  # [V] float32 class weights
    want_accuracy: bool,
    cfg: FlceConfig,
) -> tuple[VocabStats, torch.Tensor | None, torch.Tensor | None]:
    """Row statistics over every panel: (stats, Σ (weighted) logits or None, argmax or None)."""
    n = xc.shape[0]
    v = w.shape[0]
    dev = xc.device
    cdt = xc.dtype
    f32 = torch.float32
    has_ls = label_smoothing != 0.0
    m = torch.empty(n, dtype=f32, device=dev)
    s = torch.empty(n, dtype=f32, device=dev)
    sz = torch.empty(n, dtype=f32, device=dev) if has_ls else None
    zt = torch.zeros(n, dtype=f32, device=dev)
    idx = torch.empty(n, dtype=torch.int32, device=dev) if want_accuracy else None
    zbuf = torch.empty(n * min(cols, v), dtype=cdt, device=dev)
    with _ieee_fp32_matmul(cdt == f32):
        for v0 in range(0, v, cols):
            v1 = min(v, v0 + cols)
            z = _panel(zbuf, n, v1 - v0)
            _logits(z, xc, _w_panel(w, v0, v1, cdt), b, v0, v1, cdt)
            grid, block_v, warps = _panel_launch(z, cfg)
            K._panel_stats_kernel[(grid,)](
                z,
                z.stride(0),
                tgt,
                m,
                s,
                sz,
                zt,
                idx,
                cew[v0:v1] if (cew is not None and has_ls) else None,
                v1 - v0,
                v0,
                float(softcap) if softcap is not None else 1.0,
                n,
                grid,
                HAS_SOFTCAP=softcap is not None,
                HAS_LS=has_ls,
                LSW=has_ls and cew is not None,
                ACCURACY=want_accuracy,
                FIRST=v0 == 0,
                BLOCK_V=block_v,
                PAIR=cfg.ce_pair,
                num_warps=warps,
            )
    del zbuf
    log_s = torch.log(s)
    return VocabStats(m, log_s, m + log_s, zt), sz, idx


def tail_rows(n: int, h: int, v: int, cols: int, gw_dtype: torch.dtype) -> int:
    """Rows R of grad_weight that hold the float32 grad_x accumulator (0: it is allocated on its
    own, when grad_weight has no room for it before its last panel)."""
    es = gw_dtype.itemsize
    r = -(-4 * n // es)
    if ((v - r) * h * es) % 4:  # the float32 view must start 4-byte aligned
        r += 1
    return r if v - r >= 1 else 0


def scratch_rows(n: int, h: int, cols: int, cdt: torch.dtype, gw_dtype: torch.dtype) -> int:
    """Rows of grad_weight whose bytes hold one [N, cols] panel in the compute dtype."""
    es = gw_dtype.itemsize
    cs = cdt.itemsize
    return -(-n * cols * cs // (h * es))


def _rows_as(gw: torch.Tensor, row: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """The bytes of grad_weight rows [row, ...) as `count` elements of `dtype` (flat)."""
    h = gw.shape[1]
    flat = gw.view(-1)[row * h :]
    if flat.dtype != dtype:
        flat = flat.view(torch.uint8).view(dtype)
    return flat[:count]


def vocab_backward(
    xc: torch.Tensor,  # [N, H] compute dtype
    w: torch.Tensor,  # [V, H] weight (cast per panel)
    b: torch.Tensor | None,
    tgt: torch.Tensor,
    stats: VocabStats,
    coef: tuple[torch.Tensor, torch.Tensor, torch.Tensor],  # cg, eg, tg: [N] float32
    *,
    cols: int,
    softcap: float | None,
    cew: torch.Tensor | None,
    label_smoothing: float,
    need_gx: bool,
    need_gw: bool,
    need_gb: bool,
    gx_dtype: torch.dtype,
    gw_dtype: torch.dtype,
    cfg: FlceConfig,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(grad_x in gx_dtype, grad_W in gw_dtype, grad_b float32) of every panel, grad_output
    already folded into `coef`. See the module docstring for the order of the panels.

    `cols` is the panel width the budget pays for (a buffer of its own). Where grad_weight is
    computed, wider panels (`cfg.vocab_inplace_cols`, capped so the panel fits N/2 rows of
    grad_weight) are walked in grad_weight's own unwritten rows instead: the panel buffer then
    costs nothing, and the budget's buffer is only allocated for the last few rows."""
    n, h = xc.shape
    v = w.shape[0]
    dev = xc.device
    cdt = xc.dtype
    f32 = torch.float32
    cg, eg, tg = coef
    exact = cdt == f32
    lse2 = stats.m if exact else stats.lse * LOG2E
    lsw = label_smoothing != 0.0 and cew is not None
    gw = torch.empty((v, h), dtype=gw_dtype, device=dev) if need_gw else None
    gb = torch.empty(v, dtype=f32, device=dev) if need_gb else None
    gx = None
    acc = None
    r = 0
    if need_gx:
        r = tail_rows(n, h, v, cols, gw_dtype) if gw is not None else 0
        if r:
            acc = gw.view(-1)[(v - r) * h :].view(f32)[: n * h].view(n, h)
        else:
            acc = torch.empty((n, h), dtype=f32, device=dev)
    one = torch.ones(1, dtype=f32, device=dev)
    own: list[torch.Tensor] = []  # the budget's panel buffer, allocated when first needed
    seen = [False]  # whether the accumulator holds a panel yet (the first one stores)

    def buffer(p: int, row: int | None) -> torch.Tensor:
        """The [N, p] panel: in grad_weight's rows from `row`, else the budget's buffer."""
        if row is not None and gw is not None:
            return _rows_as(gw, row, n * p, cdt).view(n, p)
        if not own:
            own.append(torch.empty(n * min(cols, v), dtype=cdt, device=dev))
        return _panel(own[0], n, p)

    def walk(lo, hi, c, row, do_gx: bool, do_gw: bool, do_gb: bool) -> None:
        for v0 in range(lo, hi, c):
            v1 = min(hi, v0 + c)
            z = buffer(v1 - v0, row)
            wp = _w_panel(w, v0, v1, cdt)
            _logits(z, xc, wp, b, v0, v1, cdt)
            grid, block_v, warps = _panel_launch(z, cfg)
            K._panel_grad_kernel[(grid,)](
                z,
                z.stride(0),
                tgt,
                lse2,
                stats.log_s,
                cg,
                eg,
                tg,
                cew[v0:v1] if lsw else None,
                v1 - v0,
                v0,
                float(softcap) if softcap is not None else 1.0,
                n,
                grid,
                HAS_SOFTCAP=softcap is not None,
                LSW=lsw,
                BLOCK_V=block_v,
                PAIR=cfg.ce_pair,
                num_warps=warps,
            )
            if do_gb and gb is not None:
                gb[v0:v1] = z.sum(0, dtype=f32)
            if do_gw and gw is not None:
                out = gw[v0:v1]
                if gw_dtype == cdt:
                    torch.mm(z.t(), xc, out=out)  # every row in one GEMM: one rounding
                else:  # autocast with float32 weights: float32 out of 16-bit operands
                    _launch_gemm_tn(z, xc, out, one, accumulate=False, cfg=cfg)
            if do_gx and acc is not None:
                # acc [N, H] (+)= z @ W_p, written as (z^T)^T @ W_p for the TN kernel
                _launch_gemm_tn(z.t(), wp, acc, one, accumulate=seen[0], cfg=cfg)
                seen[0] = True

    def finish_gx() -> None:
        nonlocal gx
        if acc is None:
            return
        gx = torch.empty((n, h), dtype=gx_dtype, device=dev)
        if acc.device.type == "cuda" or INTERPRETED:
            _launch_finalize(acc, gx, one, cfg=cfg)
        else:
            gx.copy_(acc)

    wide = inplace_cols(n, h, v, cols, r, cdt, gw_dtype, cfg) if gw is not None else 0
    with _ieee_fp32_matmul(exact):
        if not wide:
            walk(0, v - r, cols, None, True, True, True)
            if r:
                walk(v - r, v, cols, None, True, False, True)
            finish_gx()
            if r:
                walk(v - r, v, cols, None, False, True, False)
            return gx, gw, gb
        # the wide panel lives in the S rows just before the accumulator's R rows
        lo = v - r - scratch_rows(n, h, wide, cdt, gw_dtype)
        walk(0, lo, wide, lo, True, True, True)
        split = acc is not None  # the rows from lo on: grad_x (and grad_b) first, then grad_W
        if split:
            walk(lo, v, wide, lo, True, False, True)  # no grad_W written: the scratch stays
        finish_gx()
        # the rows [lo, V) are all unwritten now: their panels take the scratch at the very
        # end, narrowing as the rows left shrink (a panel and its scratch must both fit)
        q, c = lo, wide
        while q < v:
            top = v - scratch_rows(n, h, c, cdt, gw_dtype)
            if q + c <= top:
                end = q + (top - q) // c * c
                walk(q, end, c, top, False, True, not split)
                q = end
                continue
            c = _fitting_cols(v - q, n, h, cdt, gw_dtype)
            if c < max(cols, cfg.vocab_min_cols):
                break
        if q < v:
            walk(q, v, cols, None, False, True, not split)
    return gx, gw, gb


def inplace_cols(
    n: int, h: int, v: int, cols: int, r: int, cdt: torch.dtype, gw_dtype: torch.dtype, cfg
) -> int:
    """Width of the panels walked in grad_weight's unwritten rows, or 0 when the budget's own
    panels are as wide or grad_weight has no room (its scratch and the accumulator's R rows
    must leave at least one panel before them). Capped so that the scratch takes at most N/2
    rows: the rows from the scratch on are walked twice (their logits recomputed once more)."""
    es = gw_dtype.itemsize
    cs = cdt.itemsize
    c = min(int(cfg.vocab_inplace_cols), v, max(1, (h * es) // (2 * cs)))
    if c >= 256:
        c -= c % 128
    if c <= cols or v - r - scratch_rows(n, h, c, cdt, gw_dtype) < c:
        return 0
    return c


def _fitting_cols(q: int, n: int, h: int, cdt: torch.dtype, gw_dtype: torch.dtype) -> int:
    """The widest panel c with c + scratch_rows(c) <= q."""
    es = gw_dtype.itemsize
    cs = cdt.itemsize
    c = (q * h * es) // (h * es + n * cs)
    while c > 0 and c + scratch_rows(n, h, c, cdt, gw_dtype) > q:
        c -= 1
    return c
