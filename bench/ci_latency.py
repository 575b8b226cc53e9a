"""CI latency through the service: the same CI grid submitted twice to one `kassay serve`.

A CI pipeline posts the same grid on every commit; the float64 references do not change, so the
worker's reference cache (KASSAY_REFERENCE_CACHE_BYTES) lets the second job pay only for its
impls. Measures each job's wall time from submission to the final event, the reference-cache
reuse reported in its Markdown report, and the statuses of both runs (they must agree).

    PYTHONPATH=service:client python3 bench/ci_latency.py --spec examples/ci-grid.yaml \
        --out bench/results/ci-latency-h200-DATE.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import run_meta, save_json

from service import wait_ready

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(ROOT / "examples" / "ci-grid.yaml"))
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--log", default=None, help="copy kassay serve's log here at the end")
    ap.add_argument(
        "--cache-gib",
        type=float,
        default=80.0,
        help="the worker's reference cache (host RAM; the grid's references need well under it)",
    )
    args = ap.parse_args()
    from kassay_client import Client

    data = tempfile.mkdtemp(prefix="kassay-ci-latency-")
    env = dict(os.environ)
    env["KASSAY_REFERENCE_CACHE_BYTES"] = str(int(args.cache_gib * 2**30))
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "service"), str(ROOT / "client"), env.get("PYTHONPATH", "")]
    )
    serve = subprocess.Popen(
        [sys.executable, "-m", "kassay.cli", "serve", "--port", str(args.port), "--data-dir", data],
        env=env,
        stdout=open(Path(data) / "serve.log", "wb"),  # noqa: SIM115 (lives as long as serve)
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{args.port}"
    runs = []
    # A time limit's SIGTERM must still stop serve (and its worker, which holds the GPU) and keep
    # the log: the finally below runs only if the signal becomes an exception.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t_start = time.perf_counter()
    try:
        wait_ready(url, timeout=300, proc=serve, log=Path(data) / "serve.log")
        print(f"serve ready in {time.perf_counter() - t_start:.1f} s", flush=True)
        text = Path(args.spec).read_text()
        with Client(url, timeout=60) as client:
            for i in range(args.runs):
                t0 = time.perf_counter()
                job = client.jobs.create(text)

                def progress(event: object, t0: float = t0) -> None:
                    result = getattr(event, "result", None)
                    if result is not None:  # when each case ends: where a slow run spends it
                        print(
                            f"  {time.perf_counter() - t0:7.1f} s {result.op}.{result.impl} "
                            f"{result.case_id} {result.status}",
                            flush=True,
                        )

                done = client.jobs.wait(job.id, timeout=1800, on_event=progress)
                wall = time.perf_counter() - t0
                report = client.jobs.report(job.id)
                md = client.jobs.report(job.id, format="markdown")
                note = next((ln for ln in md.splitlines() if "references reused" in ln), "")
                statuses = {c.case_id: c.status for c in report.cases}
                not_passed = [
                    {
                        "case": f"{c.op}.{c.impl} {c.case_id}",
                        "status": c.status,
                        "msg": c.message[:300],
                    }
                    for c in report.cases
                    if c.status not in ("passed", "unsupported")
                ]
                # where a repeated job's time goes: each case's duration, and the device time
                # of its timed repetitions alone (the policy's floor for that case)
                per_case = [
                    {
                        "case": f"{c.op}.{c.impl} {c.case_id}",
                        "duration_s": round(c.duration_s or 0.0, 3),
                        "reps": (c.timing or {}).get("n", 0),
                        "median_ms": (c.timing or {}).get("median_ms"),
                        "mode": (c.timing or {}).get("mode"),
                    }
                    for c in report.cases
                ]
                reps_s = sum(c["reps"] * (c["median_ms"] or 0.0) / 1e3 for c in per_case)
                runs.append(
                    {
                        "run": i + 1,
                        "job": job.id,
                        "wall_s": wall,
                        "cases": len(report.cases),
                        "state": done.state,
                        "ok": done.ok,
                        "statuses": statuses,
                        "reference_cache": note,
                        "not_passed": not_passed,
                        "cases_duration_s": round(sum(c["duration_s"] for c in per_case), 2),
                        "timed_repetitions_s": round(reps_s, 2),
                        "per_case": per_case,
                    }
                )
                print(
                    f"run {i + 1}: {wall:.1f} s, {len(report.cases)} cases, ok={done.ok}; {note}; "
                    f"case durations {runs[-1]['cases_duration_s']} s, of which the timed "
                    f"repetitions' device time {runs[-1]['timed_repetitions_s']} s"
                )
    finally:
        serve.terminate()
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
        if args.log:
            shutil.copy(Path(data) / "serve.log", args.log)
    same = all(r["statuses"] == runs[0]["statuses"] for r in runs)
    result = {
        **run_meta(),
        "spec": args.spec,
        "runs": [{k: v for k, v in r.items() if k != "statuses"} for r in runs],
        "statuses_agree": same,
        "target": "the grid run a second time in <= 25 s",
        "reference_cache_gib": args.cache_gib,
    }
    save_json(result, args.out)


if __name__ == "__main__":
    main()
