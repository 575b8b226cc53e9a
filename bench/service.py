"""Service overhead benchmark (CPU, loopback only, bounded loops).

1. Time added per case by REST -> gRPC -> executor and back: the same tiny cases (lse_merge
   T=8, Hh=2, D=4 float32, timing off) run in-process (`kassay.validate.local.run_job`, the
   engine of `kassay run`) and through a real API + CPU worker (submit through the SDK, wait on
   the SSE stream). Added per case = (service wall time - in-process wall time) / cases, per
   repetition; the median over repetitions is reported.
2. GET /v1/jobs/{id}: throughput and latency percentiles from a fixed number of requests over
   keep-alive loopback connections, made by a minimal asyncio HTTP/1.1 client (one request in
   flight per connection) in its own process so that it does not share the API's interpreter.

    PYTHONPATH=service:client python bench/service.py --out bench/results/service-cpu-<date>.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import run_meta, save_json

from kassay.ports import free_port

ROOT = Path(__file__).resolve().parents[1]


def spec(n_seeds: int) -> dict[str, Any]:
    return {
        "name": "bench-service",
        "suites": [
            {
                "op": "lse_merge",
                "impls": ["torch", "ring_style"],
                "params": {"T": 8, "Hh": 2, "D": 4, "dtype": "float32", "mode": "step"},
                "seeds": list(range(n_seeds)),
                # exactly 2 cases per seed: the overhead per case is the measure, so no regimes
                # or coverage points beyond the grid
                "regimes": ["normal"],
                "coverage": "none",
                "timing": {"enabled": False},
            }
        ],
    }


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "service"), str(ROOT / "client"), e.get("PYTHONPATH", "")]
    )
    e.setdefault("TRITON_INTERPRET", "1")
    return e


def start(args: list[str], log: Path, extra_env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "kassay.cli", *args],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**env(), **extra_env},
        )


def wait_ready(
    url: str,
    timeout: float = 180,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
) -> None:
    """Wait until the API at `url` reports a worker up on /readyz; exit if `proc` (the
    `kassay serve` behind it, when the caller started one) exits first, with the tail of its
    `log` where there is one (a missing package says so at once)."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log is not None else ""
            raise SystemExit(f"the service at {url} exited (rc {proc.returncode})\n{tail}")
        try:
            r = httpx.get(f"{url}/readyz", timeout=2)
            if r.status_code == 200 and r.json().get("workers_up"):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"API at {url} not ready after {timeout}s")


# ------------------------------------------------------------------------- per-case overhead


def local_main(argv: list[str]) -> None:
    """Child process: time `run_job` (the engine of `kassay run`) on the job, in a process that
    imports what `kassay run` imports, like the worker's executor; prints seconds per rep."""
    from kassay.contract.spec import parse_spec
    from kassay.validate.local import run_job

    n_seeds, reps = int(argv[0]), int(argv[1])
    run_job(parse_spec(spec(1)), device="cpu", ceilings=False)  # imports, first-call costs
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        report = run_job(parse_spec(spec(n_seeds)), device="cpu", ceilings=False)
        times.append(time.perf_counter() - t0)
        assert report.summary.total == 2 * n_seeds
    print(json.dumps(times))


def per_case(url: str, n_seeds: int, reps: int) -> dict[str, Any]:
    from kassay_client import Client

    job_spec = spec(n_seeds)
    n_cases = 2 * n_seeds
    out = subprocess.run(
        [sys.executable, __file__, "--local-child", str(n_seeds), str(reps)],
        capture_output=True,
        text=True,
        env=env(),
        check=True,
        timeout=1200,
    )
    local_s = json.loads(out.stdout.strip().splitlines()[-1])
    remote_s = []
    with Client(url, timeout=60) as client:
        client.jobs.wait(client.jobs.create(spec(1)).id, timeout=120)  # warm the worker
        for _ in range(reps):
            t0 = time.perf_counter()
            job = client.jobs.wait(client.jobs.create(job_spec).id, timeout=600)
            remote_s.append(time.perf_counter() - t0)
            assert job.progress.done == n_cases and job.state == "finished"
    local = [t / n_cases * 1e3 for t in local_s]
    remote = [t / n_cases * 1e3 for t in remote_s]
    added = [r - loc for r, loc in zip(remote, local, strict=True)]
    return {
        "cases_per_job": n_cases,
        "groups_per_job": n_seeds,
        "repetitions": reps,
        "in_process_ms_per_case": [round(x, 3) for x in local],
        "service_ms_per_case": [round(x, 3) for x in remote],
        "added_ms_per_case": [round(x, 3) for x in added],
        "median_in_process_ms_per_case": round(statistics.median(local), 3),
        "median_service_ms_per_case": round(statistics.median(remote), 3),
        "median_added_ms_per_case": round(statistics.median(added), 3),
        "target_ms": 5.0,
    }


# ------------------------------------------------------------------------- job acceptance


def accept_time(url: str, n_cases: int, reps: int) -> dict[str, Any]:
    """Seconds for POST /v1/jobs of an `n_cases` job (validated, expanded, stored) to answer;
    each job is cancelled right after so the worker does not run it."""
    from kassay_client import Client

    times = []
    with Client(url, timeout=60) as client:
        for _ in range(reps):
            t0 = time.perf_counter()
            job = client.jobs.create(spec(n_cases // 2))
            times.append(time.perf_counter() - t0)
            assert job.progress.total == n_cases, job.progress
            client.jobs.cancel(job.id)
    return {
        "cases": n_cases,
        "repetitions": reps,
        "seconds": [round(t, 4) for t in times],
        "median_s": round(statistics.median(times), 4),
        "target_s": 1.0,
    }


# ------------------------------------------------------------------------- GET throughput


async def _load(host: str, port: int, path: str, n_requests: int, conns: int) -> list[float]:
    request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\n\r\n".encode()
    latencies: list[float] = []
    remaining = [n_requests]

    async def one_conn() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while remaining[0] > 0:
                remaining[0] -= 1
                t0 = time.perf_counter()
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                latencies.append(time.perf_counter() - t0)
                if not head.startswith(b"HTTP/1.1 200") or not body:
                    raise RuntimeError(head.decode(errors="replace"))
        finally:
            writer.close()

    await asyncio.gather(*(one_conn() for _ in range(conns)))
    return latencies


def load_main(argv: list[str]) -> None:
    """Child process: run the load and print JSON (latencies in ms, wall seconds)."""
    host, port, path, n, conns = argv[0], int(argv[1]), argv[2], int(argv[3]), int(argv[4])
    asyncio.run(_load(host, port, path, max(200, n // 20), conns))  # warm-up
    t0 = time.perf_counter()
    lat = asyncio.run(_load(host, port, path, n, conns))
    wall = time.perf_counter() - t0
    print(json.dumps({"wall_s": wall, "lat_ms": [x * 1e3 for x in lat]}))


def get_throughput(url: str, job_id: str, n: int, conns: int) -> dict[str, Any]:
    host, port = url.split("//", 1)[1].split(":")
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--load-child",
            host,
            port,
            f"/v1/jobs/{job_id}",
            str(n),
            str(conns),
        ],
        capture_output=True,
        text=True,
        env=env(),
        check=True,
        timeout=600,
    )
    data = json.loads(out.stdout)
    lat = sorted(data["lat_ms"])

    def pct(p: float) -> float:
        return round(lat[min(len(lat) - 1, int(p / 100 * len(lat)))], 3)

    return {
        "requests": len(lat),
        "connections": conns,
        "wall_s": round(data["wall_s"], 3),
        "req_per_s": round(len(lat) / data["wall_s"], 1),
        "p50_ms": pct(50),
        "p90_ms": pct(90),
        "p99_ms": pct(99),
        "max_ms": round(lat[-1], 3),
        "target_req_per_s": 2000,
        "target_p99_ms": 25.0,
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--load-child":
        load_main(sys.argv[2:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--local-child":
        local_main(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=50, help="groups per job (2 cases each)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="kassay-bench-"))
    wport, aport = free_port(), free_port()
    url = f"http://127.0.0.1:{aport}"
    worker = start(
        ["worker", "--listen", f"127.0.0.1:{wport}", "--device", "cpu"], tmp / "worker.log", {}
    )
    api = start(
        ["api", "--port", str(aport), "--log-level", "warning"],
        tmp / "api.log",
        {
            "KASSAY_WORKERS": f"127.0.0.1:{wport}",
            "KASSAY_DATABASE_URL": f"sqlite:///{tmp / 'k.db'}",
        },
    )
    try:
        wait_ready(url)
        overhead = per_case(url, args.seeds, args.reps)
        print(
            f"per case: in-process {overhead['median_in_process_ms_per_case']} ms, service "
            f"{overhead['median_service_ms_per_case']} ms, added "
            f"{overhead['median_added_ms_per_case']} ms (medians)",
            flush=True,
        )
        accept = accept_time(url, 1000, 5)
        print(f"POST /v1/jobs of 1000 cases: median {accept['median_s']} s", flush=True)
        from kassay_client import Client

        get: dict[str, Any] = {}
        with Client(url) as client:
            finished = client.jobs.list(limit=1).items[0].id
            # a job that runs during the whole load: the dispatcher writes results meanwhile
            running = client.jobs.create(spec(2000)).id
            time.sleep(1.0)
            for state, job_id in (("running", running), ("finished", finished)):
                get[state] = get_throughput(url, job_id, args.requests, args.connections)
                g = get[state]
                print(
                    f"GET /v1/jobs/{{id}} ({state} job): {g['req_per_s']} req/s, p50 "
                    f"{g['p50_ms']} ms, p99 {g['p99_ms']} ms ({g['requests']} requests, "
                    f"{g['connections']} connections)",
                    flush=True,
                )
            assert client.jobs.get(running).state == "running"
            client.jobs.cancel(running)
    finally:
        for p in (api, worker):
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
    result = {
        "benchmark": "service",
        **run_meta(packages=("uvicorn", "httpx")),
        "per_case_overhead": overhead,
        "accept_1000_cases": accept,
        "get_job": get,
    }
    print(json.dumps(result, indent=2))
    save_json(result, args.out)


if __name__ == "__main__":
    main()
