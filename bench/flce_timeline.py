"""Where the vocabulary schedule's wall time goes beyond its kernels: the GPU's idle gaps.

bench/flce_profile.py sums kernel time per family; at the leanest budget that sum came to
45.6 ms at N=8192, H=4096, V=128256 while bench/flce.py's do_bench median was 52.5 ms (H100,
2026-12-07). This times one forward + backward four ways (do_bench with L2 flushes, events
around a synchronised step, back-to-back steps, the host's time to enqueue a step) and, from
a profiler trace of back-to-back steps, lists the GPU's idle gaps: how long, between which
kernels, which host call launched the kernel after the gap and how late, and the host
synchronisations. Clocks and power are sampled by nvidia-smi while it runs.

    python3 bench/flce_timeline.py --out $OUT/flce-timeline.json [--shapes 1,2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

import torch
from common import median_ms, run_meta, save_json
from flce_profile import bench_inputs
from flce_sweep import BUDGET, SHAPES, SHIPPED
from torch.profiler import ProfilerActivity, profile

from kassay.kernels import fused_linear_cross_entropy

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# host calls that can wait for the GPU (cudaMemcpyAsync to pageable memory does too)
SYNC_CALLS = ("Synchronize", "cudaMemcpy", "cudaStreamWaitEvent")


def make_step(x, w, t, cfg):
    def step():
        fused_linear_cross_entropy(x, w, t, memory_budget_bytes=BUDGET, config=cfg).backward()
        x.grad = w.grad = None

    return step


def timings(step) -> dict:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    synced, host = [], []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        h0 = time.perf_counter()
        step()
        host.append((time.perf_counter() - h0) * 1e3)
        b.record()
        torch.cuda.synchronize()
        synced.append(a.elapsed_time(b))
    reps = 10
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        step()
    torch.cuda.synchronize()
    b2b = (time.perf_counter() - t0) / reps * 1e3
    db = median_ms(step, warmup=100, rep=800)
    return {
        "do_bench_ms": round(db, 3),
        "synced_event_ms": round(statistics.median(synced), 3),
        "back_to_back_ms": round(b2b, 3),
        "host_enqueue_ms": round(statistics.median(host), 3),
    }


def gaps(step, steps: int = 3) -> dict:
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        ev = json.load(f)["traceEvents"]
    gpu = sorted((e for e in ev if e.get("cat") in GPU_CATS and "dur" in e), key=lambda e: e["ts"])
    runtime = [e for e in ev if e.get("cat") == "cuda_runtime" and "dur" in e]
    by_corr = {e["args"].get("correlation"): e for e in runtime if "args" in e}
    ops = sorted((e for e in ev if e.get("cat") == "cpu_op" and "dur" in e), key=lambda e: e["ts"])

    def op_of(ts: float) -> str:
        best = ""
        for o in ops:  # the innermost cpu_op around ts (a few thousand ops: fine)
            if o["ts"] <= ts <= o["ts"] + o["dur"]:
                best = o["name"]
            elif o["ts"] > ts:
                break
        return best

    busy = sum(e["dur"] for e in gpu)
    span = gpu[-1]["ts"] + gpu[-1]["dur"] - gpu[0]["ts"]
    rows = []
    end = gpu[0]["ts"] + gpu[0]["dur"]
    prev = gpu[0]
    for e in gpu[1:]:
        g = e["ts"] - end
        if g > 5:
            launch = by_corr.get(e.get("args", {}).get("correlation"))
            rows.append(
                {
                    "gap_us": round(g, 1),
                    "after": prev["name"][:60],
                    "before": e["name"][:60],
                    "launched_by": launch["name"] if launch else "",
                    "launch_lead_us": round(e["ts"] - launch["ts"], 1) if launch else None,
                    "op": op_of(launch["ts"]) if launch else "",
                }
            )
        if e["ts"] + e["dur"] > end:
            end, prev = e["ts"] + e["dur"], e
    syncs: dict[str, list[float]] = {}
    for e in runtime:
        if any(s in e["name"] for s in SYNC_CALLS):
            syncs.setdefault(e["name"], []).append(e["dur"])
    by_op: dict[str, float] = {}
    for r in rows:
        key = r["op"] or r["launched_by"]
        by_op[key] = by_op.get(key, 0) + r["gap_us"]
    return {
        "steps": steps,
        "gpu_busy_ms_per_step": round(busy / steps / 1e3, 3),
        "gpu_span_ms_per_step": round(span / steps / 1e3, 3),
        "idle_ms_per_step": round((span - busy) / steps / 1e3, 3),
        "gaps_over_5us": len(rows),
        "idle_by_next_op_ms": {
            k: round(v / steps / 1e3, 3) for k, v in sorted(by_op.items(), key=lambda kv: -kv[1])
        },
        "largest_gaps": sorted(rows, key=lambda r: -r["gap_us"])[:25],
        "host_syncs": {k: [len(v), round(sum(v) / 1e3, 3)] for k, v in syncs.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="1,2")
    args = ap.parse_args()
    smi = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader",
         "-lms", "200"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    res = {
        **run_meta(),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "runs": [],
    }
    for i in (int(s) for s in args.shapes.split(",")):
        n, h, v = SHAPES[i - 1]
        x, w, t, _ = bench_inputs(n, h, v)
        step = make_step(x, w, t, SHIPPED)
        row = {"N": n, "H": h, "V": v, "config": "shipped", **timings(step), **gaps(step)}
        res["runs"].append(row)
        print(json.dumps({k: row[k] for k in row if k != "largest_gaps"}), flush=True)
        save_json(res, args.out)  # after each shape: a later one's crash keeps this one
        del x, w, t
        torch.cuda.empty_cache()
    smi.terminate()
    samples = [s.split(", ") for s in smi.communicate()[0].splitlines() if s.count(",") == 2]
    res["smi_samples"] = samples
    save_json(res, args.out)


if __name__ == "__main__":
    main()
