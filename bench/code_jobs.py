"""Code jobs against built-in jobs: what a CI job that brings its kernel pays (#42).

One `kassay serve`; the TransformerEngine seed grid (lse_merge, T=64 Hh=4 D=32, K in {2, 4},
float32 and bfloat16, mode merge, default coverage: 22 input groups) submitted four times:

  builtin-cold  impls torch, alt_logsumexp, alt_pairwise (built-ins of the same math as the two
                uploads, correct alternatives of the self-test's corpus): the float64 references computed
  builtin-warm  the same again: references from the worker's cache
  code          impls torch, up_merge, up_te: the last two from two uploaded single-file
                modules, run in the job's sandboxed impl runner (references cached)
  code-again    the same code job again: a new job gets a new runner

For each: wall time from submission to the job's end, cases, the mean case duration by where it
ran (trusted executor, sandbox), and for code jobs the runner's start as the worker logged it.
The overhead of code is code - builtin-warm; the target (#42) is code <= 2 x builtin-warm +
one runner start.

    python3 bench/code_jobs.py --out bench/results/code-jobs-DEVICE-DATE.json [--device cpu]

Run from the repository root with kassay installed (`make venv`: `.venv/bin/python`) or with
PYTHONPATH=service:client (the device machine).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import run_meta, save_json

from service import wait_ready

ROOT = Path(__file__).resolve().parents[1]

GRID = {
    "T": 64,
    "Hh": 4,
    "D": 32,
    "K": [2, 4],
    "dtype": ["float32", "bfloat16"],
    "mode": "merge",
}

#: two single-file impls a kernel repo might upload: a logsumexp merge and TransformerEngine's
#: max + log1p formula folded over the K states (both float32 math, written independently of
#: kassay's own impls)
UP_MERGE = """
import torch
from kassay.impls import Impl
from kassay.ops.lse_merge.harness import as_run, supports_modes


def _merge(outs, lses, *, lse_layout, accumulate):
    lse = lses.float() if lse_layout == "Th" else lses.float().transpose(1, 2)  # [K, T, Hh]
    lse = torch.where(torch.isposinf(lse), torch.full_like(lse, -torch.inf), lse)
    total = torch.logsumexp(lse, dim=0)
    safe = torch.where(torch.isfinite(total), total, torch.zeros_like(total))
    w = torch.exp(lse - safe).nan_to_num(0.0)
    out = (w[..., None] * outs.float()).sum(0)
    lse_out = total if lse_layout == "Th" else total.transpose(0, 1).contiguous()
    return out.to(outs.dtype), lse_out


def impls():
    return [Impl("lse_merge", "up_merge", as_run(merge=_merge), "uploaded: logsumexp merge",
                 supports=supports_modes(merge=True, update=False))]
"""

UP_TE = """
import torch
from kassay.impls import Impl
from kassay.ops.lse_merge.harness import as_run, supports_modes


def _merge(outs, lses, *, lse_layout, accumulate):
    lse = lses.float() if lse_layout == "Th" else lses.float().transpose(1, 2)
    lse = torch.where(torch.isposinf(lse), torch.full_like(lse, -torch.inf), lse)
    acc_lse, acc = lse[0], outs[0].float()
    for k in range(1, lse.shape[0]):
        mx, mn = torch.maximum(acc_lse, lse[k]), torch.minimum(acc_lse, lse[k])
        mx_safe = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
        new = torch.where(torch.isfinite(mx), mx + torch.log1p(torch.exp(mn - mx_safe)), mx)
        new_safe = torch.where(torch.isfinite(new), new, torch.zeros_like(new))
        c_old = torch.exp(acc_lse - new_safe).nan_to_num(0.0)[..., None]
        c_new = torch.exp(lse[k] - new_safe).nan_to_num(0.0)[..., None]
        acc, acc_lse = c_old * acc + c_new * outs[k].float(), new
    lse_out = acc_lse if lse_layout == "Th" else acc_lse.transpose(0, 1).contiguous()
    return acc.to(outs.dtype), lse_out


def impls():
    return [Impl("lse_merge", "up_te", as_run(merge=_merge), "uploaded: TE max+log1p folded",
                 supports=supports_modes(merge=True, update=False))]
"""


def _kassay() -> list[str]:
    script = Path(sys.executable).with_name("kassay")
    return [str(script)] if script.exists() else [sys.executable, "-m", "kassay.cli"]


def _spec(name: str, impls: list[str], artifacts: list[str]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "suites": [{"op": "lse_merge", "impls": impls, "params": GRID}],
    }
    if artifacts:
        spec["artifacts"] = artifacts
    return spec


def _run_job(client: Any, spec: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    job = client.jobs.create(spec)
    job = client.jobs.wait(job.id, timeout=3000)
    wall = time.perf_counter() - t0
    report = client.jobs.report(job.id)
    by_where: dict[str, list[float]] = {}
    statuses: dict[str, int] = {}
    for case in report.cases:
        by_where.setdefault(case.ran_in, []).append(case.duration_s)
        statuses[case.status] = statuses.get(case.status, 0) + 1
    return {
        "job": job.id,
        "wall_s": round(wall, 3),
        "cases": len(report.cases),
        "statuses": statuses,
        "mean_case_s": {k: round(sum(v) / len(v), 4) for k, v in by_where.items()},
        "cases_by_where": {k: len(v) for k, v in by_where.items()},
        "case_statuses": {f"{c.group_id}:{c.impl}": c.status for c in report.cases},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8771)
    ap.add_argument("--device", default=None, help="kassay serve --device (default: its own)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from kassay_client import Client

    data = Path(tempfile.mkdtemp(prefix="kassay-code-jobs-"))
    for name, text in (("kassay_up_merge.py", UP_MERGE), ("kassay_up_te.py", UP_TE)):
        (data / name).write_text(text)
    cmd = [*_kassay(), "serve", "--port", str(args.port), "--data-dir", str(data / "serve")]
    if args.device:
        cmd += ["--device", args.device]
    log = data / "serve.log"
    serve = subprocess.Popen(
        cmd,
        stdout=open(log, "wb"),  # noqa: SIM115 (lives as long as serve)
        stderr=subprocess.STDOUT,
        cwd=data,
        # alt_logsumexp (a correct alternative of the self-test's corpus) is a built-in
        # stand-in for the uploaded logsumexp merge
        env={**os.environ, "KASSAY_ENABLE_MUTANTS": "true"},
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    url = f"http://127.0.0.1:{args.port}"
    runs: dict[str, Any] = {}
    try:
        t0 = time.perf_counter()
        wait_ready(url, timeout=300, proc=serve)
        startup = time.perf_counter() - t0
        with Client(url, timeout=120) as kc:
            digests = [kc.artifacts.upload(data / n).digest for n in ("kassay_up_merge.py",)]
            digests.append(kc.artifacts.upload(data / "kassay_up_te.py").digest)
            # like for like: built-ins of the same math as the uploads (torch code, no Triton
            # kernel, which the CPU interpreter would make the slowest part)
            builtin = ["torch", "alt_logsumexp", "alt_pairwise"]
            code = ["torch", "up_merge", "up_te"]
            # one small job first: the executor's first group pays its own warm-up
            small = {"T": 8, "Hh": 2, "D": 8, "K": 2, "mode": "merge"}
            suite = {"op": "lse_merge", "impls": ["torch"], "params": small, "coverage": "none"}
            _run_job(kc, {"name": "warm", "suites": [suite]})
            runs["builtin-cold"] = _run_job(kc, _spec("builtin-cold", builtin, []))
            runs["builtin-warm"] = _run_job(kc, _spec("builtin-warm", builtin, []))
            runs["code"] = _run_job(kc, _spec("code", code, digests))
            runs["code-again"] = _run_job(kc, _spec("code-again", code, digests))
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            serve.kill()
    # the executor's stderr goes to the worker's log in the data folder, not to serve's output
    text = log.read_text(errors="replace")
    for worker_log in sorted((data / "serve").glob("worker*.log")):
        text += worker_log.read_text(errors="replace")
    starts = [float(s) for s in re.findall(r"impl runner of .* ready in ([0-9.]+) s", text)]
    warm = runs["builtin-warm"]["wall_s"]
    start = starts[0] if starts else 0.0
    summary = {
        "serve_startup_s": round(startup, 2),
        "runner_start_s": starts,
        "code_over_builtin_warm": round(runs["code"]["wall_s"] / warm, 2),
        "target_s (2 x builtin-warm + one runner start)": round(2 * warm + start, 2),
        "code_s": runs["code"]["wall_s"],
        "per_case_overhead_s": round(
            (runs["code"]["wall_s"] - warm - start) / runs["code"]["cases"], 4
        ),
        "verdict": "met" if runs["code"]["wall_s"] <= 2 * warm + start else "NOT met",
    }
    for name, r in runs.items():
        print(
            f"{name:13s} {r['wall_s']:8.2f} s  {r['cases']} cases  {r['statuses']}  "
            f"mean case s {r['mean_case_s']}"
        )
    print(summary)
    meta = run_meta(packages=("torch", "triton", "kassay"))
    save_json({**meta, "grid": GRID, "summary": summary, "runs": runs}, args.out)
    shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
