"""The gate on a busy CPU worker (#32): the same code run back to back while two busy processes
compete for the 2 cores raises no regression, while 20% more work is still flagged. A gate that
flakes gets switched off.

`process`: the suite times with the process clock and the host calibration (cpu_clock: process,
the default cpu_calibration, 30+ repetitions), as README's gate section recommends for shared CPU
runners: 10 same-code runs "same", +20% flagged 3 times in 3. `default`: the default timing
policy (wall clock, 5 repetitions): before the `not_comparable` verdict it flagged the same code
x2.29 (99% CI 1.15-4.56) and missed +20% (CI 0.65-2.61); now such an interval is "speed not
comparable on this worker", never a regression, and +20% is flagged or not comparable, never
"same"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from test_compare_gate import QUIET, SPEC, _pr_run, _slowable

from kassay_client import Client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SAME_RUNS = 10
SLOW_RUNS = 3


def _busy(n: int) -> list[subprocess.Popen[bytes]]:
    """n processes that spin on a core each (the competing load)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


@pytest.mark.parametrize("clock", ["process", "default"])
def test_no_false_regression_under_load_and_20_percent_still_flagged(
    procs, tmp_path: Path, clock: str
) -> None:
    job_spec = {
        **SPEC,
        "suites": [
            {**s, "timing": {**s["timing"], "cpu_clock": clock} if clock != "default" else {}}
            for s in SPEC["suites"]
        ],
    }
    steady = procs.worker("steady", env=QUIET)
    slowed_port = procs.free_port()
    later = SimpleNamespace(extra={"address": f"127.0.0.1:{slowed_port}"})
    api = procs.api([steady, later], api_tokens=procs.write_token)
    procs.wait_ready(api, steady)
    url = api.extra["url"]
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(job_spec))
    slowed = None
    load: list[subprocess.Popen[bytes]] = []
    verdicts: dict[str, list[tuple[int, dict]]] = {"same": [], "slower": []}
    try:
        with Client(url, token=procs.write_token) as client:
            base = client.jobs.wait(
                client.jobs.create(job_spec, labels={"branch": "main", "commit": "base"}).id,
                timeout=120,
            )
            assert base.ok, base

            def gate(commit: str) -> tuple[int, dict]:
                """One PR's gate: its exit code and the speed verdict of its comparison."""
                code, _err = _pr_run(procs, url, spec, commit)
                job = client.jobs.list(labels={"commit": commit}).items[0]
                return code, _slowable(client.jobs.compare(job.id)).speed

            load = _busy(2)
            verdicts["same"] = [gate(f"same{i}") for i in range(SAME_RUNS)]
            steady.stop()
            slowed = procs.worker(
                "slowed", port=slowed_port, env={**QUIET, "KASSAY_TEST_EXTRA_PASS": "0.2"}
            )
            procs.wait_ready(api, slowed)
            verdicts["slower"] = [gate(f"slow{i}") for i in range(SLOW_RUNS)]
    finally:
        for p in load:
            p.kill()
        for p in (api, steady, slowed):
            if p is not None:
                p.stop()
    for what, runs in verdicts.items():
        print(
            what,
            [
                (c, f"{s['ratio']:.3f} {s['low']:.3f}-{s['high']:.3f} {s['verdict']}")
                for c, s in runs
            ],
        )
    # the same code: never a regression
    assert all(code == 0 for code, _ in verdicts["same"]), verdicts["same"]
    assert all(s["verdict"] in ("same", "not_comparable") for _, s in verdicts["same"])
    if clock == "process":
        # the policy README recommends for shared CPU runners resolves +20% every time
        assert all(code == 4 for code, _ in verdicts["slower"]), verdicts["slower"]
    else:
        # the default policy (5 repetitions, wall clock) may not resolve it under this load:
        # then it says so, and never calls 20% more work "same"
        for code, s in verdicts["slower"]:
            assert (code, s["verdict"]) in ((4, "slower"), (0, "not_comparable")), (code, s)
