"""Benchmark of fused linear cross-entropy (forward + backward, bf16) on one CUDA GPU.

Times kassay, torch eager, torch.compile, Liger-Kernel and Cut Cross-Entropy at
N=8192,H=4096,V=128256 and N=8192,H=2304,V=256000, plus kassay's N sweep at its default memory
budget; reports ms (median, L2 flushed), TFLOP/s (6·N·H·V), fraction of the bf16 matmul ceiling
measured in the same run, peak extra GiB (max_memory_allocated minus before) and the rel-L2 error
of loss, grad_input and grad_weight against a float64 reference computed chunked on the GPU.

    PYTHONPATH=service python3 bench/flce.py --out bench/results/flce-h200-<date>.json

Two more modes:
  --budgets  the time-memory curve: kassay over a sweep of memory budgets (logits chunks of
             --min-rows rows up to 3 GiB; kassay accepts any budget down to one row, each
             chunk re-reads W three times, so chunks below ~64 rows only get slower) at both
             target shapes, with every peer's (time, peak memory) point from the same run.
             Plot it on any machine with matplotlib: python3 bench/flce_plot.py <json>.
  --ab       kassay's default call only (both shapes, repeated do_bench medians): the speed
             half of an A/B of two versions (research/NOTES-probes.md (flce_package_ab) runs both, alternating).

Why it times on its own and not through `kassay run`: it sweeps kassay's FlceConfig (memory
budget, chunk rows) and reads peak memory per configuration, which the engine's `kassay` impl
(the default call) does not expose. Its do_bench medians agree with the engine's device time on
the same call within 2.2% (bench/README.md, "Timing fidelity": 41.27 vs 42.18 ms at the first
target shape). The side-by-side tables users see come from `kassay run examples/h200.yaml`.

Needs only torch + triton (+ liger-kernel / cut-cross-entropy when installed). Uses kassay's
public API only (`kassay.kernels`); the stage breakdown and GEMM probes that reach into the
launchers are in research/NOTES-probes.md (flce_speed_probe).
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
from kassay.kernels.flce import plan_rows, plan_schedule

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
    if hasattr(F, "linear_cross_entropy"):  # torch's own chunked FLCE, from torch 2.13
        out["torch_native"] = lambda x, w, t: F.linear_cross_entropy(x, w, t)
    else:
        print(f"torch_native unavailable: torch {torch.__version__} has no F.linear_cross_entropy")
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


#: logits-chunk rows of the --budgets sweep (budget = rows * V * 2 bytes, kept up to 3 GiB)
BUDGET_ROWS = [16, 32, 64, 128, 256, 384, 512, 768, 1024, 1280, 1536, 1792, 2048, 2560, 3072,
               4096, 5120, 6144, 8192]  # fmt: skip
MAX_BUDGET = 3 * GiB


def budget_points(n: int, v: int, min_rows: int) -> list[tuple[int, int]]:
    """(budget bytes, rows per chunk) of the sweep: distinct chunk plans, budgets <= 3 GiB."""
    out, seen = [], set()
    for r in sorted({min_rows} | {r for r in BUDGET_ROWS if r >= min_rows}):
        b = r * v * 2
        if b > MAX_BUDGET:
            break
        rows = plan_rows(n, v, 2, b)
        if rows not in seen:
            seen.add(rows)
            out.append((b, rows))
    return out


#: vocabulary-panel widths of the sweep (budget = N * cols * 2 bytes)
VOCAB_COLS = [64, 128, 256, 384, 512, 768, 1024, 2048, 4096, 8192]


def vocab_points(n: int, v: int) -> list[tuple[int, int]]:
    """(budget bytes, columns per panel) of the vocabulary schedule's sweep."""
    out, seen = [], set()
    for c in VOCAB_COLS:
        b = n * c * 2
        cols = plan_schedule(n, 1, v, 2, b, schedule="vocab").cols
        if cols not in seen:
            seen.add(cols)
            out.append((b, cols))
    return out


ROWS_CFG = FlceConfig(schedule="rows")
VOCAB_CFG = FlceConfig(schedule="vocab")


def run_budgets(args, result):
    """kassay at every budget of the sweep and each peer once, per target shape.

    Per shape, what the verdicts need most comes first (the vocabulary schedule, then the peers,
    then the row schedule's sweep, then the options A/B), and the result file is rewritten after
    every point (`"partial": true` until the end): a device call cut short keeps what it ran."""
    curve, peers = [], []
    result["matmul_ceiling_tflops"] = matmul_ceiling()
    print(f"bf16 matmul ceiling {result['matmul_ceiling_tflops']:.0f} TFLOP/s", flush=True)
    skip = set(filter(None, args.skip.split(",")))

    def keep(row, into):
        into.append(row)
        save_json({**result, "curve": curve, "peers": peers, "partial": True}, args.out)

    for n, h, v in SHAPES[:1] if args.quick else SHAPES:
        x, w, t = make_inputs(n, h, v)
        ref = reference(x, w, t)
        torch.cuda.empty_cache()
        for budget, cols in vocab_points(n, v):

            def fn(x, w, t, _b=budget):
                return fused_linear_cross_entropy(x, w, t, memory_budget_bytes=_b, config=VOCAB_CFG)

            row = _point(fn, x, w, t, ref, n, h, v, "kassay")
            row.update(schedule="vocab", budget_bytes=budget, cols_per_panel=cols)
            row.update(panels=-(-v // cols), tflops_8nhv=8 * n * h * v / row.get("ms", 1) / 1e9)
            keep(row, curve)
        for name, fn in impls().items():
            if name != "kassay" and name not in skip:
                keep(_point(fn, x, w, t, ref, n, h, v, name), peers)
        for budget, rows in budget_points(n, v, args.min_rows):

            def fn(x, w, t, _b=budget):
                return fused_linear_cross_entropy(x, w, t, memory_budget_bytes=_b, config=ROWS_CFG)

            row = _point(fn, x, w, t, ref, n, h, v, "kassay")
            row.update(
                schedule="rows", budget_bytes=budget, rows_per_chunk=rows, chunks=-(-n // rows)
            )
            keep(row, curve)
        if not args.quick or (n, h, v) == SHAPES[0]:
            options_ab(x, w, t, n, h, v, result)
        del x, w, t, ref
        gc.collect()
        torch.cuda.empty_cache()
    result["curve"] = curve
    result["peers"] = peers
    result["verdicts"] = curve_verdicts(curve, peers)
    for line in result["verdicts"]:
        print(line)


def _point(fn, x, w, t, ref, n, h, v, name):
    try:
        ms, peak, errs = measure(fn, x, w, t, ref)
        row = {"N": n, "H": h, "V": v, "impl": name, "ms": ms, "peak_extra_gib": peak}
        row.update(tflops=6 * n * h * v / ms / 1e9, rel_l2=errs)
    except Exception as e:  # a peer that fails (or runs out of memory) is a point too
        row = {"N": n, "H": h, "V": v, "impl": name, "error": repr(e)[:300]}
    print(json.dumps(row), flush=True)
    gc.collect()
    torch.cuda.empty_cache()
    return row


def curve_verdicts(curve, peers):
    """For each peer point: kassay's fastest point at no more memory than the peer's, and
    whether it is faster (the question the curve answers)."""
    lines = []
    for p in peers:
        if "error" in p:
            lines.append(f"{p['N']},{p['H']},{p['V']} {p['impl']}: error {p['error'][:80]}")
            continue
        mine = [
            c
            for c in curve
            if "error" not in c
            and (c["N"], c["H"], c["V"]) == (p["N"], p["H"], p["V"])
            and c["peak_extra_gib"] <= p["peak_extra_gib"]
        ]
        head = f"{p['N']},{p['H']},{p['V']} vs {p['impl']} ({p['ms']:.1f} ms, "
        head += f"{p['peak_extra_gib']:.2f} GiB): "
        if not mine:
            lines.append(head + "kassay has no point at this memory or less")
            continue
        best = min(mine, key=lambda c: c["ms"])
        verdict = "faster" if best["ms"] < p["ms"] else "NOT faster"
        lines.append(
            head + f"kassay {verdict}: {best['ms']:.1f} ms at {best['peak_extra_gib']:.2f} GiB "
            f"({_chunk(best)}, {p['ms'] / best['ms']:.2f}x)"
        )
    return lines


def _chunk(c) -> str:
    if c.get("schedule") == "vocab":
        return f"vocab schedule, {c['cols_per_panel']}-column panels"
    return f"row schedule, {c['rows_per_chunk']}-row chunks"


#: the options of the A/B: each alone, then all together (class weights need a [V] tensor)
OPTION_SETS = {
    "bias": {},
    "label_smoothing": {"label_smoothing": 0.1},
    "softcap": {"softcap": 30.0},
    "z_loss": {"z_loss_scale": 1e-4},
    "ce_weight": {"ce_weight": True},
    "token_scaling": {"use_token_scaling": True},
    "token_accuracy": {"return_token_accuracy": True},
    "reduction_none": {"reduction": "none"},
    "all": {
        "label_smoothing": 0.1, "softcap": 30.0, "z_loss_scale": 1e-4, "ce_weight": True,
        "use_token_scaling": True, "return_token_accuracy": True,
    },
}  # fmt: skip


def options_ab(x, w, t, n, h, v, result, repeats=3):
    """The vocabulary schedule's cost of each option over its plain call, at its leanest
    budget worth running (512-column panels), interleaved: plain, option, plain, option, ..."""
    b = torch.randn(v, device="cuda", dtype=torch.bfloat16) * 0.1
    cw = torch.rand(v, device="cuda") + 0.5
    budget = n * 512 * 2
    xr = x.detach().clone().requires_grad_()
    wr = w.detach().clone().requires_grad_()
    br = b.clone().requires_grad_()

    def make(opts):
        kw = {k: val for k, val in opts.items() if k != "ce_weight"}
        if opts.get("ce_weight"):
            kw["ce_weight"] = cw
        with_bias = opts is OPTION_SETS["bias"] or opts is OPTION_SETS["all"]

        def step():
            out = fused_linear_cross_entropy(
                xr, wr, t, br if with_bias else None, memory_budget_bytes=budget,
                config=VOCAB_CFG, **kw,
            )  # fmt: skip
            loss = out.loss if isinstance(out, tuple) else out
            (loss.sum() if loss.dim() else loss).backward()

        return step

    plain = make({})
    rows = []
    for name, opts in OPTION_SETS.items():
        step = make(opts)
        step()
        pm, om = [], []
        for _ in range(repeats):
            for fn, acc in ((plain, pm), (step, om)):
                acc.append(do_bench(fn, warmup=20, rep=300, grad_to_none=[xr, wr, br]))
        row = {"N": n, "H": h, "V": v, "option": name, "plain_ms": sorted(pm)[1]}
        row.update(option_ms=sorted(om)[1], cost=sorted(om)[1] / sorted(pm)[1] - 1.0)
        print(json.dumps(row), flush=True)
        rows.append(row)
    result.setdefault("options_ab", []).extend(rows)


def run_options(args, result):
    """The options A/B alone, both shapes (what `--budgets` runs after its curve)."""
    for n, h, v in SHAPES[:1] if args.quick else SHAPES:
        x, w, t = make_inputs(n, h, v)
        options_ab(x, w, t, n, h, v, result)
        del x, w, t
        gc.collect()
        torch.cuda.empty_cache()


def run_ab(args, result):
    """kassay's default call at both target shapes: `--ab-repeats` do_bench medians each."""
    rows = []
    for n, h, v in SHAPES:
        x, w, t = make_inputs(n, h, v)
        xr = x.detach().clone().requires_grad_()
        wr = w.detach().clone().requires_grad_()

        def step(xr=xr, wr=wr, t=t):
            fused_linear_cross_entropy(xr, wr, t).backward()

        step()
        torch.cuda.synchronize()
        samples = [
            do_bench(step, warmup=100, rep=1000, grad_to_none=[xr, wr], return_mode="median")
            for _ in range(args.ab_repeats)
        ]
        row = {"N": n, "H": h, "V": v, "impl": "kassay", "ms_samples": samples}
        row["ms"] = sorted(samples)[len(samples) // 2]
        print(json.dumps(row), flush=True)
        rows.append(row)
        del x, w, t, xr, wr
        gc.collect()
        torch.cuda.empty_cache()
    result["ab"] = rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="flce-bench.json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip", default="", help="comma-separated impls to skip")
    ap.add_argument("--budgets", action="store_true", help="the time-memory curve (see above)")
    ap.add_argument("--min-rows", type=int, default=16, help="--budgets: smallest chunk, rows")
    ap.add_argument("--ab", action="store_true", help="kassay's default call only (A/B)")
    ap.add_argument("--options", action="store_true", help="the options A/B only")
    ap.add_argument("--ab-repeats", type=int, default=5)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    t_start = time.time()
    result = {
        **run_meta(packages=("torch", "triton", "liger_kernel", "cut_cross_entropy")),
        "flop_model": "6*N*H*V",
        "inputs": "x~N(0,1), W~N(0,1/H), bf16; 10% of targets = ignore_index; reduction mean",
    }
    if args.ab or args.budgets or args.options:
        (run_ab if args.ab else run_options if args.options else run_budgets)(args, result)
        result["wall_s"] = time.time() - t_start
        save_json(result, args.out)
        return
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
