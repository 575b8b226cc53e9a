"""Probe: grad_x and grad_W of one chunk in ONE persistent Triton kernel, balanced so that no SM
idles in grad_x's last wave (NOTES-flce.md v7 "What is left" item 1; shipped since v8 as
`_grads_tma_kernel`, launched by `kassay.kernels.flce._launch_grads`, which this times).

    grad_x [rows, H]  = dl [rows, V] @ W [V, H]          (bf16 out, one rounding, TMA store)
    C [V, H]         += scale * dl^T @ x [rows, H]        (float16 accumulator, TMA reduce-add)

Schedule of CTA c of G: first its grad_x tiles (c, c + G, ...; all CTAs start them at k = 0, so
they share dl and W in L2); grad_x has T_x tiles, so the first T_x % G CTAs get one more. The
others ("light") then take an extra share of grad_W tiles, E = light CTAs x (grad_x k-steps /
grad_W k-steps), grid-strided among themselves, before every CTA takes the common grad_W tiles
E + c, E + c + G, ... Deterministic: no split-K, every output element written by one CTA.
Compared with cuBLAS grad_x followed by kassay's grad_W kernel, on the same inputs.

    PYTHONPATH=service python3 research/flce_fused_probe.py --out FILE
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_common import grads_operands, probe_parser, run_meta, save, time_rounds

from kassay.kernels import _flce_launch as kl

CHUNKS = [(1792, 4096, 128256), (960, 2304, 256000), (1024, 4096, 128256)]  # rows, H, V


def fused(dl, w, xc, gx, c, scale):
    kl._launch_grads(dl, w, gx, xc, c, scale, accumulate=True)


def main() -> int:
    args = probe_parser(__doc__).parse_args()
    out: dict = run_meta()
    for rows, h, v in CHUNKS:
        dl, w, xc, c0, scale = grads_operands(rows, h, v, seed=6)
        gx = torch.empty(rows, h, device="cuda", dtype=torch.bfloat16)
        c = c0.clone()
        key = f"{rows}x{h}x{v}"
        res: dict = {}
        fused(dl, w, xc, gx, c, scale)
        torch.cuda.synchronize()
        gx_ref = torch.mm(dl, w)
        res["grad_x_max_abs_diff_vs_cublas"] = float((gx.float() - gx_ref.float()).abs().max())
        c_ref = c0.clone()
        kl._launch_gemm_tn(dl, xc, c_ref, scale, True)
        res["C_max_abs_diff_vs_shipped"] = float((c.float() - c_ref.float()).abs().max())
        print(key, res, flush=True)
        gx_ref = c_ref = None

        def separate(dl=dl, w=w, xc=xc, gx=gx, c=c, scale=scale):
            torch.mm(dl, w, out=gx)
            kl._launch_gemm_tn(dl, xc, c, scale, True)

        fns = {
            "separate(cublas grad_x + shipped grad_W)": separate,
            "fused": lambda: fused(dl, w, xc, gx, c, scale),  # noqa: B023
            "cublas_grad_x_alone": lambda: torch.mm(dl, w, out=gx),  # noqa: B023
            "shipped_grad_W_alone": lambda: kl._launch_gemm_tn(dl, xc, c, scale, True),  # noqa: B023
        }
        res["ms"] = time_rounds(fns, args.rounds, key, rep=120)
        out[key] = res
        dl = w = xc = c0 = c = gx = None
        torch.cuda.empty_cache()
    save(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
