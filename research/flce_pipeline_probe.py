"""Probe: the non-GEMM parts of one flce fwd+bwd (CE kernel grid, the target check's sync, idle
gaps between kernels) on the H200.

  ce       the CE kernel alone (pass 1 + in-place dlogits) on one chunk of each target shape
           (1792 x 128256 and 960 x 256000, bf16) for grid configurations (programs per SM,
           0 = one program per row; BLOCK_V; warps), interleaved over rounds; checks every
           configuration's results against the shipped one's (max abs difference)
  fwdbwd   kassay fwd+bwd at both target shapes, as shipped and with the fastest CE
           configuration of the first part for that shape; with --sync instead: "sync" (the target
           check as it was, a `bool(bad.any())` before the call), "deferred" (as shipped, CE
           kernel as it was: one program per row) and "deferred + CE best"
  profile  the kernels of one fwd+bwd (torch.profiler, summed by name), their sum against the
           wall time, and the largest idle gaps between consecutive kernels
  trace    a Chrome trace (host ops and kernels) of two fwd+bwd at the first shape, written next
           to --out as *.trace.json

    PYTHONPATH=service python3 research/flce_pipeline_probe.py --out FILE
"""

from __future__ import annotations

import functools
import itertools
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_common import ce_chunk, make_inputs, measure, probe_parser, run_meta, save

from kassay.kernels import _flce_launch as kl
from kassay.kernels import flce as kflce
from kassay.kernels.flce import FlceConfig

SHAPES = [(8192, 4096, 128256), (8192, 2304, 256000)]
CE_CHUNKS = {(8192, 4096, 128256): 1792, (8192, 2304, 256000): 960}

_D = FlceConfig()
SHIPPED = (_D.ce_config_long_gpu[2], _D.ce_config_long_gpu[0], _D.ce_config_long_gpu[1], _D.ce_pair)
CE_CONFIGS = [  # (programs per SM, BLOCK_V, num_warps, pair) for rows of >= CE_LONG_ROW_V columns
    SHIPPED,
    (1, 8192, 32, False),  # shipped 2026-12-02 (second device call)
    (0, 4096, 16, False),  # one program per row: the default until then
    (1, 8192, 32, True),
    (1, 4096, 32, True),
    (1, 8192, 16, True),
    (0, 4096, 16, True),
    (2, 4096, 16, True),
    (1, 16384, 32, False),
    (1, 16384, 32, True),
    (2, 8192, 16, True),
    (1, 4096, 16, True),
]
CE_CONFIGS = list(dict.fromkeys(CE_CONFIGS))  # the shipped one may also be listed
BY_NAME = {str(c): c for c in CE_CONFIGS}


def _ce_config(cfg) -> FlceConfig:
    """The FlceConfig running the CE kernel with (programs per SM, BLOCK_V, warps, pair)."""
    per_sm, block_v, warps, pair = cfg
    return FlceConfig(ce_config_long_gpu=(block_v, warps, per_sm), ce_pair=pair)


def ce(rounds: int) -> dict:
    res: dict = {}
    for (n, _h, v), rows in CE_CHUNKS.items():
        z0, t, scale, f32, z = ce_chunk(rows, v, n)

        def run(z=z, t=t, scale=scale, f32=f32, v=v, cfg=_D):
            kl._launch_ce(
                z, t, *f32, scale, False, V=v, ignore_index=-100, label_smoothing=0.0,
                z_loss_scale=0.0, softcap=None, compute_grad=True, cfg=cfg,
            )  # fmt: skip

        key = f"{rows}x{v}"
        res[key] = {"ms": {}, "max_abs_diff_to_default": {}}
        ref = None
        for cfg in CE_CONFIGS:
            z.copy_(z0)
            run(cfg=_ce_config(cfg))
            if ref is None:
                ref = (z.clone(), [a.clone() for a in f32])
            # same bits only where BLOCK_V and warps match (they set the reduction order)
            res[key]["max_abs_diff_to_default"][str(cfg)] = {
                "dlogits": float((z.float() - ref[0].float()).abs().max()),
                "lse": float((f32[2] - ref[1][2]).abs().max()),
                "loss": float((f32[0] - ref[1][0]).abs().max()),
            }
        for r in range(rounds):
            for cfg in CE_CONFIGS:
                fn = lambda c=_ce_config(cfg): run(cfg=c)  # noqa: E731
                res[key]["ms"].setdefault(str(cfg), []).append(round(do_bench(fn, rep=100), 4))
            print(key, "round", r, {c: m[-1] for c, m in res[key]["ms"].items()}, flush=True)
        gb = 3 * rows * v * 2 / 1e9
        med = {c: sorted(m)[len(m) // 2] for c, m in res[key]["ms"].items()}
        res[key]["tb_per_s_of_median_3_passes"] = {c: round(gb / m, 2) for c, m in med.items()}
        res[key]["best"] = min(med, key=med.__getitem__)
        print(key, "best", res[key]["best"], res[key]["max_abs_diff_to_default"], flush=True)
        del z0, z, ref
        torch.cuda.empty_cache()
    return res


def _sync_check_first(x, w, t, config=None):
    # the target check as it was before: a host sync on the flag before any kernel is queued
    bool((((t < 0) & (t != -100)) | (t >= w.shape[0])).any())
    return kflce.fused_linear_cross_entropy(x, w, t, config=config)


def fwdbwd(rounds: int, ce_best: dict, sync: bool) -> dict:
    res: dict = {}
    for n, h, v in SHAPES:
        x, w, t = make_inputs(n, h, v)
        flop = 6 * n * h * v
        key = f"{n},{h},{v}"
        best = ce_best.get(f"{CE_CHUNKS[(n, h, v)]}x{v}")
        variants = [("shipped", None, str(SHIPPED))]
        if best and best != str(SHIPPED):
            variants.append((f"CE {best}", None, best))
        if sync:
            old_ce = str((0, 4096, 16, False))
            variants = [("sync", _sync_check_first, old_ce), ("deferred", None, old_ce)]
            variants += [(f"deferred + CE {best}", None, best)] if best else []
        res[key] = {}
        for r in range(rounds):
            for name, fn, cfg in variants:
                call = functools.partial(
                    fn or kflce.fused_linear_cross_entropy, config=_ce_config(BY_NAME[cfg])
                )
                ms, peak, _ = measure(call, x, w, t)
                res[key].setdefault(name, []).append(
                    [round(ms, 3), round(flop / ms / 1e9, 1), round(peak, 4)]
                )
                print(key, "round", r, name, f"{ms:.3f} ms {peak:.4f} GiB", flush=True)
    return res


def profile(iters: int = 3) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    res: dict = {}
    for n, h, v in SHAPES:
        x, w, t = make_inputs(n, h, v)
        xr = x.detach().clone().requires_grad_()
        wr = w.detach().clone().requires_grad_()

        def step(xr=xr, wr=wr, t=t):
            kflce.fused_linear_cross_entropy(xr, wr, t).backward()
            xr.grad = wr.grad = None

        for _ in range(2):
            step()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
            e0.record()
            for _ in range(iters):
                step()
            e1.record()
            torch.cuda.synchronize()
        wall = e0.elapsed_time(e1) / iters
        evs = sorted(
            (e for e in prof.events() if e.device_type.name == "CUDA"),
            key=lambda e: e.time_range.start,
        )
        kern: dict = {}
        for ev in evs:
            k = kern.setdefault(ev.name[:90], [0, 0.0])
            k[0] += 1
            k[1] += ev.device_time_total / 1000.0
        gaps = []
        for a, b in itertools.pairwise(evs):
            gaps.append(
                [
                    round((b.time_range.start - a.time_range.end) / 1000.0, 4),
                    a.name[:50],
                    b.name[:50],
                ]
            )
        gaps.sort(key=lambda g: -g[0])
        rows = sorted(
            ([nm, c / iters, round(ms / iters, 3)] for nm, (c, ms) in kern.items()),
            key=lambda r: -r[2],
        )
        busy = sum(r[2] for r in rows)
        key = f"{n},{h},{v}"
        res[key] = {
            "wall_ms_per_iter": round(wall, 3),
            "kernel_ms_per_iter": round(busy, 3),
            "gap_ms_per_iter": round(sum(max(g[0], 0.0) for g in gaps) / iters, 3),
            "largest_gaps_ms": gaps[:12],
            "kernels": rows,
        }
        print(key, f"wall {wall:.3f} ms, kernels {busy:.3f} ms", flush=True)
        for g in gaps[:8]:
            print(f"   gap {g[0]:.3f} ms  {g[1]} -> {g[2]}", flush=True)
    return res


def trace(path: Path, iters: int = 2) -> None:
    """Chrome trace (host ops + kernels) of `iters` back-to-back fwd+bwd at the first shape, to
    see what the host was doing while the GPU sat idle between kernels."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    n, h, v = SHAPES[0]
    x, w, t = make_inputs(n, h, v)
    xr = x.detach().clone().requires_grad_()
    wr = w.detach().clone().requires_grad_()

    def step():
        kflce.fused_linear_cross_entropy(xr, wr, t).backward()
        xr.grad = wr.grad = None

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))


def main() -> int:
    ap = probe_parser(__doc__)
    ap.add_argument("--parts", default="ce,fwdbwd,profile")
    ap.add_argument(
        "--sync", action="store_true", help="fwdbwd: the host-synced target check vs deferred"
    )
    args = ap.parse_args()
    parts = args.parts.split(",")
    out: dict = run_meta()
    ce_best: dict = {}
    if "ce" in parts:
        out["ce"] = ce(args.rounds)
        ce_best = {k: r["best"] for k, r in out["ce"].items()}
    if "fwdbwd" in parts:
        out["fwdbwd_ms_tflops_gib"] = fwdbwd(max(1, args.rounds - 1), ce_best, args.sync)
    if "profile" in parts:
        out["profile"] = profile()
    if "trace" in parts and args.out:
        trace(args.out.with_suffix(".trace.json"))
    save(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
