"""Benchmark of fused linear cross-entropy (forward + backward, bf16) on one CUDA GPU.

Times kassay, torch eager, torch.compile, Liger-Kernel and Cut Cross-Entropy at
N=8192,H=4096,V=128256 and N=8192,H=2304,V=256000, plus kassay's N sweep at its default memory
budget; reports ms (median, L2 flushed), TFLOP/s (6·N·H·V), fraction of the bf16 matmul ceiling
measured in the same run, peak extra GiB (max_memory_allocated minus before) and the rel-L2 error
of loss, grad_input and grad_weight against a float64 reference computed chunked on the GPU.

    PYTHONPATH=service python3 bench/flce.py --out bench/results/flce-h200-<date>.json

Needs only torch + triton (+ liger-kernel / cut-cross-entropy when installed). Uses kassay's
public API only (`kassay.kernels`); the stage breakdown and GEMM probes that reach into the
launchers are in research/flce_speed_probe.py.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import time

import torch
import torch.nn.functional as F
from common import median_ms, run_meta, save_json
from triton.testing import do_bench

from kassay.kernels import DEFAULT_MEMORY_BUDGET_BYTES, FlceConfig, fused_linear_cross_entropy
from kassay.kernels.flce import plan_rows

SHAPES = [(8192, 4096, 128256), (8192, 2304, 256000)]
SWEEP_N = [1024, 4096, 8192, 16384]
GiB = 2**30


def make_inputs(n, h, v, seed=0, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, h, device="cuda", generator=g).to(dtype)
    w = (torch.randn(v, h, device="cuda", generator=g) / math.sqrt(h)).to(dtype)
    t = torch.randint(0, v, (n,), device="cuda", generator=g)
    t[torch.rand(n, device="cuda", generator=g) < 0.1] = -100
    return x, w, t


def reference(x, w, t, chunk=1024):
    """float64 loss (mean), grad_x, grad_w, chunked over rows."""
    xd, wd = x.double(), w.double()
    n = x.shape[0]
    valid = t != -100
    nv = valid.sum().clamp_min(1).double()
    gx = torch.empty_like(xd)
    gw = torch.zeros_like(wd)
    loss = torch.zeros((), dtype=torch.float64, device=x.device)
    for r0 in range(0, n, chunk):
        z = xd[r0 : r0 + chunk] @ wd.t()
        tt = t[r0 : r0 + chunk]
        lse = torch.logsumexp(z, 1)
        vv = tt != -100
        ts = tt.clamp_min(0)
        loss += ((lse - z.gather(1, ts[:, None])[:, 0]) * vv).sum()
        p = torch.exp(z - lse[:, None])
        p[torch.arange(len(tt), device=x.device), ts] -= 1
        p *= (vv.double() / nv)[:, None]
        gx[r0 : r0 + chunk] = p @ wd
        gw += p.t() @ xd[r0 : r0 + chunk]
        del z, p
    return loss / nv, gx, gw


def rel_l2(a, b):
    return float((a.double() - b).norm() / b.norm())


def eager(x, w, t):
    return F.cross_entropy(F.linear(x, w).float(), t, ignore_index=-100)


_compiled = torch.compile(eager, dynamic=False)


def impls():
    out = {
        "kassay": lambda x, w, t: fused_linear_cross_entropy(x, w, t),
        "torch": eager,
        "torch_compile": _compiled,
    }
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import (
            LigerFusedLinearCrossEntropyFunction,
        )

        def liger(x, w, t):
            r = LigerFusedLinearCrossEntropyFunction.apply(x, w, t)
            return r[0] if isinstance(r, tuple) else r

        out["liger"] = liger
    except Exception as e:  # pragma: no cover - depends on the host
        print("liger unavailable:", repr(e))
    try:
        from cut_cross_entropy import linear_cross_entropy

        out["cce"] = lambda x, w, t: linear_cross_entropy(x, w, t)
    except Exception as e:  # pragma: no cover
        print("cce unavailable:", repr(e))
    return out


def measure(fn, x, w, t, ref=None):
    xr = x.detach().clone().requires_grad_()
    wr = w.detach().clone().requires_grad_()

    def step():
        fn(xr, wr, t).backward()

    step()  # warm-up / compile
    torch.cuda.synchronize()
    xr.grad = wr.grad = None
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    loss = fn(xr, wr, t)
    loss.backward()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - before) / GiB
    errs = {}
    if ref is not None:
        errs = {
            "loss": rel_l2(loss.detach().reshape(()), ref[0]),
            "grad_input": rel_l2(xr.grad, ref[1]),
            "grad_weight": rel_l2(wr.grad, ref[2]),
        }
    del loss
    ms = do_bench(step, warmup=100, rep=800, grad_to_none=[xr, wr], return_mode="median")
    return ms, peak, errs


def matmul_ceiling():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = median_ms(lambda: a @ b, warmup=100, rep=500)
    return 2 * 8192**3 / ms / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="flce-bench.json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip", default="", help="comma-separated impls to skip")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    t_start = time.time()
    result = {
        **run_meta(packages=("torch", "triton", "liger_kernel", "cut_cross_entropy")),
        "flop_model": "6*N*H*V",
        "inputs": "x~N(0,1), W~N(0,1/H), bf16; 10% of targets = ignore_index; reduction mean",
    }
    ceil = matmul_ceiling()
    result["matmul_ceiling_tflops"] = ceil
    print(f"bf16 matmul ceiling {ceil:.0f} TFLOP/s")
    skip = set(filter(None, args.skip.split(",")))
    rows = []
    variants = impls()
    variants["kassay_cublas_acc(drifts)"] = "cublas"
    variants["kassay_budget_1GiB"] = "1g"
    variants["kassay_one_more_chunk_128_aligned"] = "+1"
    for n, h, v in SHAPES[:1] if args.quick else SHAPES:
        x, w, t = make_inputs(n, h, v)
        ref = reference(x, w, t)
        torch.cuda.empty_cache()
        for name, fn in variants.items():
            if name in skip:
                continue
            if fn == "cublas":

                def fn(x, w, t, _c=FlceConfig(gw_accumulation="cublas")):
                    return fused_linear_cross_entropy(x, w, t, config=_c)

            elif fn == "+1":
                c = -(-n // plan_rows(n, v, 2, DEFAULT_MEMORY_BUDGET_BYTES)) + 1
                r = math.ceil(math.ceil(n / c) / 128) * 128

                def fn(x, w, t, _b=r * v * 2):
                    return fused_linear_cross_entropy(x, w, t, memory_budget_bytes=_b)

            elif fn == "1g":

                def fn(x, w, t):
                    return fused_linear_cross_entropy(x, w, t, memory_budget_bytes=GiB)

            try:
                ms, peak, errs = measure(fn, x, w, t, ref)
                tf = 6 * n * h * v / ms / 1e9
                row = {
                    "N": n,
                    "H": h,
                    "V": v,
                    "impl": name,
                    "ms": ms,
                    "tflops": tf,
                    "frac_ceiling": tf / ceil,
                    "peak_extra_gib": peak,
                    "rel_l2": errs,
                }
            except Exception as e:
                row = {"N": n, "H": h, "V": v, "impl": name, "error": repr(e)[:300]}
            print(json.dumps(row), flush=True)
            rows.append(row)
            gc.collect()
            torch.cuda.empty_cache()
        del x, w, t, ref
        gc.collect()
        torch.cuda.empty_cache()
    sweep = []
    if not args.quick:
        for n in SWEEP_N:
            x, w, t = make_inputs(n, 4096, 128256, seed=1)
            ms, peak, _ = measure(fused_linear_cross_entropy, x, w, t)
            tf = 6 * n * 4096 * 128256 / ms / 1e9
            row = {
                "N": n,
                "H": 4096,
                "V": 128256,
                "impl": "kassay",
                "ms": ms,
                "tflops": tf,
                "frac_ceiling": tf / ceil,
                "peak_extra_gib": peak,
                "rows_per_chunk": plan_rows(n, 128256, 2, DEFAULT_MEMORY_BUDGET_BYTES),
            }
            print(json.dumps(row), flush=True)
            sweep.append(row)
            del x, w, t
            torch.cuda.empty_cache()
    result["results"] = rows
    result["sweep"] = sweep
    result["wall_s"] = time.time() - t_start
    save_json(result, args.out)
    print(
        f"\n{'N,H,V':>20} {'impl':>26} {'ms':>8} {'TFLOP/s':>8} {'frac':>6} {'GiB':>6} "
        f"{'loss':>9} {'gx':>9} {'gw':>9}"
    )
    for r in rows + sweep:
        if "error" in r:
            print(f"{r['N']},{r['H']},{r['V']:>8} {r['impl']:>26} ERROR {r['error'][:80]}")
            continue
        e = r.get("rel_l2", {})
        print(
            f"{r['N']},{r['H']},{r['V']:>8} {r['impl']:>26} {r['ms']:8.2f} {r['tflops']:8.0f} "
            f"{r['frac_ceiling']:6.3f} {r['peak_extra_gib']:6.2f} "
            f"{e.get('loss', float('nan')):9.2e} {e.get('grad_input', float('nan')):9.2e} "
            f"{e.get('grad_weight', float('nan')):9.2e}"
        )


if __name__ == "__main__":
    main()
