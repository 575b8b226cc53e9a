"""Probe: the grad_W GEMM's epilogue as a TMA bulk reduce-add (C += tile done in L2) against the
read-modify-write epilogue (C loaded into registers, added, stored), on the H200.

  gemm     the grad_W kernel alone on one chunk of each target shape (K x M x N = 1792 x 128256 x
           4096 and 960 x 256000 x 2304: dlogits^T @ x into the float16 accumulator), for each
           configuration below and cuBLAS addmm_ (bf16 accumulator) interleaved over rounds; each
           configuration's result checked against float64 (rel-L2)
  fwdbwd   kassay fwd+bwd at both target shapes for the same configurations, interleaved, with
           each output's rel-L2 error against float64; "mul" also undoes the vectorised grad_x
           scaling (torch's mixed-dtype mul_ as before)

Configurations: (name, GEMM_TMA_REDUCE, GEMM_TMA_CONFIG_GPU); --set epilogue (default) compares
the epilogues, --set tiles the tile shape and GROUP_M under the reduce-add epilogue, --set k
BLOCK_K and the stage count.

    PYTHONPATH=service python3 research/flce_reduce_probe.py --out FILE
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_common import make_inputs, measure, probe_parser, reference, run_meta, save

from kassay.kernels import _flce_autograd
from kassay.kernels import _flce_launch as kl
from kassay.kernels import flce as kflce
from kassay.kernels.flce import FlceConfig

SHAPES = [(8192, 4096, 128256), (8192, 2304, 256000)]
CHUNK_ROWS = {(8192, 4096, 128256): 1792, (8192, 2304, 256000): 960}
SHIPPED_CFG = FlceConfig().gemm_tma_config_gpu
RMW_CFG = (128, 256, 64, 8, 8, 3, 2, 1)
CONFIGS = [
    ("rmw", False, RMW_CFG),
    ("reduce", True, RMW_CFG),
    ("reduce_4stages", True, (128, 256, 64, 8, 8, 4, 2, 1)),
    ("reduce_split1", True, (128, 256, 64, 8, 8, 3, 1, 1)),
]
# --set tiles: tile shape and GROUP_M with the reduce-add epilogue (second run of the day)
CONFIGS_TILES = [
    ("reduce", True, RMW_CFG),
    ("reduce_group4", True, (128, 256, 64, 4, 8, 3, 2, 1)),
    ("reduce_group16", True, (128, 256, 64, 16, 8, 3, 2, 1)),
    ("reduce_256x128", True, (256, 128, 64, 8, 8, 3, 2, 1)),
]
# --set k: BLOCK_K and stages (third run: 15 k-steps of 64 per tile at the second shape's
# 960-row chunks, where the kernel is ~18% slower than the chunk's other two GEMMs)
CONFIGS_K = [
    ("reduce", True, RMW_CFG),
    ("reduce_bk32_s5", True, (128, 256, 32, 8, 8, 5, 2, 1)),
    ("reduce_bk32_s6", True, (128, 256, 32, 8, 8, 6, 2, 1)),
    ("reduce_bk128_s2", True, (128, 256, 128, 8, 8, 2, 2, 1)),
]
_SCALE = _flce_autograd._scale_


def _set(reduce: bool, cfg: tuple, mul: bool = False) -> FlceConfig:
    """The FlceConfig of a variant (cfg: the TMA config of the launches whose epilogue does not
    load C); mul: grad_x scaled by torch's mixed-dtype mul_ (patched into the backward)."""
    _flce_autograd._scale_ = (lambda t, f, cfg=None: t.mul_(f)) if mul else _SCALE
    return FlceConfig(gemm_tma_reduce=reduce, gemm_tma_config_gpu=cfg)


def gemm(rounds: int) -> dict:
    res: dict = {}
    for (_n, h, v), k in CHUNK_ROWS.items():
        g = torch.Generator(device="cuda").manual_seed(1)
        a = (torch.randn(k, v, device="cuda", generator=g) * 1e-2).to(torch.bfloat16)
        b = torch.randn(k, h, device="cuda", generator=g).to(torch.bfloat16)
        c0 = (torch.randn(v, h, device="cuda", generator=g) * 4).to(torch.float16)
        scale = torch.full((1,), 0.5, device="cuda")
        ref = c0.double().addmm_(a.double().t(), b.double(), alpha=0.5)
        key = f"{k}x{v}x{h}"
        res[key] = {"check_rel_l2": {}, "ms": {}}
        for name, red, cfg in CONFIGS:
            run_cfg = _set(red, cfg)
            c = c0.clone()
            kl._launch_gemm_tn(a, b, c, scale, True, cfg=run_cfg)
            torch.cuda.synchronize()
            err = ((c.double() - ref).norm() / ref.norm()).item()
            res[key]["check_rel_l2"][name] = err
            print(key, name, f"rel-L2 {err:.3e}", flush=True)
        del ref
        c_bf = c0.to(torch.bfloat16)
        c = c0.clone()
        flop = 2.0 * k * v * h
        for r in range(rounds):
            for name, red, cfg in CONFIGS:
                run_cfg = _set(red, cfg)
                fn = lambda rc=run_cfg: kl._launch_gemm_tn(a, b, c, scale, True, cfg=rc)  # noqa: B023, E731
                ms = do_bench(fn, rep=150)
                res[key]["ms"].setdefault(name, []).append(round(ms, 4))
                print(key, r, name, f"{ms:.4f} ms {flop / ms / 1e9:.0f} TFLOP/s", flush=True)
            ms = do_bench(lambda: c_bf.addmm_(a.t(), b, alpha=0.5), rep=150)  # noqa: B023
            res[key]["ms"].setdefault("cublas_addmm_bf16", []).append(round(ms, 4))
            print(key, r, "cublas", f"{ms:.4f} ms {flop / ms / 1e9:.0f} TFLOP/s", flush=True)
        a = b = c = c0 = c_bf = None  # free before the next shape
        torch.cuda.empty_cache()
    _set(True, SHIPPED_CFG)
    return res


def fwdbwd(rounds: int) -> dict:
    res: dict = {}
    variants = [(name, red, cfg, False) for name, red, cfg in CONFIGS]
    if CONFIGS[0][0] == "rmw":
        variants.insert(1, ("rmw_mul", False, RMW_CFG, True))
    for n, h, v in SHAPES:
        x, w, t = make_inputs(n, h, v)
        ref = reference(x, w, t)
        flop = 6 * n * h * v
        key = f"{n},{h},{v}"
        res[key] = {}
        for r in range(rounds):
            for name, red, cfg, mul in variants:
                run_cfg = _set(red, cfg, mul)
                fn = functools.partial(kflce.fused_linear_cross_entropy, config=run_cfg)
                ms, peak, errs = measure(fn, x, w, t, ref)
                row = {"ms": round(ms, 3), "tflops": round(flop / ms / 1e9, 1)}
                row.update({"peak_gib": round(peak, 4), **{k: float(e) for k, e in errs.items()}})
                res[key].setdefault(name, []).append(row)
                print(key, r, name, row, flush=True)
        x = w = t = ref = None
        torch.cuda.empty_cache()
    _set(True, SHIPPED_CFG)
    return res


def main() -> int:
    ap = probe_parser(__doc__)
    ap.add_argument("--parts", default="gemm,fwdbwd")
    ap.add_argument("--set", choices=["epilogue", "tiles", "k"], default="epilogue")
    args = ap.parse_args()
    if args.set == "tiles":
        CONFIGS[:] = CONFIGS_TILES
    elif args.set == "k":
        CONFIGS[:] = CONFIGS_K
    out: dict = {
        **run_meta(),
        "configs": {name: [red, list(cfg)] for name, red, cfg in CONFIGS},
    }
    parts = args.parts.split(",")
    if "gemm" in parts:
        out["gemm"] = gemm(args.rounds)
    if "fwdbwd" in parts:
        out["fwdbwd"] = fwdbwd(max(1, args.rounds - 1))
    save(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
