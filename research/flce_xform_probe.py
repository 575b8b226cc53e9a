"""Probe: the chunk's gradient GEMMs computing dloss/dlogits from the logits tile as they load
it, so the CE kernel's second pass (read the logits, write dlogits) goes away (NOTES-flce.md,
"What is left" item 5). Not used by kassay.

Per chunk (mean reduction, no options, 10% of rows ignored), persistent TMA kernels with the
shipped tiles (`flce_epilogue_probe`'s grad_W loop, `flce_nn_probe`'s NN GEMM, both with their
XFORM option), each in two forms on the same data:
  gradw_plain / gradw_xform   C[V, H] += dl^T @ x (float16 accumulator, TMA reduce-add), A tile
                              read from dlogits / computed from the logits tile in registers:
                              g_k * (exp2(z log2e - lse_k log2e) - [m == t_k]), cast to bf16
  gradx_plain / gradx_xform   grad_x[rows, H] = dl @ W (bf16 store), same choice of A
against cuBLAS's grad_x and the shipped CE kernel with and without its gradient pass (the part
the transform would remove: `ce_full` minus `ce_stats`). The transform recomputes each exp once
per output tile that reads it (H / 256 times for grad_x, once for grad_W), on the SM that
would otherwise only wait on the tensor cores. Checks: each xform output against its plain form
(max abs difference relative to the output's max); registers and spills of each kernel.

    PYTHONPATH=service python3 research/flce_xform_probe.py --out FILE
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from flce_epilogue_probe import launch as gradw_launch
from flce_nn_probe import gemm_nn
from probe_common import probe_parser, run_meta, save, time_rounds

from kassay.kernels import _flce_launch as kl

SHAPES = [(960, 2304, 256000), (1792, 4096, 128256)]  # rows of the chunk, H, V
GRAD_X_CONFIG = (128, 256, 64, 8, 8, 3)  # the shipped grad_x tile; grad_W: the epilogue probe's


def gradw(a, xc, c, scale, rowv, xform):
    """C += scale * a'^T xc, a' = a (dlogits) or the transform of a (logits) by rowv."""
    return gradw_launch(a, xc, c, scale, scale, 2, 2, -1, rowv if xform else None)


def gradx(a, w, gx, rowv, xform):
    """gx = a' @ w, a' as in `gradw`."""
    return gemm_nn(a, w, gx, GRAD_X_CONFIG, rowv if xform else None)


def main() -> int:
    args = probe_parser(__doc__).parse_args()
    out: dict = run_meta()
    for rows, h, v in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(11)
        x = torch.randn(rows, h, device="cuda", generator=gen).to(torch.bfloat16)
        w = (torch.randn(v, h, device="cuda", generator=gen) * h**-0.5).to(torch.bfloat16)
        t = torch.randint(0, v, (rows,), device="cuda", generator=gen)
        t[::10] = -100
        z = x @ w.t()
        dl = z.clone()
        scale = torch.full((1,), 1.0 / 8192, device="cuda")
        lse = torch.empty(rows, device="cuda")
        f2 = [torch.empty(rows, device="cuda") for _ in range(2)]

        def ce(buf, grad, t=t, scale=scale, f2=f2, lse=lse, v=v):
            kl._launch_ce(
                buf, t, f2[0], f2[1], lse, scale, False, V=v, ignore_index=-100,
                label_smoothing=0.0, z_loss_scale=0.0, softcap=None, compute_grad=grad,
            )  # fmt: skip

        ce(dl, True)  # dl: the dlogits of z, lse: its rows' lse
        valid = t != -100
        rowv = (
            (lse * 1.4426950408889634).contiguous(),
            torch.where(valid, 1.0 / 8192, 0.0).float().contiguous(),
            torch.where(valid, t, -1).to(torch.int32).contiguous(),
        )
        one = torch.ones(1, device="cuda")
        c0 = torch.zeros(v, h, device="cuda", dtype=torch.float16)
        cw = {k: c0.clone() for k in ("plain", "xform")}
        gx = {k: torch.empty(rows, h, device="cuda", dtype=torch.bfloat16) for k in cw}
        key = f"{rows}x{h}x{v}"
        res: dict = {"kernel": {}}
        for name, src, xf in (("plain", dl, False), ("xform", z, True)):
            kw = gradw(src, x, cw[name], one, rowv, xf)
            kx = gradx(src, w, gx[name], rowv, xf)
            for nm, k in (("gradw_" + name, kw), ("gradx_" + name, kx)):
                res["kernel"][nm] = {"regs": k.n_regs, "spills": k.n_spills}
        ref_gx = torch.mm(dl, w)
        res["rel_max_diff"] = {
            "gradw_xform_vs_plain": float((cw["xform"].float() - cw["plain"].float()).abs().max())
            / float(cw["plain"].float().abs().max()),
            "gradx_xform_vs_plain": float((gx["xform"].float() - gx["plain"].float()).abs().max())
            / float(gx["plain"].float().abs().max()),
            "gradx_plain_vs_cublas": float((gx["plain"].float() - ref_gx.float()).abs().max())
            / float(ref_gx.float().abs().max()),
        }
        print(key, res, flush=True)
        c = c0.clone()
        g_out = gx["plain"]
        scratch = z.clone()
        fns = {
            # timed in place on a scratch copy, as the shipped pass runs (later calls see
            # dlogits, not logits: the same instructions and bytes)
            "ce_full": lambda: ce(scratch, True),  # noqa: B023
            "ce_stats": lambda: ce(scratch, False),  # noqa: B023
            "gradw_plain": lambda: gradw(dl, x, c, one, rowv, False),  # noqa: B023
            "gradw_xform": lambda: gradw(z, x, c, one, rowv, True),  # noqa: B023
            "gradx_plain": lambda: gradx(dl, w, g_out, rowv, False),  # noqa: B023
            "gradx_xform": lambda: gradx(z, w, g_out, rowv, True),  # noqa: B023
            "cublas_gradx": lambda: torch.mm(dl, w, out=g_out),  # noqa: B023
        }
        res["ms"] = time_rounds(fns, args.rounds, key)
        out[key] = res
        x = w = z = dl = c = c0 = cw = gx = g_out = ref_gx = scratch = None
        torch.cuda.empty_cache()
    save(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
