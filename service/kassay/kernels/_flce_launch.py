"""Chunk planner and launchers of kassay's fused linear cross-entropy.

`plan_rows` sizes the row chunks from a memory budget; the `_launch_*` functions pick a launch
configuration from a `FlceConfig`, build the grid (and TMA descriptors on Hopper) and launch the
`@triton.jit` kernels of `_flce_kernels`. Callers (the autograd Function in `_flce_autograd`)
have checked the inputs. No state lives here besides a cache of SM counts.

Interpreter mode is a property of the kernels, not of the environment: under
TRITON_INTERPRET=1 (read by Triton when `_flce_kernels` is imported) `@triton.jit` builds
interpreted functions, and every launch then takes the interpreter's small configs.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import NamedTuple

import torch
import triton
from triton.runtime.jit import JITFunction

from kassay.kernels import _flce_kernels as K
from kassay.kernels.flce_config import DEFAULT_CONFIG, FlceConfig

#: True when `_flce_kernels` was imported under TRITON_INTERPRET=1 (interpreted kernels).
INTERPRETED = not isinstance(K._ce_rows_kernel, JITFunction)


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


class Plan(NamedTuple):
    """What one call runs: the schedule, its chunk (rows per row chunk, or columns per vocabulary
    panel: the other field is 0) and the working memory that chunk takes, in bytes."""

    schedule: str
    rows: int
    cols: int
    work_bytes: int


#: Cost model of `plan_schedule`: FLOP a byte of DRAM traffic costs (H200: ~650 TFLOP/s of
#: bf16 GEMM against ~4 TB/s of read-modify-write bandwidth), and FLOP a chunk's launches cost
#: (4-5 launches of ~4 µs of gaps each). Only the comparison of the two schedules uses them.
_FLOP_PER_BYTE = 160.0
_FLOP_PER_CHUNK = 1.2e10
#: The H100 (SXM, 3.35 TB/s against the H200's 4.8, about the same GEMM rate) pays more GEMM
#: time per byte. Fitted to its curve (bench/results/flce-budgets-h100-2026-12-07-*.json, both
#: shapes, every budget): 180-220 pick the faster schedule at every measured budget; 160 took
#: the row schedule at 62 MiB (62.2 ms) over the vocabulary schedule (57.3 ms), 230 the
#: vocabulary schedule at 187 MiB of the second shape (67.4 ms against 63.6).
_FLOP_PER_BYTE_BY_GPU = {"H100": 200.0}


@functools.cache
def _flop_per_byte_of(device_index: int) -> float:
    name = torch.cuda.get_device_name(device_index)
    for key, value in _FLOP_PER_BYTE_BY_GPU.items():
        if key in name:
            return value
    return _FLOP_PER_BYTE


def flop_per_byte(device: torch.device) -> float:
    """`plan_schedule`'s FLOP per byte of DRAM traffic on this device (the H200's off CUDA)."""
    if device.type != "cuda":
        return _FLOP_PER_BYTE
    return _flop_per_byte_of(device.index if device.index is not None else 0)


def plan_schedule(
    n: int,
    h: int,
    v: int,
    elem_bytes: int,
    budget_bytes: int,
    *,
    schedule: str = "auto",
    grads: bool = True,
    per_row: bool = False,
    min_cols: int = 64,
    flop_per_byte: float = _FLOP_PER_BYTE,
    keep_logits: bool = False,
) -> Plan:
    """The schedule and chunk of one call: with schedule "auto" the cheaper of the two by the
    cost model below among those whose working memory fits `budget_bytes` (if neither fits,
    the leaner), else the one asked for at the largest chunk the budget allows.

    Row schedule: rows = `plan_rows`; FLOP 6·N·H·V (8 for reduction 'none', `per_row`: its
    backward runs the pass again), plus a read and a write of the 16-bit grad_weight
    accumulator per chunk after the first (4·V·H bytes). Vocabulary schedule
    (`_flce_vocab`): panels of `plan_rows(v, n, ...)` columns, at least `min_cols`; FLOP
    8·N·H·V + 2·N·H·2N (the tail, see `_flce_vocab`), plus a float32 grad_x accumulator read
    and written per backward panel (8·N·H bytes), those panels at least H columns wide;
    `keep_logits` (grad_weight computed, `FlceConfig.vocab_keep_logits`): the forward keeps
    the logits of ~(V - 2N)·H/(H + N) columns in grad_weight's bytes, 2·N·H FLOP fewer each
    (`_flce_vocab.plan_kept`). Without gradients both are 2·N·H·V."""
    rows = plan_rows(n, v, elem_bytes, budget_bytes)
    chunks = -(-n // rows)
    cols = max(min(min_cols, v), plan_rows(v, n, elem_bytes, budget_bytes))
    panels = -(-v // cols)
    row_plan = Plan("rows", rows, 0, rows * v * elem_bytes)
    vocab_plan = Plan("vocab", 0, cols, n * cols * elem_bytes)
    if schedule == "rows":
        return row_plan
    if schedule == "vocab":
        return vocab_plan
    nhv = float(n) * h * v
    if grads:
        row_cost = (8.0 if per_row else 6.0) * nhv
        row_cost += max(0, chunks - 1) * 4.0 * v * h * flop_per_byte
        vocab_cost = 8.0 * nhv + 2.0 * n * h * min(v, 2 * n)
        if keep_logits:
            vocab_cost -= 2.0 * n * h * (max(0, v - 2 * n) * h / (h + n))
        # the backward's panels are at least H wide whatever the budget (grad_x's own buffer
        # holds one, `_flce_vocab.plan_backward`); the forward's spend the gradients' bytes
        panels = -(-v // max(cols, min(v, h)))
        vocab_cost += panels * 8.0 * n * h * flop_per_byte
    else:
        row_cost = vocab_cost = 2.0 * nhv
    row_cost += chunks * _FLOP_PER_CHUNK
    vocab_cost += panels * _FLOP_PER_CHUNK
    fits = [p for p in (row_plan, vocab_plan) if p.work_bytes <= budget_bytes]
    if not fits:
        return min((row_plan, vocab_plan), key=lambda p: p.work_bytes)
    cost = {"rows": row_cost, "vocab": vocab_cost}
    return min(fits, key=lambda p: (cost[p.schedule], p.schedule != "rows"))


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
    cfg: FlceConfig = DEFAULT_CONFIG,
    cew: torch.Tensor | None = None,
    cew_sum: torch.Tensor | None = None,
    zscale: torch.Tensor | None = None,
    acc: torch.Tensor | None = None,
    token_scaling: bool = False,
):
    """Cross-entropy of a logits chunk z [n, V] (16-bit or float32), dlogits written over it.

    programs: grid size (rows are taken with a grid stride); default from cfg's GPU launch
    configs (one program per row under the interpreter). cfg.ce_pair: two blocks per loop
    step; cfg.ce_l2_hints: L2 eviction hints.

    Options, each its own constexpr specialisation (left at None/False, the kernel compiles as
    without them): cew [V] float32 class weights with cew_sum float32 [1] (their sum) and
    zscale (the z-loss row factor, shaped like scale); acc [n] float32 written with 1.0 where
    the row's argmax is its (non-ignored) target; token_scaling: each row's loss and gradient
    times its detached target probability."""
    n = z.shape[0]
    if n == 0:
        return
    interp = INTERPRETED or _on_cpu_backend(z)
    if interp:
        block_v, num_warps, per_sm = cfg.ce_block_v_interp, 4, 0
    elif cfg.ce_long_row_v <= V:
        block_v, num_warps, per_sm = cfg.ce_config_long_gpu
    else:
        block_v, num_warps, per_sm = cfg.ce_config_gpu
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
        cew,
        cew_sum,
        zscale,
        acc,
        HAS_SOFTCAP=softcap is not None,
        HAS_LS=label_smoothing != 0.0,
        COMPUTE_GRAD=compute_grad,
        BLOCK_V=block_v,
        PAIR=cfg.ce_pair,
        HINTS=cfg.ce_l2_hints,
        HAS_WEIGHT=cew is not None,
        TOKEN_SCALING=token_scaling,
        ACCURACY=acc is not None,
        num_warps=num_warps,
    )


def _tma_ok(*ts: torch.Tensor, cfg: FlceConfig = DEFAULT_CONFIG) -> bool:
    """TMA descriptors need a Hopper-class GPU, unit inner strides and 16-byte aligned rows;
    cfg.use_tma_gemm False turns the TMA kernels off."""
    if INTERPRETED or not cfg.use_tma_gemm or ts[0].device.type != "cuda":
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


def _launch_gemm_tn(a, b, c, scale, accumulate, out=None, fin=None, cfg=DEFAULT_CONFIG):
    """c (+)= scale * a^T @ b ; a [K, M], b [K, N], c [M, N].

    With `out` (same shape and strides as c, may alias it) and `fin` (float32 [1]) the result
    (c + scale * a^T b) * fin is written to out instead of c: the last chunk's GEMM also
    finalises the gradient, saving a separate pass over it."""
    k_dim, m = a.shape
    n = b.shape[1]
    final = out is not None
    if not final:
        out, fin = c, scale
    if _tma_ok(a, b, c, out, cfg=cfg):
        from triton.tools.tensor_descriptor import TensorDescriptor

        loads_c = final or (accumulate and not cfg.gemm_tma_reduce)
        tiles = cfg.gemm_tma_rmw_config_gpu if loads_c else cfg.gemm_tma_config_gpu
        bm, bn, bk, gm, warps, stages, split, ctas = tiles
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
            REDUCE=cfg.gemm_tma_reduce,
            num_warps=warps,
            num_stages=stages,
        )
        return
    interp = INTERPRETED or _on_cpu_backend(a)
    bm, bn, bk, gm, warps, stages = cfg.gemm_config_interp if interp else cfg.gemm_config_gpu
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


def _grads_fused_ok(z, w, gx, xc, acc, cfg: FlceConfig = DEFAULT_CONFIG) -> bool:
    """Whether `_launch_grads` should run this chunk's grad_x and grad_W GEMMs as one kernel:
    Hopper TMA operands, and a grad_x tile count whose last wave leaves SMs idle (at least one
    full wave, the last one at most `cfg.grads_fused_max_last_wave` full)."""
    # the fused kernel's shared memory has no room for a load-add-store epilogue's C tile
    if not (cfg.grads_fused and cfg.gemm_tma_reduce) or not _tma_ok(z, w, gx, xc, acc, cfg=cfg):
        return False
    bm, bn = cfg.grads_fused_config_gpu[:2]
    tiles = triton.cdiv(z.shape[0], bm) * triton.cdiv(w.shape[1], bn)
    sms = _num_sms(z.device.index or 0)
    last = tiles % sms
    return tiles >= sms and 0 < last <= cfg.grads_fused_max_last_wave * sms


def _launch_grads(
    z, w, gx, xc, acc, scale, accumulate: bool, cfg: FlceConfig = DEFAULT_CONFIG
) -> None:
    """gx = z @ w and acc (+)= scale * z^T @ xc in one `_grads_tma_kernel` launch.

    z [rows, V] dlogits, w [V, H], gx [rows, H] and xc [rows, H] 16-bit, acc [V, H] float16,
    scale float32 [1]; callers check `_grads_fused_ok` first."""
    from triton.tools.tensor_descriptor import TensorDescriptor as TD

    rows, v = z.shape
    h = w.shape[1]
    bm, bn, bk, gm, warps, stages = cfg.grads_fused_config_gpu
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
        REDUCE=cfg.gemm_tma_reduce,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=gm,
        NUM_SMS=sms,
        num_warps=warps,
        num_stages=stages,
    )


def _scale_(
    t: torch.Tensor, factor: torch.Tensor, cfg: FlceConfig = DEFAULT_CONFIG
) -> torch.Tensor:
    """t *= factor in place (t any shape, factor float32 [1]); returns t.

    On CUDA a 16-bit t goes through `_finalize_kernel` (vectorised, product in float32, one
    rounding): torch's `mul_` of a 16-bit tensor by a float32 tensor takes its unvectorised
    mixed-dtype path (0.15 ms for the 8192 x 4096 grad_x on the H200, ~4x the traffic floor)."""
    if t.device.type == "cuda" and t.element_size() == 2 and t.is_contiguous():
        _launch_finalize(t, t, factor.reshape(1).float().contiguous(), cfg=cfg)
        return t
    return t.mul_(factor)


def _launch_finalize(c, out, factor, cfg: FlceConfig = DEFAULT_CONFIG):
    """out = c * factor in out's dtype (factor float32 [1]); out may alias c."""
    n = c.numel()
    interp = INTERPRETED or _on_cpu_backend(c)
    block = cfg.fin_block_interp if interp else cfg.fin_block_gpu
    K._finalize_kernel[(triton.cdiv(n, block),)](
        c, out, n, factor, BLOCK=block, num_warps=4 if interp else 8
    )
