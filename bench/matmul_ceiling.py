"""What does this GPU's bf16 matmul ceiling depend on? (the flce bench's denominator)

TARGETS.md records 795 TFLOP/s for 8192^3 bf16; the flce bench measured 672-679 on the same
kind of card. This probe times the same product with different data (randn, zeros, small
values) and for different lengths (a short do_bench, then 5 s of back-to-back products in
0.25 s windows) while sampling the SM clock and power with nvidia-smi, to tell data-dependent
power limits from a method difference. (It times on its own because what it studies is the
timing method and the card's state, not a kernel.)

    python bench/matmul_ceiling.py --out FILE
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
from common import median_ms, nvidia_smi, run_meta, save_json

N = 8192
FLOP = 2 * N**3


def smi() -> dict[str, float]:
    out = nvidia_smi("clocks.sm,power.draw,temperature.gpu", units=False).split(",")
    try:
        return {"sm_mhz": float(out[0]), "watts": float(out[1]), "temp_c": float(out[2])}
    except (ValueError, IndexError):
        return {}


def sustained(a: torch.Tensor, b: torch.Tensor, seconds: float) -> list[dict[str, Any]]:
    windows = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(100):  # ~0.15-0.2 s of products
            a @ b
        e.record()
        e.synchronize()
        ms = s.elapsed_time(e) / 100
        windows.append({"tflops": round(FLOP / ms / 1e9, 1), **smi()})
    return windows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    data = {
        "randn": lambda: torch.randn(N, N, device="cuda", generator=g).to(torch.bfloat16),
        "randn*1e-3": lambda: (torch.randn(N, N, device="cuda", generator=g) * 1e-3).to(
            torch.bfloat16
        ),
        "zeros": lambda: torch.zeros(N, N, device="cuda", dtype=torch.bfloat16),
    }
    res: dict[str, Any] = {**run_meta(), "torch": torch.__version__}
    for name, make in data.items():
        a, b = make(), make()
        short = median_ms(lambda a=a, b=b: a @ b, warmup=25, rep=100)
        long_ = median_ms(lambda a=a, b=b: a @ b, warmup=100, rep=500)
        w = sustained(a, b, args.seconds)
        res[name] = {
            "do_bench_rep100_tflops": round(FLOP / short / 1e9, 1),
            "do_bench_rep500_tflops": round(FLOP / long_ / 1e9, 1),
            "sustained_windows": w,
        }
        print(name, res[name]["do_bench_rep100_tflops"], res[name]["do_bench_rep500_tflops"],
              [x["tflops"] for x in w][:3], "...", w[-1], flush=True)  # fmt: skip
        del a, b
        torch.cuda.empty_cache()
        time.sleep(2)  # let the clocks recover between data sets
    save_json(res, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
