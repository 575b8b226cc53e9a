"""Does kassay's engine time what the standard tools time? (CUDA only.)

Times the same calls four ways and writes a JSON with the table:
- engine: kassay.validate.timing.time_call (device time; mode graph or events), and its wall time;
- triton.testing.do_bench (events per repetition, cache cleared before each);
- torch.utils.benchmark.Timer (host wall clock with a synchronize per call: blocked_autorange);
- the profiler: summed durations of the device activities CUPTI records (the reference).

Calls: a plain 1 GiB device copy; kassay's merge at T=1024 and 32768 with K=2 and 8 (Hh=32,
D=128, bf16); a float32 4096^3 matmul; kassay's FLCE forward + backward at N=8192 H=4096
V=128256 bf16. Target: engine device time within 3% of the profiler for calls of >= 20 us,
within 5 us below that.

    PYTHONPATH=service python3 bench/timing_fidelity.py --out bench/results/timing-fidelity-h200-DATE.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from datetime import datetime, timezone

import torch


def _calls(dev: torch.device) -> list[tuple[str, Callable[[], object]]]:
    from kassay.kernels import fused_linear_cross_entropy, merge_states

    g = torch.Generator(device=dev).manual_seed(0)
    out: list[tuple[str, Callable[[], object]]] = []
    src = torch.randn(1 << 28, device=dev, generator=g)
    dst = torch.empty_like(src)
    out.append(("copy 1 GiB fp32", lambda: dst.copy_(src)))
    for T in (1024, 32768):
        for K in (2, 8):
            outs = torch.randn(K, T, 32, 128, device=dev, generator=g).to(torch.bfloat16)
            lses = torch.randn(K, 32, T, device=dev, generator=g)
            out.append(
                (
                    f"kassay merge T={T} K={K} bf16",
                    lambda outs=outs, lses=lses: merge_states(outs, lses),
                )
            )
    a = torch.randn(4096, 4096, device=dev, generator=g)
    b = torch.randn(4096, 4096, device=dev, generator=g)
    out.append(("matmul 4096^3 fp32", lambda: a @ b))
    N, H, V = 8192, 4096, 128256
    x = (torch.randn(N, H, device=dev, generator=g) * 0.5).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(V, H, device=dev, generator=g) / H**0.5).to(torch.bfloat16).requires_grad_()
    t = torch.randint(0, V, (N,), device=dev, generator=g)

    def flce() -> None:
        x.grad = None
        w.grad = None
        fused_linear_cross_entropy(x, w, t).backward()

    out.append((f"kassay flce N={N} H={H} V={V} bf16 fwd+bwd", flce))
    return out


def _torch_benchmark_ms(fn: Callable[[], object]) -> float:
    from torch.utils import benchmark

    def synced() -> None:
        fn()
        torch.cuda.synchronize()

    m = benchmark.Timer(stmt="fn()", globals={"fn": synced}).blocked_autorange(min_run_time=1.0)
    return float(m.median * 1e3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import triton
    import triton.testing

    from kassay.contract.spec import TimingPolicy
    from kassay.validate.timing import profiler_device_ms, time_call

    dev = torch.device("cuda")
    policy = TimingPolicy(warmup=3, min_reps=20, max_reps=2000, budget_s=3.0, target_rel_sem=0.005)
    rows = []
    for name, fn in _calls(dev):
        engine = time_call(fn, dev, policy)
        do_bench = float(triton.testing.do_bench(fn, warmup=50, rep=500, return_mode="median"))
        tb = _torch_benchmark_ms(fn)
        prof = profiler_device_ms(fn, reps=20)
        err = engine.median_ms - prof
        ok = abs(err) <= 0.005 if prof < 0.020 else abs(err) / prof <= 0.03
        rows.append(
            {
                "call": name,
                "engine_device_ms": engine.median_ms,
                "engine_mode": engine.mode,
                "engine_graph_fallback": engine.graph_fallback,
                "engine_wall_ms": engine.wall_median_ms,
                "engine_host_overhead_ms": engine.host_overhead_ms,
                "engine_n": engine.n,
                "engine_sm_clock_mhz": engine.sm_clock_mhz,
                "engine_power_w": engine.power_w,
                "engine_throttle_reasons": engine.throttle_reasons,
                "engine_power_capped": engine.power_capped,
                "do_bench_ms": do_bench,
                "torch_benchmark_wall_ms": tb,
                "profiler_ms": prof,
                "engine_vs_profiler": engine.median_ms / prof - 1,
                "within_target": ok,
            }
        )
        print(
            f"{name:45s} engine {engine.median_ms:9.4f} ({engine.mode:6s}) wall "
            f"{engine.wall_median_ms:9.4f}  do_bench {do_bench:9.4f}  torch.bench {tb:9.4f}  "
            f"profiler {prof:9.4f}  {'ok' if ok else 'OFF'}",
            flush=True,
        )
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "command": "PYTHONPATH=service python3 bench/timing_fidelity.py --out ...",
        "policy": policy.model_dump(),
        "target": "engine device time within 3% of the profiler (>= 20 us), 5 us below",
        "rows": rows,
        "all_within_target": all(r["within_target"] for r in rows),
    }
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"wrote {args.out} at {time.strftime('%H:%M:%S')}")


if __name__ == "__main__":
    main()
