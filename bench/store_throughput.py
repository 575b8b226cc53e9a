"""Store throughput on PostgreSQL with two API replicas (CPU, loopback only, bounded loops).

1. Status reads: GET /v1/jobs/{id} against two `kassay api` processes sharing one PostgreSQL,
   loaded at the same time by one load process each (a fixed number of requests over
   keep-alive connections, bench/service.py's minimal HTTP client); reads/s summed over both.
2. Case writes: two processes, each a replica's store (kassay.api.store.Store on the same
   database), doing what a dispatcher does per group: claim it (FOR UPDATE SKIP LOCKED),
   record each case's result, finish it. Cases written per second summed over both; once with
   each replica on a job of its own, once with both on one job (they contend for its row).

The PostgreSQL server is a throwaway one (tests/pgserver.py: initdb into a temporary folder,
fsync off) unless --database-url names one (its database must be empty or at the head).

    PYTHONPATH=service:client python bench/store_throughput.py \
        --out bench/results/store-throughput-cpu-<date>.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import run_meta, save_json

from service import _load, env, free_port, start

ROOT = Path(__file__).resolve().parents[1]


def spec(n_groups: int, name: str) -> dict[str, Any]:
    """2 cases per group."""
    return {
        "name": name,
        "suites": [
            {
                "op": "lse_merge",
                "impls": ["torch", "ring_style"],
                "params": {"T": 8, "Hh": 2, "D": 4, "dtype": "float32", "mode": "step"},
                "seeds": list(range(n_groups)),
                "regimes": ["normal"],
                "coverage": "none",
                "timing": {"enabled": False},
            }
        ],
    }


def wait_api(url: str, timeout: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v1/jobs?limit=1", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"API at {url} did not answer after {timeout}s")


# ------------------------------------------------------------------------------- children


def read_child(argv: list[str]) -> None:
    """Load one replica: prints {wall_s, lat_ms}."""
    host, port, path, n, conns = argv[0], int(argv[1]), argv[2], int(argv[3]), int(argv[4])
    asyncio.run(_load(host, port, path, max(200, n // 20), conns))  # warm-up
    t0 = time.perf_counter()
    lat = asyncio.run(_load(host, port, path, n, conns))
    print(json.dumps({"wall_s": time.perf_counter() - t0, "lat_ms": [x * 1e3 for x in lat]}))


def write_child(argv: list[str]) -> None:
    """One replica's store: claim, record, finish the groups of `job_id` until none is left;
    prints {cases, groups, wall_s}."""
    from kassay.api.store import Store
    from kassay.validate.case_result import case_result

    url, job_id, me = argv[0], argv[1], argv[2]
    store = Store(url)
    cases = groups = 0
    t0 = time.perf_counter()
    while (
        claim := store.queue.claim_group(worker=me, owner=me, lease_s=600, job_id=job_id)
    ) is not None:
        for impl in claim.group.impls:
            result = case_result(claim.group, impl, "passed", "bench", dtype="float32")
            if store.results.record_result(job_id, result) is not None:
                cases += 1
        store.queue.finish_group(job_id, claim.group.group_id)
        groups += 1
    wall = time.perf_counter() - t0
    store.close()
    print(json.dumps({"cases": cases, "groups": groups, "wall_s": wall}))


def _children(argvs: list[list[str]]) -> list[dict[str, Any]]:
    """Run the children at the same time; their JSON lines."""
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, *a], stdout=subprocess.PIPE, text=True, env=env()
        )
        for a in argvs
    ]
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=900)
        if p.returncode != 0:
            raise SystemExit(f"a child failed ({p.returncode})")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


# ------------------------------------------------------------------------------- measures


def status_reads(urls: list[str], job_id: str, n: int, conns: int) -> dict[str, Any]:
    argvs = []
    for url in urls:
        host, port = url.split("//", 1)[1].split(":")
        argvs.append(["--read-child", host, port, f"/v1/jobs/{job_id}", str(n), str(conns)])
    outs = _children(argvs)
    lat = sorted(x for o in outs for x in o["lat_ms"])
    wall = max(o["wall_s"] for o in outs)

    def pct(p: float) -> float:
        return round(lat[min(len(lat) - 1, int(p / 100 * len(lat)))], 3)

    return {
        "replicas": len(urls),
        "requests": len(lat),
        "connections_per_replica": conns,
        "wall_s": round(wall, 3),
        "reads_per_s": round(len(lat) / wall, 1),
        "per_replica_reads_per_s": [round(len(o["lat_ms"]) / o["wall_s"], 1) for o in outs],
        "p50_ms": pct(50),
        "p99_ms": pct(99),
    }


def case_writes(db_url: str, job_ids: list[str]) -> dict[str, Any]:
    outs = _children([["--write-child", db_url, j, f"replica-{i}"] for i, j in enumerate(job_ids)])
    cases = sum(o["cases"] for o in outs)
    wall = max(o["wall_s"] for o in outs)
    return {
        "replicas": len(outs),
        "jobs": len(set(job_ids)),
        "cases": cases,
        "groups": sum(o["groups"] for o in outs),
        "wall_s": round(wall, 3),
        "case_writes_per_s": round(cases / wall, 1),
        "per_replica_cases": [o["cases"] for o in outs],
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--read-child":
        read_child(sys.argv[2:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--write-child":
        write_child(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--database-url", default=None, help="default: a throwaway server")
    ap.add_argument("--requests", type=int, default=5000, help="status reads per replica")
    ap.add_argument("--connections", type=int, default=4, help="per replica")
    ap.add_argument("--groups", type=int, default=500, help="groups per write job (2 cases each)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    server = None
    db_url = args.database_url
    if db_url is None:
        sys.path.insert(0, str(ROOT / "tests"))
        from pgserver import PostgresServer, find_binaries

        bindir, why = find_binaries()
        if bindir is None:
            raise SystemExit(why)
        server = PostgresServer(bindir).start()
        db_url = server.create_database("bench")
    tmp = Path(tempfile.mkdtemp(prefix="kassay-store-bench-"))
    apis: list[subprocess.Popen[bytes]] = []
    try:
        up = subprocess.run(
            [sys.executable, "-m", "kassay.cli", "db", "upgrade", "--database-url", db_url],
            env=env(),
            check=True,
            capture_output=True,
            text=True,
        )
        print(up.stdout.strip(), flush=True)
        urls = []
        for i in range(2):  # no workers: jobs stay queued, the replicas only serve
            port = free_port()
            urls.append(f"http://127.0.0.1:{port}")
            apis.append(
                start(
                    ["api", "--port", str(port), "--log-level", "warning"],
                    tmp / f"api-{i}.log",
                    {"KASSAY_DATABASE_URL": db_url, "KASSAY_WORKERS": ""},
                )
            )
        for url in urls:
            wait_api(url)
        from kassay_client import Client

        with Client(urls[0], timeout=120) as client:
            status_job = client.jobs.create(spec(20, "bench-status")).id
            own = [client.jobs.create(spec(args.groups, f"bench-w{i}")).id for i in range(2)]
            shared = client.jobs.create(spec(2 * args.groups, "bench-shared")).id
        reads = status_reads(urls, status_job, args.requests, args.connections)
        print(
            f"status reads: {reads['reads_per_s']} /s over {len(urls)} replicas "
            f"(p50 {reads['p50_ms']} ms, p99 {reads['p99_ms']} ms)",
            flush=True,
        )
        for p in apis:  # the writes run alone (the replicas' dispatchers sleep anyway)
            p.terminate()
            p.wait(timeout=20)
        writes_own = case_writes(db_url, own)
        print(f"case writes, a job per replica: {writes_own['case_writes_per_s']} /s", flush=True)
        writes_shared = case_writes(db_url, [shared, shared])
        print(f"case writes, one shared job: {writes_shared['case_writes_per_s']} /s", flush=True)
    finally:
        for p in apis:
            if p.poll() is None:
                p.kill()
        if server is not None:
            server.stop()
    result = {
        "benchmark": "store_throughput",
        **run_meta(packages=("sqlalchemy", "psycopg", "uvicorn")),
        "database": "postgresql (throwaway, fsync off)" if server else "given URL",
        # this host's load when the run ended: the figures scale with the CPU left to it
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "status_reads": reads,
        "case_writes_job_per_replica": writes_own,
        "case_writes_one_job": writes_shared,
    }
    print(json.dumps(result, indent=1)[:2000])
    save_json(result, args.out)


if __name__ == "__main__":
    main()
