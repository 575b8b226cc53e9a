"""Is kassay's float32 flce wrong, or was the float32 policy? (issue #14, H200 only)

The CI grid N in {4096, 8192}, H=4096, V=128256, float32 (label smoothing 0 and 0.1) failed
`flce.kassay` grad_input at N=8192: rel_l2 6.25e-6 against 2 x torch's + floor = 5.76e-6.
kassay's grad_input GEMM is cuBLAS (torch.mm, IEEE float32) like torch's; only its row count
differs (960-row chunks against one 8192-row GEMM), so cuBLAS picks other kernels (split-K or
not). This script measures:
1. gemm: grad_input = D @ W for one float32 D (torch's dlogits), cuBLAS IEEE float32 at several
   row chunkings, each against the float64 product of the same operands: the spread of
   cuBLAS-vs-cuBLAS errors, next to the float32 accumulation floor u * sqrt(V / 6) the policy
   now adds (kassay.validate.verdicts.accumulation_rel).
2. engine: the CI grid through the engine (torch, kassay, and torch_compile with --compile):
   every output's rel_l2, limit and verdict under today's default policy.

python bench/flce_fp32_policy.py [--compile] [--out bench/results/flce-fp32-policy-h200.json]
"""

from __future__ import annotations

import argparse
import json
from datetime import date
from typing import Any

import torch


def gemm_spread(n: int, h: int, v: int, seed: int = 0) -> dict[str, Any]:
    from kassay.ops import get_op
    from kassay.validate.verdicts import accumulation_rel

    op = get_op("flce")
    p = op.parse_params({"N": n, "H": h, "V": v, "dtype": "float32"})
    dev = torch.device("cuda")
    inp = op.make_inputs(p, "normal", seed, dev)
    x, w, t = inp["x"], inp["weight"], inp["target"]
    torch.backends.cuda.matmul.allow_tf32 = False
    # torch's float32 dlogits D [N, V] (4.2 GB at N = 8192) and D @ W in float64
    d = torch.empty(n, v, dtype=torch.float32, device=dev)
    for s in range(0, n, 1024):
        d[s : s + 1024] = torch.softmax(x[s : s + 1024] @ w.T, dim=1)
    d[torch.arange(n, device=dev), t] -= 1.0
    d /= n
    out64 = torch.cat([d[s : s + 1024].double() @ w.double() for s in range(0, n, 1024)])
    ref_norm = float(out64.norm())
    rows: dict[str, float] = {}
    for m in (n, 4096, 1792, 960, 832, 512, 256):
        if m > n:
            continue
        err2 = sum(
            float(((d[r : r + m] @ w).double() - out64[r : r + m]).pow(2).sum())
            for r in range(0, n, m)
        )
        rows[f"rows={m}"] = err2**0.5 / ref_norm
    vals = list(rows.values())
    return {
        "N": n,
        "H": h,
        "V": v,
        "rel_l2_by_chunk_rows": rows,
        "max_over_min": max(vals) / min(vals),
        "accumulation_floor": accumulation_rel(v),
    }


def engine_grid(compile_: bool) -> list[dict[str, Any]]:
    from kassay.contract.spec import GroupSpec, TimingPolicy
    from kassay.validate.engine import run_group

    out = []
    impls = ["torch", "kassay"] + (["torch_compile"] if compile_ else [])
    for n in (4096, 8192):
        for ls in (0.0, 0.1):
            g = GroupSpec(
                group_id=f"fp32-{n}-{ls}",
                op="flce",
                params={"N": n, "H": 4096, "V": 128256, "dtype": "float32", "label_smoothing": ls},
                impls=impls,
                timing=TimingPolicy(enabled=False),
            )
            for c in run_group(g, device="cuda", ceilings=False):
                row = {
                    "N": n,
                    "label_smoothing": ls,
                    "impl": c.impl,
                    "status": c.status,
                    "flags": c.flags,
                    "outputs": {
                        o.name: {
                            "rel_l2": o.rel_l2,
                            "limit_rel_l2": o.threshold_rel_l2,
                            "max_abs": o.max_abs,
                            "limit_max_abs": o.threshold_max_abs,
                            "bias": o.bias,
                            "run_to_run_max_abs": o.run_to_run_max_abs,
                        }
                        for o in c.outputs
                    },
                    "message": c.message,
                }
                print(json.dumps(row), flush=True)
                out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true", help="torch_compile too")
    ap.add_argument("--out", default=f"bench/results/flce-fp32-policy-h200-{date.today()}.json")
    args = ap.parse_args()
    res = {
        "device": torch.cuda.get_device_name(),
        "gemm": [gemm_spread(n, 4096, 128256) for n in (4096, 8192)],
    }
    print(json.dumps(res["gemm"], indent=1), flush=True)
    res["engine"] = engine_grid(args.compile)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
