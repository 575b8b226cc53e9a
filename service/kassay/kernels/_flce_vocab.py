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

Kept logits. Where grad_weight is computed, the forward allocates its buffer (it is held to the
backward, as the row schedule holds its gradients) and computes the logits of the first K
columns straight into its rows from K on, leaving them there (`plan_kept`); the backward walks
those panels first, reading their logits instead of recomputing them, and writes their grad_W
rows [0, K), which hold nothing. A kept column costs H + N rows of 16-bit grad_weight (its own
row and its logits), so K ~ (V - 2N)·H/(H + N): 29% of the columns at N=8192, H=4096,
V=128256, 20% at H=2304, V=256000, each 2·N·H FLOP fewer. The forward's other panels share
one buffer in the rows after the kept logits (the tail's included: the accumulator is not live
in forward), so the forward's peak is the gradient's bytes.

Memory beyond the inputs and gradients is the panel buffer (N·P·itemsize) and a few [N] vectors.
The float32 grad_x accumulator (N·H·4 bytes, 128 MiB at N=8192, H=4096) would otherwise double
that at the low end, so when grad_weight is computed it lives in grad_weight's own last R rows
(R·H·itemsize >= N·H·4), which no panel has written yet: the panels before them are walked
first; then the tail's panels contribute their grad_x (no grad_W), grad_x is rounded out of the
accumulator, and the tail's panels are walked once more for their grad_W (their logits
recomputed: 2·N·H·R FLOP more, R = 2N rows for 16-bit weights, 3.2% at N=8192, V=128256).

Panels wider than the budget pays for. A panel of P columns costs N·P·itemsize bytes, and
narrow panels are slow (a [N, 64] panel's GEMMs run far below the GPU's peak, and every panel
reads and writes the whole float32 accumulator). In backward, memory the gradients own but do
not use yet holds wider panels (`plan_backward`): grad_weight's unwritten rows (panels up to
`cfg.vocab_inplace_cols` columns, their scratch at the end of the rows still free) and grad_x's
own buffer (H columns at 16 bits, until grad_x is rounded into it). Only where neither is free
(the last rows of the tail's grad_W walk) does the budget's own [N, P] buffer get allocated.
So a 1 MiB budget walks the panels of a far larger one; the peak is the gradients plus a few
[N] vectors either way. The forward has no gradient rows to borrow, but no gradient exists yet
either, and the budget counts bytes beyond the gradients: its panels may spend the gradients'
bytes as well as the budget (`_flce_autograd._forward_cols`, capped at
`cfg.vocab_forward_max_cols`, 128 MiB of bf16 panel at N=8192) without raising the call's peak,
which is the backward's (gradients + budget). A caller whose gradients already exist (gradient
accumulation) still gets a new gradient from autograd before it is added, so that peak holds
there too.

Gradients are computed in backward with grad_output folded into each row's coefficients, so
reduction='none' costs no second pass here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

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


def _panel_launch(
    z: torch.Tensor, cfg: FlceConfig, launch: tuple[int, int, int]
) -> tuple[int, int, int]:
    """(grid, BLOCK_V, num_warps) of a panel kernel for a [rows, P] panel; `launch` is its
    GPU config (BLOCK_V, num_warps, programs per SM)."""
    rows, p = z.shape
    if INTERPRETED or z.device.type != "cuda":
        return rows, min(cfg.ce_block_v_interp, triton.next_power_of_2(p)), 4
    block_v, warps, per_sm = launch
    block_v = min(block_v, triton.next_power_of_2(p))
    if block_v < 2048:
        warps = min(warps, 4)
    return min(rows, max(1, per_sm) * _num_sms(z.device.index or 0)), block_v, warps


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
    keep: KeptLogits | None = None,
) -> tuple[VocabStats, torch.Tensor | None, torch.Tensor | None]:
    """Row statistics over every panel: (stats, Σ (weighted) logits or None, argmax or None).
    With `keep`, the kept panels' logits are computed into their place in grad_weight's bytes
    and left there for the backward; the other panels reuse one buffer in grad_weight's free
    rows (`keep.rest_row`, `keep.rest_cols` wide) instead of one of their own."""
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
    if keep is None:
        spans = [(v0, min(v, v0 + cols), None) for v0 in range(0, v, cols)]
        zbuf = torch.empty(n * min(cols, v), dtype=cdt, device=dev)
    else:
        k = keep.panels[-1][1]
        spans = [(v0, v1, row) for v0, v1, row in keep.panels]
        spans += [(v0, min(v, v0 + keep.rest_cols), None) for v0 in range(k, v, keep.rest_cols)]
        zbuf = _rows_as(keep.gw, keep.rest_row, n * keep.rest_cols, cdt)
    with _ieee_fp32_matmul(cdt == f32):
        for v0, v1, row in spans:
            if row is None:
                z = _panel(zbuf, n, v1 - v0)
            else:
                z = _rows_as(keep.gw, row, n * (v1 - v0), cdt).view(n, v1 - v0)
            _logits(z, xc, _w_panel(w, v0, v1, cdt), b, v0, v1, cdt)
            grid, block_v, warps = _panel_launch(z, cfg, cfg.vocab_stats_config_gpu)
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


def _aligned_row(row: int, row_bytes: int) -> int:
    """The first row from `row` whose bytes start 16-byte aligned (TMA and cuBLAS's fast paths
    want aligned panels)."""
    while (row * row_bytes) % 16:
        row += 1
    return row


def _kept_layout(
    n: int, h: int, k: int, width: int, cdt: torch.dtype, gw_dtype: torch.dtype
) -> tuple[list[tuple[int, int, int]], int]:
    """Panels of `width` columns over [0, k), each one's [N, P] logits in grad_weight's rows
    from k on, one after the other: ([(v0, v1, row)], the first row after them)."""
    rb = h * gw_dtype.itemsize
    out = []
    row = k
    for v0 in range(0, k, width):
        v1 = min(k, v0 + width)
        row = _aligned_row(row, rb)
        out.append((v0, v1, row))
        row += scratch_rows(n, h, v1 - v0, cdt, gw_dtype)
    return out, row


class KeptLogits(NamedTuple):
    """Logits the forward leaves for the backward in the grad_weight buffer it allocates.

    gw: [V, H] in grad_weight's dtype, unwritten as a gradient yet; panels: (v0, v1, row), the
    [N, v1 - v0] logits of columns [v0, v1) in the compute dtype at the bytes of gw's rows from
    `row` on (all of them past the kept columns' own rows, clear of each other and of the
    tail that holds the grad_x accumulator); rest_row, rest_cols: the forward's buffer for the
    other columns' panels, at gw's rows from rest_row on."""

    gw: torch.Tensor
    panels: list[tuple[int, int, int]]
    rest_row: int
    rest_cols: int


def plan_kept(
    n: int,
    h: int,
    v: int,
    cdt: torch.dtype,
    gw_dtype: torch.dtype,
    gx_on: bool,
    cfg: FlceConfig,
) -> tuple[list[tuple[int, int, int]], int, int] | None:
    """(kept panels, rest_row, rest_cols) of `KeptLogits`, or None where nothing is kept.

    The kept columns are the first K, walked first in backward: their grad_W rows [0, K) are
    written while nothing else has been, and their logits sit in rows [K, ...), which the
    backward's later panels then use as scratch. K is the largest (rounded to GEMM-friendly
    widths) whose logits end before the accumulator's tail (`tail_rows`, when grad_x is also
    computed) and leave the forward a buffer for the other columns' panels in the rows after
    them (the tail's rows included: the accumulator is not live in forward) at least
    min(1024, forward width, the columns left) wide. Each kept column saves the backward the
    2·N·H FLOP of its logits; a column costs H + N·(compute itemsize)/(gw itemsize) rows
    (N=8192, H=4096, bf16: K ~ (V - 2N)/3)."""
    if not cfg.vocab_keep_logits:
        return None
    es = gw_dtype.itemsize
    cs = cdt.itemsize
    rb = h * es
    r = tail_rows(n, h, v, 1, gw_dtype) if gx_on else 0
    hi = v - r
    width = max(1, _round_cols(min(int(cfg.vocab_forward_max_cols), v)))
    k = _round_cols(max(0, hi * rb // (rb + n * cs)))
    while k > 0:
        panels, end = _kept_layout(n, h, k, min(width, k), cdt, gw_dtype)
        rest_row = _aligned_row(end, rb)
        rest = v - k
        fits = ((v - rest_row) * rb // (n * cs)) if rest_row < v else 0
        rest_cols = _round_cols(min(width, rest, fits))
        if end <= hi and rest_cols >= min(1024, width, rest):
            return panels, rest_row, rest_cols
        k = _round_cols(k - 1)
    return None


class Panel(NamedTuple):
    """One backward panel: columns [v0, v1), where its [N, v1 - v0] logits live ("rows": the
    bytes of grad_weight's rows from `row`, none of them written yet nor in the panel itself;
    "kept": the same, but the forward left the logits there, so they are not recomputed;
    "gx": grad_x's own buffer, before grad_x is rounded into it; "own": the budget's buffer) and
    which gradients it contributes."""

    v0: int
    v1: int
    where: str
    row: int
    gx: bool
    gw: bool
    gb: bool


def _round_cols(c: int) -> int:
    """Panel widths GEMM tiles like: multiples of 128 from 256 columns, of 64 from 128."""
    if c >= 256:
        return c - c % 128
    if c >= 128:
        return c - c % 64
    return c


_OUT_DTYPE_OK: dict[int, bool] = {}


def _cublas_out_dtype(device_index: int) -> bool:
    """Whether this torch's CUDA `addmm` takes `out_dtype` (16-bit operands, float32 C: torch
    2.8 on), tried once per device on a small product against a float32 reference. Inside a
    CUDA graph capture (kassay's timing may capture a call) an untried device answers False
    for that call without trying: the check synchronises, which a capture forbids."""
    known = _OUT_DTYPE_OK.get(device_index)
    if known is not None:
        return known
    if torch.cuda.is_current_stream_capturing():
        return False
    dev = torch.device("cuda", device_index)
    a = torch.randn(32, 16, device=dev)
    b = torch.randn(16, 24, device=dev)
    c = torch.randn(32, 24, device=dev)
    want = c + a.half().float() @ b.half().float()
    try:
        torch.addmm(c, a.half(), b.half(), out_dtype=torch.float32, out=c)
        ok = bool(torch.allclose(c, want, rtol=1e-4, atol=1e-4))
    except (RuntimeError, TypeError, NotImplementedError):
        ok = False
    _OUT_DTYPE_OK[device_index] = ok
    return ok


def _cublas_f32_out(z: torch.Tensor) -> bool:
    """Whether cuBLAS can write float32 from this 16-bit CUDA operand (see `_cublas_out_dtype`)."""
    return (
        z.is_cuda
        and not INTERPRETED
        and z.dtype != torch.float32
        and _cublas_out_dtype(z.device.index or 0)
    )


def _accumulate_gx(acc, z, wp, accumulate: bool, one, cfg: FlceConfig) -> None:
    """acc [N, H] float32 (+)= z [N, P] @ W_p [P, H]. cuBLAS where it writes float32 from 16-bit
    operands (`cfg.vocab_gx_cublas`: at H=2304 the Triton TMA kernel took 17.5 ms, ~550
    TFLOP/s, cuBLAS ~685, research/results/flce-vocab-profile-h100-2026-12-07-run4.json), else
    the Triton TN kernel, written as (z^T)^T @ W_p."""
    if cfg.vocab_gx_cublas and z.is_cuda and not INTERPRETED and z.dtype == torch.float32:
        if accumulate:
            torch.addmm(acc, z, wp, out=acc)
        else:
            torch.mm(z, wp, out=acc)
    elif cfg.vocab_gx_cublas and _cublas_f32_out(z):
        if accumulate:
            torch.addmm(acc, z, wp, out_dtype=torch.float32, out=acc)
        else:
            torch.mm(z, wp, out_dtype=torch.float32, out=acc)
    else:
        _launch_gemm_tn(z.t(), wp, acc, one, accumulate=accumulate, cfg=cfg)


def _column_sums(out: torch.Tensor, z: torch.Tensor, ones: torch.Tensor | None) -> None:
    """out [P] float32 = Σ_rows z [N, P]. With `ones` ([1, N] in z's dtype, given where
    `_cublas_f32_out`), a cuBLAS product (float32 accumulation and output, exact products):
    one read of the panel at the bandwidth, where `z.sum(0, dtype=float32)` took 2.2 ms of 64
    at N=8192, H=2304, V=256000 (H100, research/results/flce-vocab-profile-h100-2026-12-07-run3
    .json)."""
    if ones is not None:
        torch.mm(ones, z, out_dtype=torch.float32, out=out.view(1, -1))
    else:
        out.copy_(z.sum(0, dtype=torch.float32))


def plan_backward(
    n: int,
    h: int,
    v: int,
    cols: int,
    cdt: torch.dtype,
    gw_dtype: torch.dtype | None,
    gx_dtype: torch.dtype | None,
    need_gb: bool,
    cfg: FlceConfig,
    kept: list[tuple[int, int, int]] | None = None,
) -> tuple[int, list[Panel]]:
    """(R, the panels in launch order) of `vocab_backward`; gw_dtype / gx_dtype None: that
    gradient is not computed. Each column's grad_x, grad_W and grad_b are each contributed by
    exactly one panel (tests/unit/kernels/test_kernel_flce_vocab.py checks it, and that no
    panel's bytes overlap a written or accumulating row).

    Three places can hold a panel, the widest that fits is taken: grad_weight's unwritten rows
    (up to `cfg.vocab_inplace_cols` columns: the panel's scratch at the end of the rows still
    free, so that the panel's own rows and its scratch do not overlap), grad_x's buffer (H·(its
    itemsize) / (compute itemsize) columns, until grad_x is rounded into it) and the budget's
    buffer (`cols`, allocated only if used). When both gradients are computed, the float32
    grad_x accumulator sits in grad_weight's last R rows, so those rows are walked twice: for
    grad_x (and grad_b) before it is rounded, then for grad_W with the scratch at their end.
    `kept` (`plan_kept`'s panels, grad_W computed): those panels come first, their logits
    where the forward left them; the walk starts after them, their bytes free again."""
    gw_on = gw_dtype is not None
    gx_on = gx_dtype is not None
    gw_dt = gw_dtype if gw_dtype is not None else cdt  # read only where grad_W is computed
    r = tail_rows(n, h, v, cols, gw_dt) if (gw_on and gx_on) else 0
    wide = min(int(cfg.vocab_inplace_cols), v) if gw_on else 0
    gx_cols = _round_cols(min(v, h * gx_dtype.itemsize // cdt.itemsize)) if gx_on else 0
    row_bytes = h * gw_dt.itemsize if gw_on else 0

    def in_rows(q: int, end: int) -> tuple[int, int]:
        """Widest panel from column q whose scratch fits the unwritten rows [q + c, end)."""
        if not wide:
            return 0, -1
        c = _round_cols(min(wide, _fitting_cols(end - q, n, h, cdt, gw_dt)))
        while c > 0:
            row = end - scratch_rows(n, h, c, cdt, gw_dt)
            while row > q + c and (row * row_bytes) % 16:  # TMA wants 16-byte aligned panels
                row -= 1
            if row >= q + c and (row * row_bytes) % cdt.itemsize == 0:
                return c, row
            c = _round_cols(c - 1)
        return 0, -1

    panels: list[Panel] = []

    def walk(lo: int, hi: int, rows_ok: bool, gx_ok: bool, do: tuple[bool, bool, bool]) -> None:
        q = lo
        while q < hi:
            rest = hi - q
            c_r, row = in_rows(q, hi) if rows_ok else (0, -1)
            c_x = min(gx_cols, rest) if gx_ok else 0
            c_o = min(cols, rest)
            c = max(c_r, c_x, c_o)
            if c == c_r:
                panels.append(Panel(q, q + c, "rows", row, *do))
            elif c == c_x:
                panels.append(Panel(q, q + c, "gx", -1, *do))
            else:
                panels.append(Panel(q, q + c, "own", -1, *do))
            q += c

    hi = v - r
    k = 0
    if kept:
        if not gw_on:
            raise ValueError(
                "kept logits live in grad_weight's bytes: grad_weight must be computed"
            )
        for v0, v1, row in kept:
            panels.append(Panel(v0, v1, "kept", row, gx_on, gw_on, need_gb))
        k = kept[-1][1]
    walk(k, hi, gw_on, gx_on, (gx_on, gw_on, need_gb))
    if r:
        walk(hi, v, False, True, (True, False, need_gb))  # grad_x's last terms, accumulator live
        walk(hi, v, True, False, (False, True, False))  # grad_x rounded: the tail's grad_W
    return r, panels


def _bytes_as(t: torch.Tensor, count: int, dtype: torch.dtype) -> torch.Tensor:
    """The first `count` elements of `dtype` in the bytes of tensor t (flat)."""
    flat = t.view(-1)
    if flat.dtype != dtype:
        flat = flat.view(torch.uint8).view(dtype)
    return flat[:count]


def _rows_as(gw: torch.Tensor, row: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """The bytes of grad_weight rows [row, ...) as `count` elements of `dtype` (flat)."""
    h = gw.shape[1]
    return _bytes_as(gw.view(-1)[row * h :], count, dtype)


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
    kept: KeptLogits | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(grad_x in gx_dtype, grad_W in gw_dtype, grad_b float32) of every panel, grad_output
    already folded into `coef`. The panels, their order and where each one's logits live are
    `plan_backward`'s; `cols` is the panel width the budget pays for (a buffer of its own,
    allocated only when nothing wider is free). With `kept` (the forward's, grad_W computed),
    grad_W is `kept.gw` and the kept panels' logits are read, not recomputed."""
    n, h = xc.shape
    v = w.shape[0]
    dev = xc.device
    cdt = xc.dtype
    f32 = torch.float32
    cg, eg, tg = coef
    exact = cdt == f32
    lse2 = stats.m if exact else stats.lse * LOG2E
    lsw = label_smoothing != 0.0 and cew is not None
    if kept is not None:  # plan_backward refuses kept logits without grad_weight
        gw = kept.gw
    else:
        gw = torch.empty((v, h), dtype=gw_dtype, device=dev) if need_gw else None
    gb = torch.empty(v, dtype=f32, device=dev) if need_gb else None
    # grad_x's own buffer exists from the start: until grad_x is rounded into it, its bytes
    # hold panels (the call's peak, which holds every gradient at the end, does not move)
    gx = torch.empty((n, h), dtype=gx_dtype, device=dev) if need_gx else None
    r, panels = plan_backward(
        n, h, v, cols, cdt, gw_dtype if need_gw else None, gx_dtype if need_gx else None,
        need_gb, cfg, kept.panels if kept is not None else None,
    )  # fmt: skip
    acc = None
    if need_gx:
        if r:
            acc = gw.view(-1)[(v - r) * h :].view(f32)[: n * h].view(n, h)
        else:
            acc = torch.empty((n, h), dtype=f32, device=dev)
    one = torch.ones(1, dtype=f32, device=dev)
    ones = torch.ones((1, n), dtype=cdt, device=dev) if need_gb and _cublas_f32_out(xc) else None
    own: list[torch.Tensor] = []  # the budget's panel buffer, allocated when first needed
    seen = False  # whether the accumulator holds a panel yet (the first one stores)
    rounded = False

    def buffer(pn: Panel) -> torch.Tensor:
        p = pn.v1 - pn.v0
        if pn.where in ("rows", "kept"):
            return _rows_as(gw, pn.row, n * p, cdt).view(n, p)
        if pn.where == "gx":
            return _bytes_as(gx, n * p, cdt).view(n, p)
        if not own:
            own.append(torch.empty(n * min(cols, v), dtype=cdt, device=dev))
        return _panel(own[0], n, p)

    def finish_gx() -> None:
        if acc.device.type == "cuda" or INTERPRETED:
            _launch_finalize(acc, gx, one, cfg=cfg)
        else:
            gx.copy_(acc)

    with _ieee_fp32_matmul(exact):
        for pn in panels:
            if acc is not None and not rounded and not pn.gx:
                finish_gx()  # every grad_x term is in: its buffer and the tail rows are free
                rounded = True
            v0, v1 = pn.v0, pn.v1
            z = buffer(pn)
            wp = _w_panel(w, v0, v1, cdt)
            if pn.where != "kept":
                _logits(z, xc, wp, b, v0, v1, cdt)
            grid, block_v, warps = _panel_launch(z, cfg, cfg.vocab_ce_config_gpu)
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
            if pn.gb and gb is not None:
                _column_sums(gb[v0:v1], z, ones)
            if pn.gw and gw is not None:
                out = gw[v0:v1]
                if gw_dtype == cdt:
                    torch.mm(z.t(), xc, out=out)  # every row in one GEMM: one rounding
                else:  # autocast with float32 weights: float32 out of 16-bit operands
                    _launch_gemm_tn(z, xc, out, one, accumulate=False, cfg=cfg)
            if pn.gx and acc is not None:
                _accumulate_gx(acc, z, wp, seen, one, cfg)
                seen = True
        if acc is not None and not rounded:
            finish_gx()
    return gx, gw, gb


def _fitting_cols(q: int, n: int, h: int, cdt: torch.dtype, gw_dtype: torch.dtype) -> int:
    """The widest panel c with c + scratch_rows(c) <= q."""
    es = gw_dtype.itemsize
    cs = cdt.itemsize
    c = (q * h * es) // (h * es + n * cs)
    while c > 0 and c + scratch_rows(n, h, c, cdt, gw_dtype) > q:
        c -= 1
    return c
