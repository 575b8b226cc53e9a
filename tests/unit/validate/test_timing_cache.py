"""Timing policy logic and report fields on the CPU, and the worker's reference cache: a
repeated input group reuses its float64 reference, an impl that writes into its inputs cannot
poison it, and the cache stays within its byte cap."""

from __future__ import annotations

import pytest
import torch

from kassay import reports
from kassay.contract.results import Report, Summary
from kassay.contract.spec import GroupSpec, TimingPolicy
from kassay.validate.engine import run_group
from kassay.validate.reference_cache import ReferenceCache
from kassay.validate.timing import _batch_size, time_call

CPU = torch.device("cpu")


def test_cpu_timing_is_labelled_and_bounded() -> None:
    calls = []
    policy = TimingPolicy(warmup=2, min_reps=4, max_reps=7, budget_s=5.0, target_rel_sem=1e-9)
    t = time_call(lambda: calls.append(1), CPU, policy)
    assert t.mode == "cpu" and t.clock == "cpu_perf_counter"
    assert t.n == 7 and len(calls) == 2 + 7  # warm-up, then up to max_reps
    assert t.wall_median_ms == t.median_ms and t.host_overhead_ms == 0.0
    assert t.sm_clock_mhz is None and not t.throttled


def test_cpu_timing_times_the_host_calibration_after_every_repetition() -> None:
    """One calibration time per sample, on the same clock, under a name that says what ran
    (host_calibration); the policy turns it off."""
    policy = TimingPolicy(warmup=1, min_reps=5, max_reps=5, cpu_clock="process")
    t = time_call(lambda: sum(range(20_000)), CPU, policy)
    assert t.calibration is not None and t.calibration.startswith("kassay.cal/1 ")
    assert f"torch {torch.__version__}" in t.calibration
    assert len(t.calibration_ms) == len(t.samples_ms) == 5 and min(t.calibration_ms) > 0
    off = time_call(lambda: None, CPU, policy.model_copy(update={"cpu_calibration": False}))
    assert off.calibration is None and off.calibration_ms == [] and off.n == 5


def test_batches_cover_min_reps_and_stop_at_max_reps() -> None:
    p = TimingPolicy(min_reps=20, max_reps=30, min_reps_time_s=0)
    assert _batch_size(1000.0, p, 0) == 20  # a slow call still gets its minimum in one go
    assert _batch_size(0.001, p, 25) == 5  # a fast one fills the batch, up to max_reps
    assert _batch_size(0.001, TimingPolicy(max_reps=100_000), 0) == 50_000


def _group(seed: int = 0) -> GroupSpec:
    return GroupSpec(
        group_id=f"g{seed}",
        op="lse_merge",
        params={
            "T": 8,
            "Hh": 2,
            "D": 4,
            "K": 2,
            "dtype": "float32",
            "lse_layout": "hT",
            "mode": "merge",
            "accumulate": "float32",
        },
        seed=seed,
        impls=["torch"],
        timing=TimingPolicy(enabled=False),
    )


def test_a_repeated_group_reuses_its_reference() -> None:
    (first,) = run_group(_group(seed=12345), device="cpu", ceilings=False)
    (again,) = run_group(_group(seed=12345), device="cpu", ceilings=False)
    assert first.environment.model_extra["reference_cache"] == "miss"
    assert again.environment.model_extra["reference_cache"] == "hit"
    assert [o.model_dump() for o in first.outputs] == [o.model_dump() for o in again.outputs]
    report = Report(
        job_id="j",
        name="n",
        labels={},
        state="finished",
        created_at="2026-12-03T00:00:00Z",
        environments=[first.environment],
        summary=Summary.of([first, again]),
        cases=[first, again.model_copy(update={"group_id": "other"})],
    )
    assert "references reused for 1 of 2 input groups" in reports.render(report, "markdown")


def test_the_cache_keeps_references_of_matching_inputs_within_its_cap() -> None:
    cache = ReferenceCache(cap_bytes=2 * 4 * 5)  # room for two references of 5 floats
    made: list[float] = []

    def inputs(v: float):
        return lambda: {"x": torch.full((5,), v)}

    def ref(ins):
        made.append(float(ins["x"][0]))
        return {"y": -ins["x"]}

    first, r1, hit = cache.get_or_make("a", CPU, inputs(1.0), ref)
    assert not hit and r1["y"].tolist() == [-1.0] * 5
    first["x"].fill_(99.0)  # an impl scribbling on its inputs: the next case's are made afresh
    r1["y"].fill_(5.0)  # ...or on the reference it was handed: the cache holds its own copy
    again, r2, hit = cache.get_or_make("a", CPU, inputs(1.0), ref)
    assert hit and again["x"].tolist() == [1.0] * 5 and r2["y"].tolist() == [-1.0] * 5
    assert made == [1.0]
    # the same key, inputs that came out different: the reference is made again for them
    _, r3, hit = cache.get_or_make("a", CPU, inputs(7.0), ref)
    assert not hit and r3["y"].tolist() == [-7.0] * 5 and made == [1.0, 7.0]
    assert cache.get_or_make("a", CPU, inputs(7.0), ref)[2]
    cache.get_or_make("b", CPU, inputs(2.0), ref)
    cache.get_or_make("c", CPU, inputs(3.0), ref)  # full, nothing idle long enough: not kept
    assert cache.held_bytes <= cache.cap_bytes
    assert cache.get_or_make("a", CPU, inputs(7.0), ref)[2]
    assert cache.get_or_make("b", CPU, inputs(2.0), ref)[2]
    assert not cache.get_or_make("c", CPU, inputs(3.0), ref)[2]
    cache._used["a"] -= 10_000  # "a" idle past IDLE_EVICT_S: it makes room for "c"
    cache.get_or_make("c", CPU, inputs(3.0), ref)
    assert cache.get_or_make("c", CPU, inputs(3.0), ref)[2]
    assert not cache.get_or_make("a", CPU, inputs(7.0), ref)[2]
    off = ReferenceCache(cap_bytes=0)
    off.get_or_make("a", CPU, inputs(1.0), ref)
    assert not off.get_or_make("a", CPU, inputs(1.0), ref)[2] and off.held_bytes == 0


def test_inputs_with_nan_still_hit() -> None:
    cache = ReferenceCache(cap_bytes=1 << 20)

    def inputs():
        return {"x": torch.tensor([1.0, float("nan"), float("-inf")])}

    cache.get_or_make("n", CPU, inputs, lambda ins: {"y": ins["x"].double()})
    assert cache.get_or_make("n", CPU, inputs, lambda ins: {"y": ins["x"].double()})[2]


def test_one_outlier_repetition_does_not_hold_the_device_loop_open() -> None:
    """The device loop stops on a robust standard error: a first repetition 3x the others (the
    host still enqueueing it) would keep the std-based one above 1% for 100 repetitions."""
    from kassay.contract.spec import TimingPolicy
    from kassay.validate.timing import _enough, _rel_sem

    times = [8.8] + [2.73 + 0.002 * (i % 5) for i in range(13)]
    assert _rel_sem(times) > 0.01 and _rel_sem(times, robust=True) < 0.001
    policy = TimingPolicy(min_reps=5, max_reps=100, target_rel_sem=0.01)
    far = float("inf")
    assert _enough(times, policy, far, robust=True) and not _enough(times, policy, far)
    # a spread that is real (every repetition differs) still keeps it open
    spread = [2.0 + 0.5 * (i % 2) for i in range(14)]
    assert not _enough(spread, policy, far, robust=True)


def test_a_slow_call_meets_min_reps_by_time_with_three_repetitions() -> None:
    """min_reps_time_s: three repetitions of a 0.5 s call (a float32 flce at N=8192) meet
    min_reps=5 when their statistics are good; two never do, a spread keeps the loop going, and
    0 turns the rule off. Calls too short to add up to the time still need min_reps."""
    from kassay.contract.spec import TimingPolicy
    from kassay.validate.timing import _enough

    far = float("inf")
    policy = TimingPolicy(min_reps=5, max_reps=100, target_rel_sem=0.01)
    assert policy.min_reps_time_s == 1.0
    slow = [500.0, 500.4, 499.8]
    assert _enough(slow, policy, far, robust=True)
    assert not _enough(slow[:2], policy, far, robust=True)
    assert not _enough([500.0, 560.0, 440.0], policy, far, robust=True)
    assert not _enough(slow, policy.model_copy(update={"min_reps_time_s": 0}), far, robust=True)
    assert not _enough([20.0, 20.01, 19.99, 20.0], policy, far, robust=True)  # 80 ms in all
    # the batch asks for what the time rule needs: 3 of 0.5 s, 4 of 0.25 s, min_reps of 20 ms
    assert _batch_size(500.0, policy, 0) == 3
    assert _batch_size(250.0, policy, 0) == 4
    assert _batch_size(20.0, policy, 0) == 5
    assert _batch_size(500.0, policy, 3) == 1  # one more when the three disagreed


def test_a_slow_call_on_the_cpu_stops_after_three_repetitions() -> None:
    """The same rule on the CPU clock: a 0.4 s call, timed with min_reps=5, takes three."""
    import time

    from kassay.contract.spec import TimingPolicy

    t = time_call(
        lambda: time.sleep(0.4),
        CPU,
        TimingPolicy(warmup=0, min_reps=5, max_reps=10, target_rel_sem=0.05, cpu_calibration=False),
    )
    assert t.n == 3 and 390 < t.median_ms < 600


def test_without_a_cuda_runtime_nothing_is_page_locked() -> None:
    """Page-locking needs the CUDA runtime torch loaded (to clear a refusal's error): where none
    is loaded (this CPU build) nothing is locked, no CUDA call is made, and the cache keeps its
    references as plain host copies."""
    from kassay.validate.reference_cache import _cuda_last_error, _page_lock

    if torch.cuda.is_available():
        pytest.skip("a CUDA build: tests/gpu/test_reference_cache_gpu.py covers locking")
    assert _cuda_last_error() is None
    host = torch.ones(8, dtype=torch.float64)
    assert not _page_lock(host) and not host.is_pinned()
    cache = ReferenceCache(cap_bytes=1 << 20, page_lock=True)
    make = lambda: {"x": torch.arange(4.0)}  # noqa: E731
    ref = lambda ins: {"y": ins["x"].double()}  # noqa: E731
    cache.get_or_make("k", CPU, make, ref)
    _, again, hit = cache.get_or_make("k", CPU, make, ref)
    assert hit and torch.equal(again["y"], torch.arange(4.0, dtype=torch.float64))
