"""Probe: grad_x and grad_W of one chunk in ONE persistent Triton kernel, balanced so that no SM
idles in grad_x's last wave (NOTES-flce.md, "What is left", item 1). Not used by kassay.

    grad_x [rows, H]  = dl [rows, V] @ W [V, H]          (bf16 out, one rounding, TMA store)
    C [V, H]         += scale * dl^T @ x [rows, H]        (float16 accumulator, TMA reduce-add)

Schedule of CTA c of G: first its grad_x tiles (c, c + G, ...; all CTAs start them at k = 0, so
they share dl and W in L2); grad_x has T_x tiles, so the first T_x % G CTAs get one more. The
others ("light") then take an extra share of grad_W tiles, E = light CTAs x (grad_x k-steps /
grad_W k-steps), grid-strided among themselves, before every CTA takes the common grad_W tiles
E + c, E + c + G, ... Deterministic: no split-K, every output element written by one CTA.
Compared with cuBLAS grad_x followed by kassay's grad_W kernel, on the same inputs.

    PYTHONPATH=service python3 bench/flce_fused_probe.py --out FILE
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))

from flce import grad_x_operands, probe_parser, run_meta, save, time_rounds

from kassay.kernels import flce as kflce
from kassay.kernels._flce_kernels import _tile_mn

CHUNKS = [(1792, 4096, 128256), (960, 2304, 256000), (1024, 4096, 128256)]  # rows, H, V
BM, BN, BK, GROUP_M, WARPS, STAGES = 128, 256, 64, 8, 8, 3


@triton.jit
def _fused_gradx_gradw_kernel(
    dlx_desc,  # dl [rows, V], block [BM, BK] (grad_x's A)
    w_desc,  # W [V, H], block [BK, BN]
    gx_desc,  # grad_x [rows, H] bf16, block [BM, BN]
    dlw_desc,  # dl [rows, V], block [BK, BM] (grad_W's A^T)
    x_desc,  # x chunk [rows, H], block [BK, BN]
    c_desc,  # C [V, H] float16, block [BM, BN // 2]
    scale_ptr,
    ROWS,
    H,
    V,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr,
):
    pid = tl.program_id(0)
    scale = tl.load(scale_ptr)
    # grad_x: M = rows, N = H, K = V
    mx = tl.cdiv(ROWS, BM)
    nx = tl.cdiv(H, BN)
    kx = tl.cdiv(V, BK)
    tx = mx * nx
    for t in range(pid, tx, NUM_SMS):
        pm, pn = _tile_mn(t, mx, GROUP_M * nx, GROUP_M)
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for ki in range(kx):
            a = dlx_desc.load([pm * BM, ki * BK])
            b = w_desc.load([ki * BK, pn * BN])
            acc = tl.dot(a, b, acc)
        gx_desc.store([pm * BM, pn * BN], acc.to(gx_desc.dtype))
    # grad_W: M = V, N = H, K = rows
    mw = tl.cdiv(V, BM)
    nw = tl.cdiv(H, BN)
    kw = tl.cdiv(ROWS, BK)
    tw = mw * nw
    rem = tx % NUM_SMS
    light = NUM_SMS - rem  # CTAs with one grad_x tile fewer (all of them when rem == 0)
    extra = 0
    if rem > 0:
        extra = tl.minimum(light * (kx // kw), tw)
    # one loop over this CTA's grad_W tiles: its extra share (light CTAs), then the common ones
    n_extra = 0
    if (pid >= rem) & (rem > 0):
        n_extra = tl.cdiv(tl.maximum(extra - (pid - rem), 0), light)
    n_common = tl.cdiv(tl.maximum(tw - extra - pid, 0), NUM_SMS)
    for i in tl.range(0, n_extra + n_common, flatten=True):
        t = tl.where(i < n_extra, (pid - rem) + i * light, extra + pid + (i - n_extra) * NUM_SMS)
        pm, pn = _tile_mn(t, mw, GROUP_M * nw, GROUP_M)
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for ki in range(kw):
            a = dlw_desc.load([ki * BK, pm * BM])
            b = x_desc.load([ki * BK, pn * BN])
            acc = tl.dot(a.T, b, acc)
        out = acc * scale
        out = tl.permute(tl.reshape(out, (BM, 2, BN // 2)), (0, 2, 1))
        o0, o1 = tl.split(out)
        c_desc.atomic_add([pm * BM, pn * BN], o0.to(c_desc.dtype))
        c_desc.atomic_add([pm * BM, pn * BN + BN // 2], o1.to(c_desc.dtype))


def fused(dl, w, xc, gx, c, scale):
    from triton.tools.tensor_descriptor import TensorDescriptor as TD

    rows, v = dl.shape
    h = w.shape[1]
    sms = kflce._num_sms(dl.device.index or 0)
    _fused_gradx_gradw_kernel[(sms,)](
        TD.from_tensor(dl, [BM, BK]), TD.from_tensor(w, [BK, BN]), TD.from_tensor(gx, [BM, BN]),
        TD.from_tensor(dl, [BK, BM]), TD.from_tensor(xc, [BK, BN]),
        TD.from_tensor(c, [BM, BN // 2]), scale, rows, h, v,
        BM=BM, BN=BN, BK=BK, GROUP_M=GROUP_M, NUM_SMS=sms, num_warps=WARPS, num_stages=STAGES,
    )  # fmt: skip


def main() -> int:
    args = probe_parser(__doc__).parse_args()
    out: dict = run_meta()
    for rows, h, v in CHUNKS:
        g, dl, w = grad_x_operands(rows, h, v, seed=6, dl_scale=1e-2)
        xc = torch.randn(rows, h, device="cuda", generator=g).to(torch.bfloat16)
        c0 = (torch.randn(v, h, device="cuda", generator=g) * 4).half()
        scale = torch.full((1,), 0.5, device="cuda")
        gx = torch.empty(rows, h, device="cuda", dtype=torch.bfloat16)
        c = c0.clone()
        key = f"{rows}x{h}x{v}"
        res: dict = {}
        fused(dl, w, xc, gx, c, scale)
        torch.cuda.synchronize()
        gx_ref = torch.mm(dl, w)
        res["grad_x_max_abs_diff_vs_cublas"] = float((gx.float() - gx_ref.float()).abs().max())
        c_ref = c0.clone()
        kflce._launch_gemm_tn(dl, xc, c_ref, scale, True)
        res["C_max_abs_diff_vs_shipped"] = float((c.float() - c_ref.float()).abs().max())
        print(key, res, flush=True)
        gx_ref = c_ref = None

        def separate(dl=dl, w=w, xc=xc, gx=gx, c=c, scale=scale):
            torch.mm(dl, w, out=gx)
            kflce._launch_gemm_tn(dl, xc, c, scale, True)

        fns = {
            "separate(cublas grad_x + shipped grad_W)": separate,
            "fused": lambda: fused(dl, w, xc, gx, c, scale),  # noqa: B023
            "cublas_grad_x_alone": lambda: torch.mm(dl, w, out=gx),  # noqa: B023
            "shipped_grad_W_alone": lambda: kflce._launch_gemm_tn(dl, xc, c, scale, True),  # noqa: B023
        }
        res["ms"] = time_rounds(fns, args.rounds, key, rep=120)
        out[key] = res
        dl = w = xc = c0 = c = gx = None
        torch.cuda.empty_cache()
    save(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
