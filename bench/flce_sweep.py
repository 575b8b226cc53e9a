"""The vocabulary schedule's knobs, one at a time: forward + backward time at the leanest
budget (1 MiB) at both target shapes, for the shipped config and single-knob variants.

bench/flce.py makes the speed claims (every peer, the curve); this picks the shipped values
of the knobs that only move time, not results beyond rounding: the kept logits
(`vocab_keep_logits`), the panel widths (`vocab_inplace_cols`, `vocab_forward_max_cols`) and
the panel kernels' launches (`vocab_stats_config_gpu`, `vocab_ce_config_gpu`: BLOCK_V,
num_warps, programs per SM; research/flce_panel_kernels.py, in git 678c58b, times the kernels
alone). Each variant's gradients are compared with the shipped config's (rel-L2; two correct
orders of the same float32 sums differ by a few bf16 roundings), and its peak memory beyond the
inputs is reported next to the shipped one's.

    python3 bench/flce_sweep.py --out $OUT/flce-sweep.json [--shapes 1,2] [--reps 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch
from flce_profile import bench_inputs

from kassay.kernels import FlceConfig, fused_linear_cross_entropy

SHAPES = [(8192, 4096, 128256), (8192, 2304, 256000)]
BUDGET = 1 << 20
SHIPPED = FlceConfig(schedule="vocab")
VARIANTS: dict[str, dict] = {
    "shipped": {},
    "recompute": {"vocab_keep_logits": False},
    "inplace_4096": {"vocab_inplace_cols": 4096},
    "inplace_16384": {"vocab_inplace_cols": 16384},
    "forward_4096": {"vocab_forward_max_cols": 4096},
    "forward_16384": {"vocab_forward_max_cols": 16384},
    "stats_2048_8_8": {"vocab_stats_config_gpu": (2048, 8, 8)},
    "stats_1024_4_16": {"vocab_stats_config_gpu": (1024, 4, 16)},
    "grad_2048_8_8": {"vocab_ce_config_gpu": (2048, 8, 8)},
    "grad_512_4_16": {"vocab_ce_config_gpu": (512, 4, 16)},
}


def run(x, w, t, cfg: FlceConfig, reps: int) -> tuple[float, float, tuple]:
    """(median ms of forward + backward, peak GiB beyond the inputs, (grad_x, grad_W))."""

    def step():
        fused_linear_cross_entropy(x, w, t, memory_budget_bytes=BUDGET, config=cfg).backward()
        grads = (x.grad, w.grad)
        x.grad = w.grad = None
        return grads

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    grads = step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - before) / 2**30
    return statistics.median(times), peak, grads


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="1,2", help="which of the two target shapes (1-based)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    args = ap.parse_args()
    names = [s for s in args.only.split(",") if s] or list(VARIANTS)
    res = {
        "date": time.strftime("%F"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": "python3 bench/flce_sweep.py "
        + " ".join(f"--{k} {v}" for k, v in (("shapes", args.shapes), ("reps", args.reps))),
        "budget_bytes": BUDGET,
        "runs": [],
    }
    for i in (int(s) for s in args.shapes.split(",")):
        n, h, v = SHAPES[i - 1]
        x, w, t, _ = bench_inputs(n, h, v)
        ref = None
        base_ms = 0.0
        for name in ["shipped"] + [m for m in names if m != "shipped"]:
            cfg = dataclasses.replace(SHIPPED, **VARIANTS[name])
            ms, peak, grads = run(x, w, t, cfg, args.reps)
            row = dict(N=n, H=h, V=v, variant=name, ms=round(ms, 3), peak_extra_gib=round(peak, 4))
            if ref is None:
                ref = tuple(g.clone() for g in grads)
                base_ms = ms
            else:
                row["rel_diff_vs_shipped"] = [rel(a, b) for a, b in zip(grads, ref, strict=True)]
                row["time_vs_shipped"] = round(ms / base_ms, 4)
            del grads
            res["runs"].append(row)
            print(json.dumps(row), flush=True)
            with open(args.out, "w") as f:
                json.dump(res, f, indent=1)
        del x, w, t, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
