"""Probe: can a plain-Triton persistent TMA GEMM run grad_x = dlogits @ W (NN, K = V long) as fast
as cuBLAS per tile? The open question behind a fused grad_x + grad_W kernel (NOTES-flce.md,
"What is left", item 1). Not used by kassay.

Same tiles and the same data-parallel schedule as cuBLAS has (so the same wave tail): at
1792 x 4096 x 128256 both make 224 tiles of 128 x 256 on 132 SMs; at 1024 rows 128 tiles (one
wave, no tail) isolate the mainloop. Checked against torch.mm (max abs difference).

    PYTHONPATH=service python3 research/flce_nn_probe.py --out FILE
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))

from flce_epilogue_probe import _dl_tile
from probe_common import grad_x_operands, probe_parser, run_meta, save, time_rounds

from kassay.kernels import _flce_launch as kl
from kassay.kernels._flce_kernels import _tile_grid, _tile_mn

# (rows, H, V): grad_x of one chunk, dlogits [rows, V] @ W [V, H]
SHAPES = [(1792, 4096, 128256), (1024, 4096, 128256), (960, 2304, 256000)]
CONFIGS = [  # (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages)
    (128, 256, 64, 8, 8, 3),  # the grad_W kernel's tile (4 stages need 262 KB: do not fit)
    (128, 256, 64, 16, 8, 3),
    (128, 128, 64, 8, 8, 4),
    (128, 128, 64, 8, 4, 4),
]


@triton.jit
def _gemm_nn_tma_kernel(
    a_desc,  # A [M, K] bf16, block [BLOCK_M, BLOCK_K]
    b_desc,  # B [K, N] bf16, block [BLOCK_K, BLOCK_N]
    c_desc,  # C [M, N] bf16 = A @ B, block [BLOCK_M, BLOCK_N]
    lse2_ptr,  # [M] float32 lse * log2e of each row (XFORM)
    g_ptr,  # [M] float32 row factor, 0 for ignored rows (XFORM)
    tgt_ptr,  # [M] int32 targets (XFORM)
    M,
    N,
    K,
    XFORM: tl.constexpr,  # A holds logits: its tiles become dlogits in registers (_dl_tile)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr,
):
    start_pid = tl.program_id(0)
    num_pid_m, num_in_group, num_tiles, k_tiles = _tile_grid(
        M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M
    )
    tile_id_c = start_pid - NUM_SMS
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = _tile_mn(tile_id, num_pid_m, num_in_group, GROUP_M)
        om = pid_m * BLOCK_M
        on = pid_n * BLOCK_N
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        if XFORM:
            rows = om + tl.arange(0, BLOCK_M)
            rm = rows < M
            lse2 = tl.load(lse2_ptr + rows, mask=rm, other=0.0)
            g = tl.load(g_ptr + rows, mask=rm, other=0.0)
            tgt = tl.load(tgt_ptr + rows, mask=rm, other=-1)
        for ki in range(k_tiles):
            a = a_desc.load([om, ki * BLOCK_K])
            b = b_desc.load([ki * BLOCK_K, on])
            if XFORM:
                a = _dl_tile(a, lse2, g, tgt, ki * BLOCK_K + tl.arange(0, BLOCK_K))
            acc = tl.dot(a, b, acc)
        tile_id_c += NUM_SMS
        pid_m_c, pid_n_c = _tile_mn(tile_id_c, num_pid_m, num_in_group, GROUP_M)
        c_desc.store([pid_m_c * BLOCK_M, pid_n_c * BLOCK_N], acc.to(c_desc.dtype))


def gemm_nn(a, b, c, cfg, rowv=None):
    """c = a @ b with the persistent TMA kernel; rowv: (lse2, g, tgt) of a's rows when a holds
    logits (XFORM), else None. Returns the compiled kernel."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, bk, gm, warps, stages = cfg
    m, k = a.shape
    n = b.shape[1]
    sms = kl._num_sms(a.device.index or 0)
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    return _gemm_nn_tma_kernel[(min(sms, tiles),)](
        TensorDescriptor.from_tensor(a, [bm, bk]),
        TensorDescriptor.from_tensor(b, [bk, bn]),
        TensorDescriptor.from_tensor(c, [bm, bn]),
        *(rowv or (c, c, c)), m, n, k, XFORM=rowv is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm, NUM_SMS=sms,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip


def main() -> int:
    args = probe_parser(__doc__).parse_args()
    out: dict = run_meta()
    for rows, h, v in SHAPES:
        _g, dl, w = grad_x_operands(rows, h, v, seed=4, dl_scale=1e-3)
        gx = torch.empty(rows, h, device="cuda", dtype=torch.bfloat16)
        ref = torch.mm(dl, w)
        key = f"{rows}x{h}x{v}"
        res: dict = {"max_abs_diff": {}, "ref_max_abs": float(ref.abs().max())}
        fns = {"cublas_mm": lambda: torch.mm(dl, w, out=gx)}  # noqa: B023
        for cfg in CONFIGS:
            fns[f"triton_nn{cfg}"] = lambda cfg=cfg: gemm_nn(dl, w, gx, cfg)  # noqa: B023
        for name, fn in fns.items():
            try:
                gx.zero_()
                fn()
                torch.cuda.synchronize()
                res["max_abs_diff"][name] = float((gx.float() - ref.float()).abs().max())
            except Exception as e:  # a config that does not fit (shared memory): record it
                res["max_abs_diff"][name] = repr(e)[:200]
        ok = {k: f for k, f in fns.items() if isinstance(res["max_abs_diff"][k], float)}
        flop = 2.0 * rows * h * v
        res["ms"] = time_rounds(ok, args.rounds, key)
        res["best_tflops"] = {k: round(flop / min(m) / 1e9, 1) for k, m in res["ms"].items()}
        print(key, res["max_abs_diff"], res["best_tflops"], flush=True)
        out[key] = res
        dl = w = gx = ref = None
        torch.cuda.empty_cache()
    save(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
