"""Probe: cuBLAS time of the logits and grad_x GEMMs of one flce chunk, by call layout (H200).

The same products, asked of cuBLAS in different but equivalent ways, can select different
kernels. For one chunk of `rows` rows, bf16:
- logits [rows, V] = x_c @ W^T: torch.mm(x_c, W.t()) (shipped) and (W @ x_c^T)^T into a
  transposed view;
- grad_x [rows, H] = dlogits @ W: torch.mm(dl, W) (shipped) and (W^T @ dl^T)^T into a
  transposed view.

    PYTHONPATH=service python3 research/flce_gemm_layouts.py --out FILE
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from triton.testing import do_bench


def probe(rows: int, h: int, v: int) -> dict[str, list[float]]:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, h, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(v, h, device="cuda", generator=g) / h**0.5).to(torch.bfloat16)
    z = torch.empty(rows, v, device="cuda", dtype=torch.bfloat16)
    zt = torch.empty(v, rows, device="cuda", dtype=torch.bfloat16)  # logits stored transposed
    gx = torch.empty(rows, h, device="cuda", dtype=torch.bfloat16)
    gxt = torch.empty(h, rows, device="cuda", dtype=torch.bfloat16)
    flop = 2 * rows * h * v
    cases = {
        "logits mm(x, W^T)": lambda: torch.mm(x, w.t(), out=z),
        "logits mm(W, x^T) -> z^T": lambda: torch.mm(w, x.t(), out=zt),
        "grad_x mm(dl, W)": lambda: torch.mm(z, w, out=gx),
        "grad_x mm(W^T, dl^T) -> gx^T": lambda: torch.mm(w.t(), z.t(), out=gxt),
        "grad_x mm(W^T, zt) -> gx^T (dl stored transposed)": lambda: torch.mm(w.t(), zt, out=gxt),
        "grad_x mm(zt^T, W) (dl stored transposed)": lambda: torch.mm(zt.t(), w, out=gx),
    }
    res = {}
    for name, fn in cases.items():
        ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
        key = f"{rows}x{h}x{v} {name}"
        res[key] = [round(ms, 4), round(flop / ms / 1e9, 1)]
        print(f"{key:64s} {ms:.4f} ms {flop / ms / 1e9:.0f} TFLOP/s", flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    res: dict[str, list[float]] = {}
    for shape in [(1792, 4096, 128256), (911, 2304, 256000)]:
        res.update(probe(*shape))
        torch.cuda.empty_cache()
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
