"""Probe: L2 prefetch of the grad_W accumulator tile in the persistent TMA GEMM, and where the
time of one flce fwd+bwd goes.

The grad_W GEMM's read-modify-write epilogue loads a 128x256 float16 tile of the accumulator from
HBM while the tensor cores wait (one warpgroup set does both). `GEMM_TMA_PREFETCH_C` asks L2 for
that tile when the tile starts, a K loop before the epilogue needs it. This probe times:
  gemm     the grad_W GEMM alone on one chunk (1792x4096x128256 and 960x2304x256000), prefetch
           0 / 1 / 2 (off / L2 / L2 evict_last) interleaved over rounds, cuBLAS addmm_ alongside;
           checks the prefetch changes no bit of the result;
  fwdbwd   kassay's fwd+bwd at both target shapes with each prefetch mode (interleaved rounds);
  profile  the kernels of one fwd+bwd (torch.profiler, summed by name) against its wall time.

    PYTHONPATH=service python3 bench/flce_prefetch_probe.py --out FILE
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent))

from flce import make_inputs, measure

from kassay.kernels import _flce_kernels as K
from kassay.kernels import flce as kflce

MODES = (0, 1, 2)
SHAPES = [(8192, 4096, 128256), (8192, 2304, 256000)]


def gemm(rounds: int) -> dict:
    res: dict = {}
    one = torch.ones(1, device="cuda")
    for rows, h, v in [(1792, 4096, 128256), (960, 2304, 256000)]:
        g = torch.Generator(device="cuda").manual_seed(3)
        z = (torch.randn(rows, v, device="cuda", generator=g) * 1e-2).to(torch.bfloat16)
        xc = torch.randn(rows, h, device="cuda", generator=g).to(torch.bfloat16)
        c0 = (torch.randn(v, h, device="cuda", generator=g) * 8).half()
        acc = torch.empty_like(c0)
        flop = 2 * rows * h * v
        outs = {}
        for m in MODES:  # bitwise check: the prefetch is only a hint
            K.GEMM_TMA_PREFETCH_C = m
            acc.copy_(c0)
            kflce._launch_gemm_tn(z, xc, acc, one, True)
            outs[m] = acc.clone()
        same = all(torch.equal(outs[0], outs[m]) for m in MODES)
        del outs
        key = f"{rows},{h},{v}"
        res[key] = {"bitwise_equal": same}
        print(key, "bitwise equal across modes:", same, flush=True)
        acc_bf = torch.zeros(v, h, device="cuda", dtype=torch.bfloat16)
        for r in range(rounds):
            t = do_bench(lambda: acc_bf.addmm_(z.t(), xc), rep=200)  # noqa: B023
            res[key].setdefault("cublas_addmm_bf16", []).append(round(t, 4))
            for m in MODES:
                K.GEMM_TMA_PREFETCH_C = m
                t = do_bench(lambda: kflce._launch_gemm_tn(z, xc, acc, one, True), rep=200)  # noqa: B023
                res[key].setdefault(f"prefetch{m}", []).append(round(t, 4))
            print(
                key,
                "round",
                r,
                {k: v_[-1] for k, v_ in res[key].items() if k != "bitwise_equal"},
                flush=True,
            )
        res[key]["tflops_of_median"] = {
            k: round(flop / sorted(v_)[len(v_) // 2] / 1e9)
            for k, v_ in res[key].items()
            if isinstance(v_, list)
        }
    return res


def fwdbwd(rounds: int) -> dict:
    res: dict = {}
    for n, h, v in SHAPES:
        x, w, t = make_inputs(n, h, v)
        flop = 6 * n * h * v
        key = f"{n},{h},{v}"
        res[key] = {}
        for r in range(rounds):
            for m in MODES:
                K.GEMM_TMA_PREFETCH_C = m
                ms, peak, _ = measure(kflce.fused_linear_cross_entropy, x, w, t)
                res[key].setdefault(f"prefetch{m}", []).append(
                    [round(ms, 3), round(flop / ms / 1e9, 1), round(peak, 4)]
                )
                print(key, "round", r, "prefetch", m, f"{ms:.3f} ms {peak:.4f} GiB", flush=True)
    return res


def profile(mode: int, iters: int = 3) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    K.GEMM_TMA_PREFETCH_C = mode
    res: dict = {}
    for n, h, v in SHAPES:
        x, w, t = make_inputs(n, h, v)
        xr = x.detach().clone().requires_grad_()
        wr = w.detach().clone().requires_grad_()

        def step():
            kflce.fused_linear_cross_entropy(xr, wr, t).backward()  # noqa: B023
            xr.grad = wr.grad = None  # noqa: B023

        for _ in range(2):
            step()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
            e0.record()
            for _ in range(iters):
                step()
            e1.record()
            torch.cuda.synchronize()
        wall = e0.elapsed_time(e1) / iters
        kern: dict = {}
        for ev in prof.events():
            if ev.device_type.name != "CUDA":
                continue
            name = ev.name[:90]
            k = kern.setdefault(name, [0, 0.0])
            k[0] += 1
            k[1] += ev.device_time_total / 1000.0
        rows = sorted(
            ([nm, c / iters, round(ms / iters, 3)] for nm, (c, ms) in kern.items()),
            key=lambda r: -r[2],
        )
        busy = sum(r[2] for r in rows)
        key = f"{n},{h},{v}"
        res[key] = {
            "wall_ms_per_iter": round(wall, 3),
            "kernel_ms_per_iter": round(busy, 3),
            "kernels": rows,
        }
        print(key, f"wall {wall:.3f} ms, kernels {busy:.3f} ms", flush=True)
        for r in rows[:14]:
            print(f"   {r[2]:8.3f} ms  x{r[1]:<5g} {r[0]}", flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parts", default="gemm,fwdbwd,profile")
    ap.add_argument("--profile-mode", type=int, default=0)
    args = ap.parse_args()
    parts = args.parts.split(",")
    out: dict = {
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
        "tma_config": list(K.GEMM_TMA_CONFIG_GPU),
    }
    if "gemm" in parts:
        out["gemm_ms"] = gemm(args.rounds)
    if "fwdbwd" in parts:
        out["fwdbwd_ms_tflops_gib"] = fwdbwd(max(1, args.rounds - 1))
    if "profile" in parts:
        out["profile_prefetch_mode"] = args.profile_mode
        out["profile"] = profile(args.profile_mode)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
