"""How much of the FLCE backward a *proven* tile skip could drop, on bench/flce.py's inputs.

#40 allows skipping a backward tile only where what is skipped is provably below the output's
rounding. The bound used here, per row i of grad_x (the easier of the two gradients):

    ||Σ_{j in S} g_ij W_j||  <=  Σ_{j in S} p_ij ||W_j||      (g_ij = p_ij off the target)

and a skip set S is allowed when that is at most u·||grad_x_i||, u = 2^-9 (half a bfloat16 ulp,
relative). The cheapest columns are skipped first (ascending p_ij ||W_j||), which is the most a
per-row bound can drop; a tile of rows must skip the column for each of its rows. grad_W is
harder still: a non-target column's gradient is Σ_i p_ij x_i, every term of the same small
size, so dropping any of them is not below that column's own rounding.

Runs on the CPU in float64 on a sample of rows (full V and H):

    python3 research/flce_skip_bound.py --out research/results/flce-skip-bound-2026-12-07.json
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

SHAPES = [(4096, 128256), (2304, 256000)]


def skippable(h: int, v: int, rows: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, h, generator=g, dtype=torch.float64)
    w = torch.randn(v, h, generator=g, dtype=torch.float64) / math.sqrt(h)
    t = torch.randint(0, v, (rows,), generator=g)
    z = x @ w.t()  # [rows, V]
    p = torch.softmax(z, dim=1)
    wn = w.norm(dim=1)  # [V]
    gx = p @ w - w[t]  # grad_x rows, up to the 1/N of the mean
    budget = 2.0**-9 * gx.norm(dim=1)  # [rows]
    cost = p * wn  # [rows, V]: the bound's term of each column
    cost[torch.arange(rows), t] = float("inf")  # the target's column is never skipped
    srt, _ = torch.sort(cost, dim=1)
    csum = torch.cumsum(srt, dim=1)
    n_skip = (csum <= budget[:, None]).sum(dim=1).double()  # columns each row may drop
    frac = n_skip / v
    return {
        "H": h,
        "V": v,
        "rows_sampled": rows,
        "p_max_median": float(p.max(dim=1).values.median()),
        "skippable_columns_fraction": {
            "min": float(frac.min()),
            "median": float(frac.median()),
            "max": float(frac.max()),
        },
        # a 64-row tile skips a column only if each of its rows may: at most the rows' minimum
        "backward_flop_saved_at_most": float(frac.min()) * 0.75,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=32)
    args = ap.parse_args()
    res = {
        "date": time.strftime("%F"),
        "torch": torch.__version__,
        "inputs": "bench/flce.py's: x~N(0,1), W~N(0,1/H)",
        "bound": "sum_{j in S} p_ij ||W_j|| <= 2^-9 ||grad_x_i||, cheapest columns first",
        "command": "python3 research/flce_skip_bound.py --out ...",
        "shapes": [skippable(h, v, args.rows) for h, v in SHAPES],
    }
    print(json.dumps(res, indent=1))
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
