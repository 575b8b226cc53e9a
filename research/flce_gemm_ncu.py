"""One chunk's kernels for Nsight Compute, each launched twice (profile the second launch).

--part gemm: the grad_W GEMM: kassay's persistent TMA kernel (float16 accumulator) and cuBLAS
addmm_ (bf16 accumulator) on the same operands.
--part ce: the cross-entropy kernel (pass 1 + in-place dlogits) on a [rows, v] bf16 chunk.

    ncu --clock-control none --kernel-name regex:'_gemm_tn_acc_tma|nvjet' --launch-skip 0 \
        --launch-count 4 --section SpeedOfLight --section WarpStateStats ... \
        python3 research/flce_gemm_ncu.py --rows 960 --h 2304 --v 256000
    ncu --clock-control none --kernel-name regex:_ce_rows --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis ... \
        python3 research/flce_gemm_ncu.py --part ce --rows 1792 --v 128256
"""

from __future__ import annotations

import argparse

import torch

from kassay.kernels import _flce_launch as kl


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=960)
    ap.add_argument("--h", type=int, default=2304)
    ap.add_argument("--v", type=int, default=256000)
    ap.add_argument("--part", choices=["gemm", "ce"], default="gemm")
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(3)
    if args.part == "ce":
        return _ce(args.rows, args.v, g)
    z = (torch.randn(args.rows, args.v, device="cuda", generator=g) * 1e-2).to(torch.bfloat16)
    xc = torch.randn(args.rows, args.h, device="cuda", generator=g).to(torch.bfloat16)
    acc = (torch.randn(args.v, args.h, device="cuda", generator=g) * 8).half()
    acc_bf = acc.to(torch.bfloat16)
    one = torch.ones(1, device="cuda")
    for _ in range(2):
        kl._launch_gemm_tn(z, xc, acc, one, True)
    for _ in range(2):
        acc_bf.addmm_(z.t(), xc)
    torch.cuda.synchronize()
    return 0


def _ce(rows: int, v: int, g: torch.Generator) -> int:
    z = (torch.randn(rows, v, device="cuda", generator=g) * 2).to(torch.bfloat16)
    t = torch.randint(0, v, (rows,), device="cuda", generator=g)
    scale = torch.full((1,), 1.0 / rows, device="cuda")
    f32 = [torch.empty(rows, device="cuda") for _ in range(3)]
    for _ in range(2):
        kl._launch_ce(
            z, t, *f32, scale, False, V=v, ignore_index=-100, label_smoothing=0.0,
            z_loss_scale=0.0, softcap=None, compute_grad=True,
        )  # fmt: skip
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
