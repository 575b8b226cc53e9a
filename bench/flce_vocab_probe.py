"""Quick probe of the vocabulary schedule on one GPU: ms and peak extra memory of forward +
backward at a few panel widths, both target shapes, against the row schedule at the same
budget (bf16, reduction mean). For the full curve with every peer, `flce.py --budgets`.

    PYTHONPATH=service python3 bench/flce_vocab_probe.py --out bench/results/flce-vocab-probe-<gpu>-<date>.json
"""

from __future__ import annotations

import argparse
import gc

import torch
from common import run_meta, save_json
from flce import SHAPES, make_inputs
from triton.testing import do_bench

from kassay.kernels import FlceConfig, fused_linear_cross_entropy

GiB = 2**30


def point(x, w, t, budget, schedule):
    cfg = FlceConfig(schedule=schedule)
    xr = x.detach().clone().requires_grad_()
    wr = w.detach().clone().requires_grad_()

    def step():
        fused_linear_cross_entropy(xr, wr, t, memory_budget_bytes=budget, config=cfg).backward()

    step()
    torch.cuda.synchronize()
    xr.grad = wr.grad = None
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - before) / GiB
    ms = do_bench(step, warmup=10, rep=300, grad_to_none=[xr, wr], return_mode="median")
    return ms, peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="flce-vocab-probe.json")
    ap.add_argument("--cols", default="128,512,1024,2048,4096")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    for n, h, v in SHAPES:
        x, w, t = make_inputs(n, h, v)
        for c in map(int, args.cols.split(",")):
            budget = n * c * 2
            for schedule in ("vocab", "rows"):
                ms, peak = point(x, w, t, budget, schedule)
                r = {"N": n, "H": h, "V": v, "budget_bytes": budget, "schedule": schedule}
                r.update(ms=ms, peak_extra_gib=peak, tflops_8nhv=8 * n * h * v / ms / 1e9)
                print(r, flush=True)
                rows.append(r)
        del x, w, t
        gc.collect()
        torch.cuda.empty_cache()
    save_json({**run_meta(packages=("torch", "triton")), "rows": rows}, args.out)


if __name__ == "__main__":
    main()
