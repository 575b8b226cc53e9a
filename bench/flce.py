"""Benchmark of fused linear cross-entropy (forward + backward, bf16) on one CUDA GPU.

Times kassay, torch eager, torch.compile, Liger-Kernel and Cut Cross-Entropy at
N=8192,H=4096,V=128256 and N=8192,H=2304,V=256000, plus kassay's N sweep at its default memory
budget; reports ms (median, L2 flushed), TFLOP/s (6·N·H·V), fraction of the bf16 matmul ceiling
measured in the same run, peak extra GiB (max_memory_allocated minus before) and the rel-L2 error
of loss, grad_input and grad_weight against a float64 reference computed chunked on the GPU.

    PYTHONPATH=service python3 bench/flce.py --out bench/results/flce-h200-<date>.json

Needs only torch + triton (+ liger-kernel / cut-cross-entropy when installed).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from kassay.kernels import flce as kflce

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


def run_meta() -> dict:
    """Date, GPU, versions and command line: the header of every flce result file."""
    return {
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
    }


def probe_parser(doc: str | None) -> argparse.ArgumentParser:
    """The flce probes' command line: --rounds (interleaved timing rounds) and --out (JSON)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    return ap


def time_rounds(fns: dict, rounds: int, key: str, rep: int = 100) -> dict:
    """{name: [ms per round]}: every fn timed once per round (do_bench, mean), interleaved, so
    the card's clock drift spreads over all of them; prints each round."""
    ms: dict = {}
    for r in range(rounds):
        for name, fn in fns.items():
            ms.setdefault(name, []).append(round(do_bench(fn, rep=rep), 4))
        print(key, "round", r, {k: m[-1] for k, m in ms.items()}, flush=True)
    return ms


def save(out: dict, path: Path | None) -> None:
    if path:
        path.write_text(json.dumps(out, indent=1))


def grad_x_operands(rows, h, v, seed, dl_scale):
    """(generator, dl [rows, v], w [v, h]) bf16, dl ~ N(0, dl_scale^2), w ~ N(0, 1/h); the
    generator continues for the caller's further inputs."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    dl = (torch.randn(rows, v, device="cuda", generator=g) * dl_scale).to(torch.bfloat16)
    w = (torch.randn(v, h, device="cuda", generator=g) * h**-0.5).to(torch.bfloat16)
    return g, dl, w


def grads_operands(rows, h, v, seed):
    """A chunk's gradient-GEMM operands: (dl [rows, v], w [v, h], x chunk [rows, h]) bf16 as in
    `grad_x_operands` (dl scale 1e-2), a float16 accumulator c0 [v, h] ~ N(0, 16) and the
    float32 scale 0.5 [1]."""
    g, dl, w = grad_x_operands(rows, h, v, seed=seed, dl_scale=1e-2)
    xc = torch.randn(rows, h, device="cuda", generator=g).to(torch.bfloat16)
    c0 = (torch.randn(v, h, device="cuda", generator=g) * 4).half()
    return dl, w, xc, c0, torch.full((1,), 0.5, device="cuda")


def ce_chunk(rows, v, n, seed=5):
    """One CE-kernel chunk: bf16 logits z0 [rows, v] (~N(0, 4)), targets (every 10th ignored),
    the mean-reduction row factor 1/n, three float32 row outputs and a work buffer like z0."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    z0 = (torch.randn(rows, v, device="cuda", generator=g) * 2).to(torch.bfloat16)
    t = torch.randint(0, v, (rows,), device="cuda", generator=g)
    t[::10] = -100
    scale = torch.full((1,), 1.0 / n, device="cuda")
    f32 = [torch.empty(rows, device="cuda") for _ in range(3)]
    return z0, t, scale, f32, torch.empty_like(z0)


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
        "kassay": lambda x, w, t: kflce.fused_linear_cross_entropy(x, w, t),
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
    ms = do_bench(lambda: a @ b, warmup=100, rep=500, return_mode="median")
    return 2 * 8192**3 / ms / 1e9


def _toggle(tma=None, defer=None):
    if tma is not None:
        kflce.USE_TMA_GEMM = tma
    if defer is not None:
        kflce.DEFER_LAST_GW = defer


def gemm_probe(rows=1664, h=4096, v=128256):
    """grad_W GEMM alone, one chunk: cuBLAS addmm_ bf16 vs kassay's Triton (f16 acc) configs."""
    from kassay.kernels import _flce_kernels as K

    z = torch.randn(rows, v, device="cuda", dtype=torch.bfloat16) * 1e-3
    xc = torch.randn(rows, h, device="cuda", dtype=torch.bfloat16)
    acc_bf = torch.zeros(v, h, device="cuda", dtype=torch.bfloat16)
    res = {"cublas_addmm_bf16": do_bench(lambda: acc_bf.addmm_(z.t(), xc), rep=300)}
    acc16 = torch.zeros(v, h, device="cuda", dtype=torch.float16)
    one = torch.ones(1, device="cuda")
    res["triton_tma" + str(K.GEMM_TMA_CONFIG_GPU)] = do_bench(
        lambda: kflce._launch_gemm_tn(z, xc, acc16, one, True), rep=300
    )
    default = K.GEMM_CONFIG_GPU
    _toggle(tma=False)  # the plain (pointer) kernel's configs
    for cfg in [
        (128, 256, 64, 8, 8, 3),
        (128, 256, 64, 8, 8, 4),
        (256, 128, 64, 8, 8, 3),
        (128, 128, 64, 8, 4, 4),
        (128, 256, 32, 8, 8, 4),
    ]:
        K.GEMM_CONFIG_GPU = cfg
        try:
            res["triton" + str(cfg)] = do_bench(
                lambda: kflce._launch_gemm_tn(z, xc, acc16, one, True), rep=300
            )
        except Exception as e:
            res["triton" + str(cfg)] = repr(e)[:200]
    K.GEMM_CONFIG_GPU = default
    _toggle(tma=True)
    flop = 2 * rows * h * v
    return {k: (val, flop / val / 1e9) if isinstance(val, float) else val for k, val in res.items()}


def breakdown(n=8192, h=4096, v=128256):
    """Time each stage of one default-size chunk (ms), to place the gap to the GEMM floor."""
    from kassay.kernels import _flce_kernels as K

    x, w, t = make_inputs(n, h, v)
    rows = kflce.plan_rows(n, v, 2, kflce.DEFAULT_MEMORY_BUDGET_BYTES)
    xc, tc = x[:rows], t[:rows]
    z = torch.empty(rows, v, device="cuda", dtype=torch.bfloat16)
    f32 = [torch.empty(rows, device="cuda") for _ in range(3)]
    one = torch.ones(1, device="cuda")
    gx = torch.empty(rows, h, device="cuda", dtype=torch.bfloat16)
    acc = torch.zeros(v, h, device="cuda", dtype=torch.float16)
    torch.mm(xc, w.t(), out=z)

    def ce():
        kflce._launch_ce(
            z,
            tc,
            *f32,
            one,
            False,
            V=v,
            ignore_index=-100,
            label_smoothing=0.0,
            z_loss_scale=0.0,
            softcap=None,
            compute_grad=False,
        )

    res = {
        "rows": rows,
        "logits_gemm": do_bench(lambda: torch.mm(xc, w.t(), out=z), rep=200),
        "ce_kernel_fwd_only": do_bench(ce, rep=200),
        "grad_x_gemm": do_bench(lambda: torch.mm(z, w, out=gx), rep=200),
        "finalize_1x": do_bench(lambda: kflce._launch_finalize(acc, acc, one), rep=200),
    }
    z.normal_().mul_(1e-3)
    res["grad_w_triton"] = do_bench(lambda: kflce._launch_gemm_tn(z, xc, acc, one, True), rep=200)
    default = K.GEMM_CONFIG_GPU
    _toggle(tma=False)  # the plain kernel's configs (grad_w_triton above is the default path)
    for cfg in [
        (128, 256, 64, 8, 8, 2),
        (128, 256, 64, 16, 8, 3),
        (128, 256, 64, 4, 8, 3),
        (64, 256, 64, 8, 4, 4),
        (128, 128, 128, 8, 8, 3),
    ]:
        K.GEMM_CONFIG_GPU = cfg
        try:
            res["grad_w_triton" + str(cfg)] = do_bench(
                lambda: kflce._launch_gemm_tn(z, xc, acc, one, True), rep=200
            )
        except Exception as e:
            res["grad_w_triton" + str(cfg)] = repr(e)[:120]
    K.GEMM_CONFIG_GPU = default
    _toggle(tma=True)
    # CE kernel with gradient (pass 2 writes dlogits in place)
    res["ce_kernel_fwd_bwd"] = do_bench(
        lambda: kflce._launch_ce(
            z,
            tc,
            *f32,
            one,
            False,
            V=v,
            ignore_index=-100,
            label_smoothing=0.0,
            z_loss_scale=0.0,
            softcap=None,
            compute_grad=True,
        ),
        rep=200,
    )
    return res


def speed_probe(gemm_only=False):
    """Speed-pass probe: grad_W GEMM kernels/configs on one chunk (checked against each other),
    fwd+bwd with the TMA kernel and the deferred (fused-finalize) last chunk on/off, a two-stream
    overlap probe and cuBLAS logits / grad_x GEMMs at several row counts. Prints one line each."""
    from kassay.kernels import _flce_kernels as K

    out = {}

    def say(k, val):
        out[k] = val
        print(f"{k:>58} {val}", flush=True)

    one = torch.ones(1, device="cuda")
    for rows, h, v in [(1792, 4096, 128256), (911, 2304, 256000)]:
        g = torch.Generator(device="cuda").manual_seed(3)
        z = torch.randn(rows, v, device="cuda", generator=g).to(torch.bfloat16)
        xc = torch.randn(rows, h, device="cuda", generator=g).to(torch.bfloat16)
        flop = 2 * rows * h * v
        acc_bf = torch.zeros(v, h, device="cuda", dtype=torch.bfloat16)
        t = do_bench(lambda: acc_bf.addmm_(z.t(), xc, alpha=1e-3), rep=200)  # noqa: B023
        say(f"{rows},{h},{v} cublas addmm_ bf16", (round(t, 3), round(flop / t / 1e9)))
        c0 = (torch.randn(v, h, device="cuda", generator=g) * 64).half()
        sc = torch.full((1,), 2.0**-3, device="cuda")
        ref = c0.float() + sc * (z.t().float() @ xc.float())
        acc = torch.empty_like(c0)
        cfgs = [("ptr", c) for c in [(128, 256, 64, 8, 8, 3), (128, 128, 64, 8, 8, 3)]]
        cfgs += [
            ("tma", c)
            for c in [
                (128, 256, 64, 8, 8, 3, 2, 1),
                (128, 256, 64, 8, 8, 3, 1, 1),
                (128, 128, 64, 8, 8, 4, 1, 1),
                # two persistent programs per SM: one's epilogue under the other's MMAs
                (128, 128, 64, 8, 4, 3, 1, 2),
                (128, 128, 64, 8, 4, 3, 2, 2),
                (128, 128, 64, 8, 8, 3, 1, 2),
                (128, 128, 32, 8, 4, 4, 1, 2),
                (64, 256, 64, 8, 4, 3, 1, 2),
                (128, 256, 32, 8, 8, 3, 2, 2),
            ]
        ]
        d0, d1 = K.GEMM_CONFIG_GPU, K.GEMM_TMA_CONFIG_GPU
        for kind, cfg in cfgs:
            _toggle(tma=kind == "tma")
            if kind == "tma":
                K.GEMM_TMA_CONFIG_GPU = cfg
            else:
                K.GEMM_CONFIG_GPU = cfg
            name = f"{rows},{h},{v} {kind}{cfg}"
            try:
                acc.copy_(c0)
                kflce._launch_gemm_tn(z, xc, acc, sc, True)
                err = float((acc.float() - ref).norm() / ref.norm())
                t = do_bench(lambda: kflce._launch_gemm_tn(z, xc, acc, sc, True), rep=100)  # noqa: B023
                say(name, (round(t, 3), round(flop / t / 1e9), f"err {err:.1e}"))
            except Exception as e:
                say(name, repr(e)[:160])
            K.GEMM_CONFIG_GPU, K.GEMM_TMA_CONFIG_GPU = d0, d1
        _toggle(tma=True)
        # FINAL epilogue (bf16 out aliasing the f16 accumulator) against the same reference
        acc.copy_(c0)
        o = acc.view(torch.bfloat16)
        kflce._launch_gemm_tn(z, xc, acc, sc, True, out=o, fin=torch.full((1,), 0.5, device="cuda"))
        say(
            f"{rows},{h},{v} tma FINAL rel err",
            float((o.float() - 0.5 * ref).norm() / (0.5 * ref).norm()),
        )
        torch.cuda.empty_cache()
    if gemm_only:
        return out

    # cuBLAS logits / grad_x at several row counts (ms per 1000 rows), H=4096, V=128256
    x, w, t = make_inputs(8192, 4096, 128256)
    for rows in (1536, 1664, 1792, 2048):
        z = torch.empty(rows, 128256, device="cuda", dtype=torch.bfloat16)
        xc = x[:rows]
        tl_ = do_bench(lambda: torch.mm(xc, w.t(), out=z), rep=150)  # noqa: B023
        gx = torch.empty(rows, 4096, device="cuda", dtype=torch.bfloat16)
        tg = do_bench(lambda: torch.mm(z, w, out=gx), rep=150)  # noqa: B023
        gxt = torch.empty(4096, rows, device="cuda", dtype=torch.bfloat16)
        tgt = do_bench(lambda: torch.mm(w.t(), z.t(), out=gxt), rep=150)  # noqa: B023
        f = 2 * rows * 4096 * 128256 / 1e9
        say(
            f"rows {rows} logits / grad_x / grad_x^T TFLOP/s",
            (round(f / tl_), round(f / tg), round(f / tgt)),
        )
    # two-stream probe: CE kernel (side stream) under a logits GEMM (main stream)
    rows = 1664
    z1 = torch.empty(rows, 128256, device="cuda", dtype=torch.bfloat16)
    z2 = torch.randn(rows, 128256, device="cuda", dtype=torch.bfloat16)
    f32 = [torch.empty(rows, device="cuda") for _ in range(3)]
    side = torch.cuda.Stream()

    def ce():
        kflce._launch_ce(
            z2,
            t[:rows],
            *f32,
            one,
            False,
            V=128256,
            ignore_index=-100,
            label_smoothing=0.0,
            z_loss_scale=0.0,
            softcap=None,
            compute_grad=False,
        )

    def both():
        cur = torch.cuda.current_stream()
        side.wait_stream(cur)
        torch.mm(x[:rows], w.t(), out=z1)
        with torch.cuda.stream(side):
            ce()
        cur.wait_stream(side)

    say(
        "overlap: gemm / ce / both (ms)",
        tuple(
            round(do_bench(fn, rep=150), 3)
            for fn in (lambda: torch.mm(x[:rows], w.t(), out=z1), ce, both)
        ),
    )
    torch.cuda.empty_cache()

    # fwd+bwd, shape 1 (and 2): old kernel, TMA kernel, TMA + deferred last chunk
    for n, h, v in SHAPES:
        if (n, h, v) != SHAPES[0]:
            x, w, t = make_inputs(n, h, v)
        ref = reference(x, w, t)
        for tma, defer in [(False, False), (True, False), (True, True)]:
            _toggle(tma, defer)
            ms, peak, errs = measure(kflce.fused_linear_cross_entropy, x, w, t, ref)
            say(
                f"{n},{h},{v} fwd+bwd tma={int(tma)} defer={int(defer)}",
                (
                    round(ms, 2),
                    round(6 * n * h * v / ms / 1e9),
                    round(peak, 3),
                    f"gx {errs['grad_input']:.3e} gw {errs['grad_weight']:.3e}",
                ),
            )
        _toggle(True, True)
        gc.collect()
        torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="flce-bench.json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip", default="", help="comma-separated impls to skip")
    ap.add_argument("--breakdown", action="store_true", help="only time the stages of a chunk")
    ap.add_argument("--variants", action="store_true", help="only the speed-pass probe")
    ap.add_argument("--gemm-only", action="store_true", help="with --variants: grad_W configs only")
    args = ap.parse_args()
    if args.variants:
        torch.backends.cuda.matmul.allow_tf32 = False
        with open(args.out, "w") as f:
            json.dump(speed_probe(gemm_only=args.gemm_only), f, indent=1, default=str)
        return
    if args.breakdown:
        res = breakdown()
        for k, val in res.items():
            print(f"{k:>40} {val}")
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    t_start = time.time()
    result = {
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(),
        "versions": {
            "torch": torch.__version__,
            "triton": triton.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
        },
        "command": " ".join(sys.argv),
        "flop_model": "6*N*H*V",
        "inputs": "x~N(0,1), W~N(0,1/H), bf16; 10% of targets = ignore_index; reduction mean",
    }
    for pkg in ("liger_kernel", "cut_cross_entropy"):
        try:
            mod = __import__(pkg)
            result["versions"][pkg] = getattr(mod, "__version__", "installed")
        except Exception:
            pass
    ceil = matmul_ceiling()
    result["matmul_ceiling_tflops"] = ceil
    print(f"bf16 matmul ceiling {ceil:.0f} TFLOP/s")
    result["gemm_probe"] = gemm_probe()
    for k, val in result["gemm_probe"].items():
        print("gemm probe", k, val)
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
                fn = kflce.fused_linear_cross_entropy
                kflce.GW_ACCUMULATION = "cublas"
            elif fn == "+1":
                c = -(-n // kflce.plan_rows(n, v, 2, kflce.DEFAULT_MEMORY_BUDGET_BYTES)) + 1
                r = math.ceil(math.ceil(n / c) / 128) * 128

                def fn(x, w, t, _b=r * v * 2):
                    return kflce.fused_linear_cross_entropy(x, w, t, memory_budget_bytes=_b)

            elif fn == "1g":

                def fn(x, w, t):
                    return kflce.fused_linear_cross_entropy(x, w, t, memory_budget_bytes=GiB)

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
            kflce.GW_ACCUMULATION = "auto"
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
            ms, peak, _ = measure(kflce.fused_linear_cross_entropy, x, w, t)
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
                "rows_per_chunk": kflce.plan_rows(n, 128256, 2, kflce.DEFAULT_MEMORY_BUDGET_BYTES),
            }
            print(json.dumps(row), flush=True)
            sweep.append(row)
            del x, w, t
            torch.cuda.empty_cache()
    result["results"] = rows
    result["sweep"] = sweep
    result["wall_s"] = time.time() - t_start
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
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
