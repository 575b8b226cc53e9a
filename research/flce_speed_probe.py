"""Speed-pass probes of kassay's flce (formerly `bench/flce.py --breakdown / --variants` and the
grad_W GEMM probe of every full bench run), on one CUDA GPU:

  --breakdown   time each stage of one default-size chunk (logits GEMM, CE kernel, grad_x GEMM,
                grad_W kernel and some of its plain-kernel configs, finalize)
  --variants    grad_W GEMM kernels/configs on one chunk (checked against each other), cuBLAS
                logits / grad_x GEMMs at several row counts, a two-stream overlap probe, and
                fwd+bwd with the TMA kernel and the deferred last chunk off and on
                (--gemm-only: the grad_W configs alone)
  --gemm        the grad_W GEMM alone: cuBLAS addmm_ (bf16) against kassay's Triton configs

Each variant is a `FlceConfig` passed to the private launchers (no global is changed).

    PYTHONPATH=service python3 research/flce_speed_probe.py --variants --out FILE
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_common import SHAPES, make_inputs, measure, reference

from kassay.kernels import _flce_launch as L
from kassay.kernels.flce import (
    DEFAULT_MEMORY_BUDGET_BYTES,
    FlceConfig,
    fused_linear_cross_entropy,
    plan_rows,
)

SHIPPED = FlceConfig()


def _plain(tiles: tuple | None = None) -> FlceConfig:
    """The plain (pointer) grad_W kernel, with `tiles` as its GEMM config when given."""
    return FlceConfig(use_tma_gemm=False, **({"gemm_config_gpu": tiles} if tiles else {}))


def gemm_probe(rows=1664, h=4096, v=128256):
    """grad_W GEMM alone, one chunk: cuBLAS addmm_ bf16 vs kassay's Triton (f16 acc) configs."""
    z = torch.randn(rows, v, device="cuda", dtype=torch.bfloat16) * 1e-3
    xc = torch.randn(rows, h, device="cuda", dtype=torch.bfloat16)
    acc_bf = torch.zeros(v, h, device="cuda", dtype=torch.bfloat16)
    res = {"cublas_addmm_bf16": do_bench(lambda: acc_bf.addmm_(z.t(), xc), rep=300)}
    acc16 = torch.zeros(v, h, device="cuda", dtype=torch.float16)
    one = torch.ones(1, device="cuda")
    res["triton_tma" + str(SHIPPED.gemm_tma_config_gpu)] = do_bench(
        lambda: L._launch_gemm_tn(z, xc, acc16, one, True), rep=300
    )
    # the plain (pointer) kernel's configs
    for cfg in [
        (128, 256, 64, 8, 8, 3),
        (128, 256, 64, 8, 8, 4),
        (256, 128, 64, 8, 8, 3),
        (128, 128, 64, 8, 4, 4),
        (128, 256, 32, 8, 8, 4),
    ]:
        try:
            res["triton" + str(cfg)] = do_bench(
                lambda c=_plain(cfg): L._launch_gemm_tn(z, xc, acc16, one, True, cfg=c), rep=300
            )
        except Exception as e:
            res["triton" + str(cfg)] = repr(e)[:200]
    flop = 2 * rows * h * v
    return {k: (val, flop / val / 1e9) if isinstance(val, float) else val for k, val in res.items()}


def breakdown(n=8192, h=4096, v=128256):
    """Time each stage of one default-size chunk (ms), to place the gap to the GEMM floor."""
    x, w, t = make_inputs(n, h, v)
    rows = plan_rows(n, v, 2, DEFAULT_MEMORY_BUDGET_BYTES)
    xc, tc = x[:rows], t[:rows]
    z = torch.empty(rows, v, device="cuda", dtype=torch.bfloat16)
    f32 = [torch.empty(rows, device="cuda") for _ in range(3)]
    one = torch.ones(1, device="cuda")
    gx = torch.empty(rows, h, device="cuda", dtype=torch.bfloat16)
    acc = torch.zeros(v, h, device="cuda", dtype=torch.float16)
    torch.mm(xc, w.t(), out=z)

    def ce():
        L._launch_ce(
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
        "finalize_1x": do_bench(lambda: L._launch_finalize(acc, acc, one), rep=200),
    }
    z.normal_().mul_(1e-3)
    res["grad_w_triton"] = do_bench(lambda: L._launch_gemm_tn(z, xc, acc, one, True), rep=200)
    # the plain kernel's configs (grad_w_triton above is the default path)
    for cfg in [
        (128, 256, 64, 8, 8, 2),
        (128, 256, 64, 16, 8, 3),
        (128, 256, 64, 4, 8, 3),
        (64, 256, 64, 8, 4, 4),
        (128, 128, 128, 8, 8, 3),
    ]:
        try:
            res["grad_w_triton" + str(cfg)] = do_bench(
                lambda c=_plain(cfg): L._launch_gemm_tn(z, xc, acc, one, True, cfg=c), rep=200
            )
        except Exception as e:
            res["grad_w_triton" + str(cfg)] = repr(e)[:120]
    # CE kernel with gradient (pass 2 writes dlogits in place)
    res["ce_kernel_fwd_bwd"] = do_bench(
        lambda: L._launch_ce(
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
        for kind, cfg in cfgs:
            run_cfg = FlceConfig(gemm_tma_config_gpu=cfg) if kind == "tma" else _plain(cfg)
            name = f"{rows},{h},{v} {kind}{cfg}"
            try:
                acc.copy_(c0)
                L._launch_gemm_tn(z, xc, acc, sc, True, cfg=run_cfg)
                err = float((acc.float() - ref).norm() / ref.norm())
                t = do_bench(lambda: L._launch_gemm_tn(z, xc, acc, sc, True, cfg=run_cfg), rep=100)  # noqa: B023
                say(name, (round(t, 3), round(flop / t / 1e9), f"err {err:.1e}"))
            except Exception as e:
                say(name, repr(e)[:160])
        # FINAL epilogue (bf16 out aliasing the f16 accumulator) against the same reference
        acc.copy_(c0)
        o = acc.view(torch.bfloat16)
        L._launch_gemm_tn(z, xc, acc, sc, True, out=o, fin=torch.full((1,), 0.5, device="cuda"))
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
        L._launch_ce(
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
            run_cfg = FlceConfig(use_tma_gemm=tma, defer_last_gw=defer)

            def fn(x, w, t, c=run_cfg):
                return fused_linear_cross_entropy(x, w, t, config=c)

            ms, peak, errs = measure(fn, x, w, t, ref)
            say(
                f"{n},{h},{v} fwd+bwd tma={int(tma)} defer={int(defer)}",
                (
                    round(ms, 2),
                    round(6 * n * h * v / ms / 1e9),
                    round(peak, 3),
                    f"gx {errs['grad_input']:.3e} gw {errs['grad_weight']:.3e}",
                ),
            )
        gc.collect()
        torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="flce-speed-probe.json")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--breakdown", action="store_true", help="time the stages of a chunk")
    mode.add_argument("--variants", action="store_true", help="the speed-pass probe")
    mode.add_argument("--gemm", action="store_true", help="the grad_W GEMM probe alone")
    ap.add_argument("--gemm-only", action="store_true", help="with --variants: grad_W configs only")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.variants:
        res = speed_probe(gemm_only=args.gemm_only)
    elif args.breakdown:
        res = breakdown()
    else:
        res = gemm_probe()
    for k, val in res.items():
        print(f"{k:>40} {val}")
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
