"""Where does a repeated CI grid's time go outside the timed repetitions? (#15: the second run
of examples/ci-grid.yaml through `kassay serve` took 30.6 s on the H200, 2026-12-04, of which
24.3 s inside cases and 10.9 s of timed repetitions.)

Runs the grid twice in this process (the engine, no servers: the float64 references are cached
the same way as in a worker's executor) and profiles the second pass with cProfile. Prints each
pass's wall time, the sum of its case durations and repetitions, the time spent making each
group (inputs, cache lookup, environment) and the functions with the most cumulative and own
time. Also times one `environment()` call and one nvidia-smi query.

    PYTHONPATH=service python3 research/ci_grid_profile.py [--spec examples/ci-grid.yaml]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch

from kassay.validate import engine
from kassay.validate.env import _nvidia_smi, environment, resolve_device
from kassay.validate.local import run_job
from kassay.validate.spec import load_spec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default="examples/ci-grid.yaml")
    ap.add_argument("--top", type=int, default=45)
    args = ap.parse_args()
    dev = resolve_device("auto")
    spec = load_spec(args.spec)

    t0 = time.perf_counter()
    _nvidia_smi(dev.index or 0)
    print(f"one nvidia-smi query: {time.perf_counter() - t0:.3f} s")
    t0 = time.perf_counter()
    environment(dev)
    print(f"one environment(): {time.perf_counter() - t0:.3f} s")

    # group construction time (inputs, reference cache, environment, floors)
    made: list[float] = []
    init = engine.GroupRunner.__init__

    def timed_init(self: engine.GroupRunner, *a: object, **k: object) -> None:
        t = time.perf_counter()
        init(self, *a, **k)  # type: ignore[arg-type]
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        made.append(time.perf_counter() - t)

    engine.GroupRunner.__init__ = timed_init  # type: ignore[method-assign]

    prof = cProfile.Profile()
    for run in (1, 2):
        made.clear()
        t0 = time.perf_counter()
        if run == 2:
            prof.enable()
        report = run_job(spec, device=str(dev))
        if run == 2:
            prof.disable()
        wall = time.perf_counter() - t0
        cases = report.cases
        dur = sum(c.duration_s or 0.0 for c in cases)
        reps = sum((c.timing.n * c.timing.median_ms / 1e3) for c in cases if c.timing)
        wall_calls = sum(
            (c.timing.wall_median_ms or 0.0) / 1e3 for c in cases if c.timing is not None
        )
        statuses = sorted({c.status for c in cases})
        print(
            f"pass {run}: wall {wall:.1f} s, {len(cases)} cases {statuses}, case durations "
            f"{dur:.1f} s, repetitions {reps:.1f} s, one wall call per case {wall_calls:.1f} s, "
            f"making groups {sum(made):.1f} s ({len(made)} groups)"
        )
    for key in ("cumulative", "tottime"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(args.top)
        print(f"\n==== pass 2 by {key}\n" + s.getvalue())


if __name__ == "__main__":
    main()
