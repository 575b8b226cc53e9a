"""The vocabulary schedule's two panel kernels alone: software pipelining of their column loops.

`_panel_stats_kernel` reads a [N, P] bf16 logits panel once (the forward's row statistics);
`_panel_grad_kernel` reads it and writes dlogits over it. Both should run at DRAM bandwidth
(a 8192 x 8192 bf16 panel is 134 MB: ~40 us at 3.35 TB/s), yet bench/flce_profile.py put the
stats kernel at ~1.2 TB/s at N=8192, H=2304, V=256000 (H100, 2026-12-07), and at 3x its plain
time with every option on. This times each kernel on one panel for the panel widths the
planner uses, plain and with the options (softcap, label smoothing with class weights,
accuracy), for (BLOCK_V, num_warps, programs per SM, STAGES) configs, STAGES being the
tl.range num_stages of the column loop (1: none, the kernels as shipped before), and prints TB/s.

    python3 research/flce_panel_stages.py --out $OUT/flce-panel-kernels.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch
import triton
from triton.testing import do_bench

from kassay.kernels import _flce_kernels as K

N = 8192
V = 256000
WIDTHS = (4736, 8192, 1024)
CONFIGS = [  # (BLOCK_V, num_warps, programs per SM, STAGES)
    (512, 4, 16, 1),  # shipped stats
    (1024, 4, 16, 1),  # shipped grad
    (512, 4, 16, 2),
    (512, 4, 16, 3),
    (512, 4, 8, 3),
    (1024, 4, 16, 2),
    (1024, 4, 8, 2),
    (1024, 4, 8, 3),
    (2048, 8, 8, 2),
    (2048, 8, 4, 3),
    (256, 4, 16, 3),
    (512, 8, 8, 2),
]


def stats_launch(z, tgt, bufs, cew, opts, cfg, v0=4096, first=False):
    block_v, warps, per_sm, stages = cfg
    n, p = z.shape
    grid = min(n, per_sm * torch.cuda.get_device_properties(0).multi_processor_count)
    m, s, sz, zt, idx = bufs
    K._panel_stats_kernel[(grid,)](
        z, z.stride(0), tgt, m, s, sz if opts else None, zt, idx if opts else None,
        cew[v0 : v0 + p] if opts else None, p, v0, 30.0, n, grid,
        HAS_SOFTCAP=opts, HAS_LS=opts, LSW=opts, ACCURACY=opts, FIRST=first,
        BLOCK_V=min(block_v, 1 << (p - 1).bit_length()), PAIR=True, STAGES=stages,
        num_warps=warps,
    )  # fmt: skip


def grad_launch(z, tgt, rows, cew, opts, cfg, v0=4096):
    block_v, warps, per_sm, stages = cfg
    n, p = z.shape
    grid = min(n, per_sm * torch.cuda.get_device_properties(0).multi_processor_count)
    lse2, logs, cg, eg, tg = rows
    K._panel_grad_kernel[(grid,)](
        z, z.stride(0), tgt, lse2, logs, cg, eg, tg, cew[v0 : v0 + p] if opts else None,
        p, v0, 30.0, n, grid, HAS_SOFTCAP=opts, LSW=opts,
        BLOCK_V=min(block_v, 1 << (p - 1).bit_length()), PAIR=True, STAGES=stages,
        num_warps=warps,
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
        "command": "python3 research/flce_panel_stages.py",
        "configs": "(BLOCK_V, num_warps, programs per SM, STAGES); PAIR on",
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
