"""The grad_W GEMM of one chunk, for Nsight Compute: kassay's persistent TMA kernel (float16
accumulator, read-modify-write epilogue) and cuBLAS addmm_ (bf16 accumulator) on the same
operands, each launched twice (profile the second launch of each).

    ncu --clock-control none --kernel-name regex:'_gemm_tn_acc_tma|nvjet' --launch-skip 0 \
        --launch-count 4 --section SpeedOfLight --section WarpStateStats ... \
        python3 bench/flce_gemm_ncu.py --rows 960 --h 2304 --v 256000
"""

from __future__ import annotations

import argparse

import torch

from kassay.kernels import flce as kflce


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=960)
    ap.add_argument("--h", type=int, default=2304)
    ap.add_argument("--v", type=int, default=256000)
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(3)
    z = (torch.randn(args.rows, args.v, device="cuda", generator=g) * 1e-2).to(torch.bfloat16)
    xc = torch.randn(args.rows, args.h, device="cuda", generator=g).to(torch.bfloat16)
    acc = (torch.randn(args.v, args.h, device="cuda", generator=g) * 8).half()
    acc_bf = acc.to(torch.bfloat16)
    one = torch.ones(1, device="cuda")
    for _ in range(2):
        kflce._launch_gemm_tn(z, xc, acc, one, True)
    for _ in range(2):
        acc_bf.addmm_(z.t(), xc)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
