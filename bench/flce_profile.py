"""Where the vocabulary schedule's time goes: device time per kernel family of one forward +
backward, at the leanest budget (1 MiB) and with every option on, at both target shapes.

bench/flce.py makes the speed claims; this says where a call's device time goes, by kernel
family matched by name (cuBLAS/CUTLASS GEMMs, the panel kernels, the Triton grad_x GEMM,
reductions, copies), for the shipped config, with every backward panel's logits recomputed
(`vocab_keep_logits=False`: what the kept logits save) and with grad_x by the Triton kernel
(`vocab_gx_cublas=False`), whose gradients must match the shipped ones.

    python3 bench/flce_profile.py --out $OUT/flce-vocab-profile.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from kassay.kernels import FlceConfig, fused_linear_cross_entropy

SHAPES = [(8192, 4096, 128256), (8192, 2304, 256000)]
FAMILIES = [
    ("panel_stats", "_panel_stats"),
    ("panel_grad", "_panel_grad"),
    ("gx_gemm_tma", "_gemm_tn_acc_tma"),
    ("gx_gemm", "_gemm_tn_acc"),
    ("finalize", "_finalize"),
    ("cublas_gemm", "gemm"),
    ("cublas_gemm", "cutlass"),
    ("cublas_gemm", "sm90"),
    ("reduce", "reduce"),
    ("copy", "copy"),
    ("elementwise", "elementwise"),
]


def family(name: str) -> str:
    low = name.lower()
    for fam, key in FAMILIES:
        if key.lower() in low:
            return fam
    return "other"


def bench_inputs(n: int, h: int, v: int):
    """(x [N, H] bf16, W [V, H] bf16 ~N(0, 1/H), targets [N] with 10% ignored, the generator
    for further inputs): the inputs of this profile and of bench/flce_sweep.py."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, h, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(v, h, device="cuda", generator=g) / math.sqrt(h)).to(torch.bfloat16)
    w.requires_grad_()
    t = torch.randint(0, v, (n,), device="cuda", generator=g)
    t[torch.rand(n, device="cuda", generator=g) < 0.1] = -100
    return x, w, t, g


def one(n, h, v, options, cfg, budget):
    x, w, t, g = bench_inputs(n, h, v)
    kw = {}
    b = None
    if options:
        b = (torch.randn(v, device="cuda", generator=g) * 0.1).to(torch.bfloat16).requires_grad_()
        kw = dict(
            label_smoothing=0.1, softcap=30.0, z_loss_scale=1e-4, use_token_scaling=True,
            return_token_accuracy=True, ce_weight=torch.rand(v, device="cuda") + 0.5,
        )  # fmt: skip

    def step():
        out = fused_linear_cross_entropy(x, w, t, b, memory_budget_bytes=budget, config=cfg, **kw)
        (out.loss if isinstance(out, tuple) else out).backward()
        grads = (x.grad, w.grad)
        x.grad = w.grad = None
        if b is not None:
            b.grad = None
        return grads

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    reps = 3
    t0 = time.perf_counter()
    for _ in range(reps):
        step()
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) / reps * 1e3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    fam = defaultdict(float)
    count = defaultdict(int)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            f = family(ev.name)
            fam[f] += ev.device_time_total / 1e3
            count[f] += 1
    gx, gw = step()
    return {
        "grads": (gx.float(), gw.float()),
        "wall_ms": wall_ms,
        "device_ms": {k: round(val, 3) for k, val in sorted(fam.items(), key=lambda kv: -kv[1])},
        "launches": dict(count),
        "device_total_ms": round(sum(fam.values()), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cfgs = {
        "shipped": FlceConfig(schedule="vocab"),
        "recompute": FlceConfig(schedule="vocab", vocab_keep_logits=False),
        "gx_triton": FlceConfig(schedule="vocab", vocab_gx_cublas=False),
    }
    res = {
        "date": time.strftime("%F"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": "python3 bench/flce_profile.py --out ...",
        "runs": [],
    }
    for n, h, v in SHAPES:
        first = None
        for name, cfg in cfgs.items():
            for options in (False, True) if name == "shipped" else (False,):
                r = one(n, h, v, options, cfg, 1 << 20)
                grads = r.pop("grads")
                if not options:  # the configs differ only in summation order
                    if first is None:
                        first = grads
                    else:
                        r["rel_diff_vs_shipped"] = [
                            float((a - b).norm() / b.norm())
                            for a, b in zip(grads, first, strict=True)
                        ]
                del grads
                r.update(N=n, H=h, V=v, config=name, options=options, budget_bytes=1 << 20)
                res["runs"].append(r)
                print(json.dumps(r), flush=True)
                with open(args.out, "w") as f:
                    json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
