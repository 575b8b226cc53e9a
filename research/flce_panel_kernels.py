"""The vocabulary schedule's two panel kernels alone: achieved bandwidth per launch config.

`_panel_stats_kernel` reads a [N, P] bf16 logits panel once (the forward's row statistics);
`_panel_grad_kernel` reads it and writes dlogits over it. Both should run at DRAM bandwidth
(a 8192 x 8192 bf16 panel is 134 MB: ~40 us at 3.35 TB/s), yet bench/flce_profile.py put the
stats kernel at ~1.2 TB/s at N=8192, H=2304, V=256000 (H100, 2026-12-07), and at 3x its plain
time with every option on. This times each kernel on one panel for the panel widths the
planner uses, plain and with the options (softcap, label smoothing with class weights,
accuracy), for a few (BLOCK_V, num_warps, programs per SM, PAIR) configs, and prints GB/s.

    python3 research/flce_panel_kernels.py --out $OUT/flce-panel-kernels.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from kassay.kernels import _flce_kernels as K
from kassay.kernels._flce_kernels import LOG2E

N = 8192
V = 256000
WIDTHS = (4096, 4736, 8192)
CONFIGS = [  # (BLOCK_V, num_warps, programs per SM, PAIR, ROWS); ROWS 0: the shipped kernels
    (2048, 8, 8, True, 0),  # shipped
    (2048, 8, 4, True, 0),
    (2048, 8, 16, True, 0),
    (1024, 4, 8, True, 0),
    (1024, 4, 16, True, 0),
    (4096, 8, 4, False, 0),
    (512, 4, 16, True, 0),
    (1024, 8, 4, True, 4),
    (1024, 8, 8, True, 4),
    (512, 4, 8, True, 4),
    (512, 8, 4, True, 8),
    (1024, 8, 4, False, 8),
    (2048, 8, 4, True, 2),
    (256, 4, 8, True, 8),
]


@triton.jit
def _stats_rows_kernel(
    z_ptr, stride_z, tgt_ptr, m_ptr, s_ptr, sz_ptr, zt_ptr, idx_ptr, cew_ptr, P, v0, softcap,
    n_rows, HAS_SOFTCAP: tl.constexpr, HAS_LS: tl.constexpr, LSW: tl.constexpr,
    ACCURACY: tl.constexpr, FIRST: tl.constexpr, BLOCK_V: tl.constexpr, PAIR: tl.constexpr,
    ROWS: tl.constexpr,
):  # fmt: skip
    """Candidate: `_panel_stats_kernel` on ROWS rows at a time ([ROWS, BLOCK_V] tiles), so a
    program's per-row epilogue (target gather, state merge) overlaps across its rows."""
    STEP: tl.constexpr = 2 * BLOCK_V if PAIR else BLOCK_V
    EXACT: tl.constexpr = z_ptr.dtype.element_ty == tl.float32
    p_full = (P // STEP) * STEP
    cols = tl.arange(0, BLOCK_V)
    for grp in range(tl.program_id(0), tl.cdiv(n_rows, ROWS), tl.num_programs(0)):
        rows = grp * ROWS + tl.arange(0, ROWS)
        ok = rows < n_rows
        row = tl.minimum(rows, n_rows - 1).to(tl.int64)
        z_row = z_ptr + row[:, None] * stride_z
        m_vec = tl.full([ROWS, BLOCK_V], float("-inf"), tl.float32)
        s_vec = tl.zeros([ROWS, BLOCK_V], tl.float32)
        sum_z = tl.zeros([ROWS, BLOCK_V], tl.float32)
        idx_vec = tl.zeros([ROWS, BLOCK_V], tl.int32)
        for c0 in range(0, p_full, STEP):
            m_vec, s_vec, sum_z, idx_vec = K._ce_stats_step(
                z_row, c0, cols, P, m_vec, s_vec, sum_z, idx_vec, softcap, cew_ptr,
                HAS_SOFTCAP, HAS_LS, PAIR, BLOCK_V, False, False, EXACT, LSW, ACCURACY,
            )  # fmt: skip
        if p_full < P:
            m_vec, s_vec, sum_z, idx_vec = K._ce_stats_step(
                z_row, p_full, cols, P, m_vec, s_vec, sum_z, idx_vec, softcap, cew_ptr,
                HAS_SOFTCAP, HAS_LS, PAIR, BLOCK_V, True, False, EXACT, LSW, ACCURACY,
            )  # fmt: skip
        m = tl.max(m_vec, axis=1)
        s = tl.sum(s_vec * tl.exp2((m_vec - m[:, None]) * LOG2E), axis=1)
        rel = tl.load(tgt_ptr + row) - v0
        in_panel = (rel >= 0) & (rel < P)
        rel_safe = tl.where(in_panel, rel, 0)
        z_t = tl.load(z_ptr + row * stride_z + rel_safe).to(tl.float32)
        if HAS_SOFTCAP:
            z_t = softcap * K._tanh(z_t * (1.0 / softcap))
        old_t = tl.load(zt_ptr + row)
        tl.store(zt_ptr + row, tl.where(in_panel, z_t, old_t), mask=ok)
        if FIRST:
            tl.store(m_ptr + row, m, mask=ok)
            tl.store(s_ptr + row, s, mask=ok)
            if HAS_LS:
                tl.store(sz_ptr + row, tl.sum(sum_z, axis=1), mask=ok)
            if ACCURACY:
                am = tl.min(tl.where(m_vec == m[:, None], idx_vec, P), axis=1)
                tl.store(idx_ptr + row, am + v0, mask=ok)
        else:
            m_old = tl.load(m_ptr + row)
            s_old = tl.load(s_ptr + row)
            m_new = tl.maximum(m_old, m)
            s_new = s_old * tl.exp2((m_old - m_new) * LOG2E) + s * tl.exp2((m - m_new) * LOG2E)
            tl.store(m_ptr + row, m_new, mask=ok)
            tl.store(s_ptr + row, s_new, mask=ok)
            if HAS_LS:
                tl.store(sz_ptr + row, tl.load(sz_ptr + row) + tl.sum(sum_z, axis=1), mask=ok)
            if ACCURACY:
                am = tl.min(tl.where(m_vec == m[:, None], idx_vec, P), axis=1)
                old_idx = tl.load(idx_ptr + row)
                tl.store(idx_ptr + row, tl.where(m > m_old, am + v0, old_idx), mask=ok)


@triton.jit
def _grad_rows_kernel(
    z_ptr, stride_z, tgt_ptr, lse2_ptr, logs_ptr, cg_ptr, eg_ptr, tg_ptr, cew_ptr, P, v0,
    softcap, n_rows, HAS_SOFTCAP: tl.constexpr, LSW: tl.constexpr, BLOCK_V: tl.constexpr,
    PAIR: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    """Candidate: `_panel_grad_kernel` on ROWS rows at a time (the last group's rows past
    n_rows repeat row n_rows - 1: the same values written twice)."""
    STEP: tl.constexpr = 2 * BLOCK_V if PAIR else BLOCK_V
    EXACT: tl.constexpr = z_ptr.dtype.element_ty == tl.float32
    p_full = (P // STEP) * STEP
    cols = tl.arange(0, BLOCK_V)
    for grp in range(tl.program_id(0), tl.cdiv(n_rows, ROWS), tl.num_programs(0)):
        row = tl.minimum(grp * ROWS + tl.arange(0, ROWS), n_rows - 1).to(tl.int64)
        z_row = (z_ptr + row * stride_z)[:, None]
        rel = tl.load(tgt_ptr + row) - v0
        tgt_rel = tl.where((rel >= 0) & (rel < P), rel, -2 * STEP).to(tl.int32)[:, None]
        lse2 = tl.load(lse2_ptr + row)[:, None]
        log_s = tl.load(logs_ptr + row)[:, None]
        cg = tl.load(cg_ptr + row)[:, None]
        eg = tl.load(eg_ptr + row)[:, None]
        tg = tl.load(tg_ptr + row)[:, None]
        for c0 in range(0, p_full, STEP):
            K._ce_grad_step(
                z_row, c0, cols, P, tgt_rel - c0, lse2, log_s, cg, eg, tg, softcap, cew_ptr,
                HAS_SOFTCAP, PAIR, BLOCK_V, False, False, EXACT, LSW,
            )  # fmt: skip
        if p_full < P:
            K._ce_grad_step(
                z_row, p_full, cols, P, tgt_rel - p_full, lse2, log_s, cg, eg, tg, softcap,
                cew_ptr, HAS_SOFTCAP, PAIR, BLOCK_V, True, False, EXACT, LSW,
            )  # fmt: skip


def stats_launch(z, tgt, bufs, cew, opts, cfg, v0=4096, first=False):
    block_v, warps, per_sm, pair, rows = cfg
    n, p = z.shape
    grid = min(n, per_sm * torch.cuda.get_device_properties(0).multi_processor_count)
    m, s, sz, zt, idx = bufs
    if rows:
        _stats_rows_kernel[(min(grid, triton.cdiv(n, rows)),)](
            z, z.stride(0), tgt, m, s, sz if opts else None, zt, idx if opts else None,
            cew[v0 : v0 + p] if opts else None, p, v0, 30.0, n,
            HAS_SOFTCAP=opts, HAS_LS=opts, LSW=opts, ACCURACY=opts, FIRST=first,
            BLOCK_V=min(block_v, 1 << (p - 1).bit_length()), PAIR=pair, ROWS=rows,
            num_warps=warps,
        )  # fmt: skip
        return
    K._panel_stats_kernel[(grid,)](
        z, z.stride(0), tgt, m, s, sz if opts else None, zt, idx if opts else None,
        cew[v0 : v0 + p] if opts else None, p, v0, 30.0, n, grid,
        HAS_SOFTCAP=opts, HAS_LS=opts, LSW=opts, ACCURACY=opts, FIRST=first,
        BLOCK_V=min(block_v, 1 << (p - 1).bit_length()), PAIR=pair, num_warps=warps,
    )  # fmt: skip


def grad_launch(z, tgt, rows, cew, opts, cfg, v0=4096):
    block_v, warps, per_sm, pair, r = cfg
    n, p = z.shape
    grid = min(n, per_sm * torch.cuda.get_device_properties(0).multi_processor_count)
    lse2, logs, cg, eg, tg = rows
    if r:
        _grad_rows_kernel[(min(grid, triton.cdiv(n, r)),)](
            z, z.stride(0), tgt, lse2, logs, cg, eg, tg, cew[v0 : v0 + p] if opts else None,
            p, v0, 30.0, n, HAS_SOFTCAP=opts, LSW=opts,
            BLOCK_V=min(block_v, 1 << (p - 1).bit_length()), PAIR=pair, ROWS=r, num_warps=warps,
        )  # fmt: skip
        return
    K._panel_grad_kernel[(grid,)](
        z, z.stride(0), tgt, lse2, logs, cg, eg, tg, cew[v0 : v0 + p] if opts else None,
        p, v0, 30.0, n, grid, HAS_SOFTCAP=opts, LSW=opts,
        BLOCK_V=min(block_v, 1 << (p - 1).bit_length()), PAIR=pair, num_warps=warps,
    )  # fmt: skip


def time_config(z, tgt, bufs, rows, cew, opts, cfg) -> dict:
    """Median us and TB/s of each kernel on z (the grad kernel rewrites z: fine for timing)."""
    out = {}
    ms = do_bench(lambda: stats_launch(z, tgt, bufs, cew, opts, cfg), warmup=25, rep=200)
    out["stats_us"] = round(ms * 1e3, 1)
    out["stats_tb_s"] = round(z.numel() * 2 / ms / 1e9, 3)
    ms = do_bench(lambda: grad_launch(z, tgt, rows, cew, opts, cfg), warmup=25, rep=200)
    out["grad_us"] = round(ms * 1e3, 1)
    out["grad_tb_s"] = round(2 * z.numel() * 2 / ms / 1e9, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    f32 = torch.float32
    tgt = torch.randint(0, V, (N,), device=dev, generator=g)
    cew = torch.rand(V, device=dev, generator=g) + 0.5
    bufs = (
        *(torch.zeros(N, dtype=f32, device=dev) for _ in range(4)),
        torch.zeros(N, dtype=torch.int32, device=dev),
    )
    rows = (
        torch.full((N,), 12.0, device=dev),
        torch.full((N,), 0.5, device=dev),
        torch.full((N,), 1e-4, device=dev),
        torch.full((N,), 1e-9, device=dev),
        torch.full((N,), 1e-4, device=dev),
    )
    res = {
        "date": time.strftime("%F"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": "python3 research/flce_panel_kernels.py",
        "configs": "(BLOCK_V, num_warps, programs per SM, PAIR, ROWS); ROWS 0: the shipped kernels",
        "N": N,
        "runs": [],
    }
    for p, opts in itertools.product(WIDTHS, (False, True)):
        base = (torch.randn(N, p, device=dev, generator=g) * 2).to(torch.bfloat16)
        z = base.clone()
        want = None
        for cfg in CONFIGS:
            row = {"P": p, "options": opts, "config": list(cfg)}
            # agreement with the shipped kernels: a first panel's state, then dlogits
            for b in bufs:
                b.zero_()
            stats_launch(z, tgt, bufs, cew, opts, cfg, first=True)
            grad_launch(z, tgt, rows, cew, opts, cfg)
            got = [b.clone() for b in bufs] + [z.clone()]
            z.copy_(base)
            if want is None:
                want = got
            else:
                diffs = [
                    (a.float() - b.float()).abs().max() for a, b in zip(got, want, strict=True)
                ]
                row["max_abs_diff"] = float(max(diffs))
            row.update(time_config(z, tgt, bufs, rows, cew, opts, cfg))
            z.copy_(base)
            res["runs"].append(row)
            print(json.dumps(row), flush=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    copy_ms = do_bench(lambda: z.copy_(base), warmup=25, rep=200)
    res["copy_tb_s"] = round(2 * z.numel() * 2 / copy_ms / 1e9, 3)
    print("copy", res["copy_tb_s"], "TB/s")
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
