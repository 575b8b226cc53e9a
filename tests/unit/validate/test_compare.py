"""Comparing two jobs (torch-free): the median-ratio interval, case keys, and the status,
accuracy, speed and memory verdicts per key."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from kassay.contract.results import (
    CaseResult,
    Environment,
    MemoryStats,
    OutputMetrics,
    Report,
    Summary,
    TimingStats,
)
from kassay.errors import IncomparableError
from kassay.reports.comparison_markdown import to_markdown
from kassay.validate.compare_reports import (
    case_key,
    compare_reports,
    device_kind,
    key_parts,
    speed_change,
)
from kassay.validate.median_ratio import Run, median_ratio, paired_run, t_quantile
from kassay.validate.timing import stats

H200 = Environment(
    device="cuda:0", device_name="NVIDIA H200", torch="2", kassay="0", python="3", hostname="a"
)
A100 = H200.model_copy(update={"device_name": "NVIDIA A100-SXM4-80GB"})
PARAMS = {"T": 8, "Hh": 2, "D": 4, "K": 2, "dtype": "float32"}


# ----------------------------------------------------------------------- the ratio interval


@pytest.mark.parametrize(
    ("dof", "table"), [(1, 63.657), (2, 9.925), (3, 5.841), (5, 4.032), (10, 3.169), (30, 2.750)]
)
def test_t_quantile_matches_the_tables(dof, table) -> None:
    assert t_quantile(0.995, dof) == pytest.approx(table, rel=0.01)


def _bursty(rng: random.Random, n: int, median: float, noise: float = 0.03) -> list[float]:
    """Timings of a shared host: the load drifts (an AR(1) level: neighbours alike) and each
    repetition adds its own noise and, now and then, a stall."""
    level, out, phi = 0.0, [], 0.8
    for _ in range(n):
        level = phi * level + rng.gauss(0, noise * math.sqrt(1 - phi * phi))
        x = median * math.exp(level + rng.gauss(0, noise / 2))
        out.append(x * (3 if rng.random() < 0.02 else 1))
    return out


def _run(xs: list[float]) -> Run:
    t = stats(xs, "cuda_events", False)
    return Run(median=t.median_ms, samples=t.samples_ms, rel_sem=t.rel_sem, n=t.n)


def test_unchanged_runs_are_rarely_significant_even_when_bursty() -> None:
    """Independent runs of the same timing: the 99% interval holds 1 in about 99% of pairs,
    although neighbouring samples are alike."""
    rng = random.Random(7)
    trials, significant = 300, 0
    for _ in range(trials):
        ci = median_ratio(_run(_bursty(rng, 100, 1.0)), _run(_bursty(rng, 100, 1.0)))
        significant += ci.low > 1 or ci.high < 1
    assert significant / trials <= 0.025


def test_a_real_slowdown_is_significant_and_estimated() -> None:
    rng = random.Random(8)
    for _ in range(20):
        ci = median_ratio(_run(_bursty(rng, 100, 1.2)), _run(_bursty(rng, 100, 1.0)))
        assert ci.low > 1.05 and ci.ratio == pytest.approx(1.2, rel=0.05)
        assert ci.method == "batch_medians" and ci.confidence == 0.99


def test_few_samples_fall_back_to_rel_sem() -> None:
    new = Run(median=1.1, samples=[1.1] * 5, rel_sem=0.01, n=5)
    old = Run(median=1.0, samples=[], rel_sem=0.01, n=5)
    ci = median_ratio(new, old)
    assert ci.method == "rel_sem" and ci.low < 1.1 < ci.high
    # sqrt(2) * 1% on the log scale, t(0.995) of about 6.7 dof: roughly +-6%
    assert 1.01 < ci.low < 1.06 and ci.ratio == pytest.approx(1.1)


CALIBRATION = "kassay.cal/1 (test)"


def _cpu_job(rng: random.Random, median: float, n: int = 100) -> TimingStats:
    """One CPU job on a shared host, as measured on the 2-core box (bench/README.md): the job's
    host speed (sd 15% between jobs) and the load within it (an AR(1) level) slow the case and
    the calibration timed after each repetition alike, the calibration a little less; each has
    its own per-repetition noise; and the case sits off by a per-job 2.5% that the calibration
    cannot see (memory layout, other code's sensitivity to a busy neighbour)."""
    host, offset = rng.gauss(0, 0.15), rng.gauss(0, 0.025)
    level, phi, xs, cal = 0.0, 0.8, [], []
    for _ in range(n):
        level = phi * level + rng.gauss(0, 0.08 * math.sqrt(1 - phi * phi))
        stall = 3 if rng.random() < 0.02 else 1
        xs.append(median * stall * math.exp(host + offset + level + rng.gauss(0, 0.05)))
        cal.append(0.3 * math.exp(host + 0.8 * level + rng.gauss(0, 0.05)))
    t = stats(xs, "cpu_process_time", False, "cpu")
    t.calibration, t.calibration_ms = CALIBRATION, cal
    return t


def _plain(t: TimingStats) -> TimingStats:
    return t.model_copy(update={"calibration": None, "calibration_ms": []})


def test_host_normalised_cpu_comparisons_see_through_the_hosts_drift() -> None:
    """Unchanged code on a drifting host: the host-normalised 99% interval holds 1 in about
    99% of pairs, where the plain ratio of medians calls the drift a change most of the time."""
    rng = random.Random(11)
    trials, normalised, plain = 300, 0, 0
    for _ in range(trials):
        new, old = _cpu_job(rng, 1.0), _cpu_job(rng, 1.0)
        s = speed_change(new, old, 0.03, 0.99)
        assert s is not None and s.host_normalised
        normalised += s.low > 1 or s.high < 1
        p = speed_change(_plain(new), _plain(old), 0.03, 0.99)
        assert p is not None and not p.host_normalised and p.raw_ratio == s.raw_ratio
        plain += p.low > 1 or p.high < 1
    assert normalised / trials <= 0.025
    assert plain / trials > 0.3


def test_host_normalised_cpu_comparisons_find_real_slowdowns() -> None:
    """20% slower: flagged in at least 9 pairs of 10 (the per-job 2.5% the calibration cannot
    see limits it to that), estimated without bias; 30% slower: every time."""
    rng = random.Random(12)
    found, ratios = 0, []
    for _ in range(100):
        s = speed_change(_cpu_job(rng, 1.2), _cpu_job(rng, 1.0), 0.03, 0.99)
        assert s is not None and s.host_normalised
        found += s.verdict == "slower"
        ratios.append(s.ratio)
    assert found >= 90 and statistics.median(ratios) == pytest.approx(1.2, rel=0.02)
    for _ in range(20):
        s = speed_change(_cpu_job(rng, 1.3), _cpu_job(rng, 1.0), 0.03, 0.99)
        assert s is not None and s.verdict == "slower"


def _wall_job(rng: random.Random, median: float, pressure: float | None) -> TimingStats:
    """A wall-clock CPU timing of 30 repetitions with 2% noise, and the PSI share measured."""
    t = stats(
        [median * math.exp(rng.gauss(0, 0.02)) for _ in range(30)], "cpu_perf_counter", False, "cpu"
    )
    t.cpu_pressure = pressure
    return t


def test_a_busy_hosts_wall_clock_is_not_comparable_a_real_change_still_called() -> None:
    """The same code timed while two other processes held the 2 cores: every repetition x2.3,
    so the interval is tight and, without the host's CPU pressure, it reads "slower"; with the
    pressure measured (0.6: inflation up to x2.5) it is "not comparable". A 30% slowdown on a
    host that waited 1% of the window is still "slower", a 30% speed-up "faster"; the process
    clock, which waiting does not advance, is judged as before."""
    rng = random.Random(5)
    quiet = _wall_job(rng, 1.0, 0.005)
    blind = speed_change(_wall_job(rng, 2.3, None), quiet, 0.05, 0.99)
    assert blind is not None and blind.verdict == "slower"
    busy = speed_change(_wall_job(rng, 2.3, 0.6), quiet, 0.05, 0.99)
    assert busy is not None and busy.verdict == "not_comparable"
    # the baseline measured on the busy host hides a regression as well as it fakes one
    hidden = speed_change(_wall_job(rng, 1.0, 0.005), _wall_job(rng, 1.3, 0.4), 0.05, 0.99)
    assert hidden is not None and hidden.verdict == "not_comparable"
    slower = speed_change(_wall_job(rng, 1.3, 0.01), quiet, 0.05, 0.99)
    assert slower is not None and slower.verdict == "slower"
    faster = speed_change(_wall_job(rng, 0.7, 0.01), quiet, 0.05, 0.99)
    assert faster is not None and faster.verdict == "faster"
    # 10% slower while the host waited 8% of the window (up to x1.087): more than the threshold
    # could be the wait's, so no verdict
    small = speed_change(_wall_job(rng, 1.1, 0.08), quiet, 0.05, 0.99)
    assert small is not None and small.verdict == "not_comparable"
    process = [_wall_job(rng, m, 0.6) for m in (1.3, 1.0)]
    for t in process:
        t.clock = "cpu_process_time"
    p = speed_change(*process, 0.05, 0.99)
    assert p is not None and p.verdict == "slower"


def test_cpu_pressure_rises_when_other_processes_hold_every_core() -> None:
    """The PSI reading the CPU timing records (kassay.validate.cpu_pressure): with a busy
    process more than the cores, most of a second's window had a task waiting."""
    import os
    import subprocess
    import sys
    import time

    from kassay.validate.cpu_pressure import PressureWindow

    window = PressureWindow()
    if window.share(1.0) is None:
        pytest.skip("this kernel has no pressure stall information")
    busy = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range((os.cpu_count() or 1) + 1)
    ]
    try:
        time.sleep(0.5)
        window = PressureWindow()
        t0 = time.perf_counter()
        time.sleep(1.0)
        share = window.share(time.perf_counter() - t0)
    finally:
        for p in busy:
            p.kill()
    assert share is not None and share > 0.5, share


def test_paired_runs_need_one_calibration_per_sample() -> None:
    run = paired_run([2.0, 4.0, 3.0], [1.0, 2.0, 1.0])
    assert run is not None and run.samples == [2.0, 2.0, 3.0] and run.median == 2.0
    assert paired_run([2.0, 4.0], [1.0]) is None and paired_run([2.0], [1.0]) is None
    assert paired_run([2.0, 4.0], [1.0, 0.0]) is None


# -------------------------------------------------------------------------------- case keys


def _case(
    impl: str = "torch",
    *,
    status: str = "passed",
    env: Environment | None = H200,
    median: float | None = 1.0,
    samples: list[float] | None = None,
    rel_l2: float = 1e-6,
    peak: int | None = None,
    params: dict | None = None,
    suite_index: int = 0,
) -> CaseResult:
    timing = None
    if median is not None:
        xs = samples if samples is not None else [median * (1 + 0.001 * (i % 5)) for i in range(50)]
        timing = stats(xs, "cuda_events", True)
    return CaseResult(
        case_id=f"g0:{impl}",
        group_id="g0",
        suite_index=suite_index,
        op="lse_merge",
        impl=impl,
        params=params or PARAMS,
        regime="normal",
        seed=0,
        dtype="float32",
        status=status,  # type: ignore[arg-type]
        outputs=[
            OutputMetrics(
                name="out",
                dtype="float32",
                expected_dtype="float32",
                shape=[8, 2, 4],
                max_abs=rel_l2 * 10,
                max_rel=rel_l2,
                rel_l2=rel_l2,
                max_ulp=1,
                nan=0,
                inf=0,
                ref_nan=0,
                ref_inf=0,
                policy="baseline",
                baseline_rel_l2=1e-6,
                threshold_rel_l2=2e-6 + 1e-7,
                baseline_max_abs=1e-5,
                threshold_max_abs=2e-5 + 1e-6,
            )
        ],
        timing=timing,
        memory=MemoryStats(measured=True, peak_extra_bytes=peak, model_bytes=1)
        if peak is not None
        else None,
        environment=env,
    )


def _report(cases: list[CaseResult], job_id: str, envs=(H200,)) -> Report:
    return Report(
        job_id=job_id, name="ci", summary=Summary.of(cases), cases=cases, environments=list(envs)
    )


def test_case_key_is_stable_and_names_the_device_kind() -> None:
    a = key_parts(_case())
    assert a["device_kind"] == "NVIDIA H200"
    # the op's defaults filled in: a result that spelled them out has the same key
    explicit = {**PARAMS, "lse_layout": "hT", "mode": "merge", "accumulate": "float32"}
    assert case_key(key_parts(_case(params=explicit))) == case_key(a)
    assert case_key(key_parts(_case(env=A100))) != case_key(a)
    assert case_key(key_parts(_case(impl="te_style"))) != case_key(a)
    # a case that never ran (no environment) takes the job's device kind
    assert key_parts(_case(env=None, median=None), "NVIDIA H200") == a
    assert device_kind({"device": "cpu", "device_name": "x86_64"}) == "cpu (x86_64)"


def test_cross_device_comparison_is_refused() -> None:
    with pytest.raises(IncomparableError, match=r"NVIDIA A100.*same kind of device"):
        compare_reports(_report([_case()], "j1"), _report([_case(env=A100)], "j0", envs=[A100]))


# --------------------------------------------------------------------------------- verdicts


def _only(new: list[CaseResult], old: list[CaseResult], **kw):
    c = compare_reports(_report(new, "j1"), _report(old, "j0"), **kw)
    return c, {e.impl: e for e in c.cases}


def test_status_changes() -> None:
    new = [_case("a", status="failed"), _case("b"), _case("c"), _case("e", status="skipped")]
    old = [_case("a"), _case("b", status="crashed", median=None), _case("d"), _case("e")]
    c, by = _only(new, old)
    assert {k: e.status_change for k, e in by.items()} == {
        "a": "newly_failing",
        "b": "fixed",
        "c": "new",
        "d": "missing",
        "e": "changed",
    }
    assert by["a"].regression and by["a"].reasons == ["newly failing: passed -> failed"]
    assert not by["b"].regression and not by["c"].regression and not by["d"].regression
    s = c.summary
    assert (s.newly_failing, s.fixed, s.new, s.missing, s.regressions) == (1, 1, 1, 1, 1)
    assert c.regression and by["d"].case_id is None and by["c"].to_case_id is None


def test_speed_needs_both_significance_and_the_threshold() -> None:
    rng = random.Random(3)
    tight = [1.0 + 0.0005 * (i % 7) for i in range(60)]
    new = [
        _case("slow", samples=[x * 1.10 for x in tight]),
        _case("tiny", samples=[x * 1.02 for x in tight]),  # significant but under 3%
        _case("fast", samples=[x * 0.8 for x in tight]),
        # 10% slower by the median, but too noisy to tell
        _case("noisy", samples=[1.1 * rng.uniform(0.2, 1.8) for _ in range(60)]),
    ]
    old = [_case(n, samples=tight) for n in ("slow", "tiny", "fast")] + [
        _case("noisy", samples=[rng.uniform(0.2, 1.8) for _ in range(60)])
    ]
    _, by = _only(new, old)
    verdicts = {k: e.speed.verdict for k, e in by.items() if e.speed}
    assert verdicts == {"slow": "slower", "tiny": "same", "fast": "faster", "noisy": "same"}
    assert by["slow"].regression and by["slow"].speed.ratio == pytest.approx(1.1)
    assert "x1.100" in by["slow"].reasons[0] and "+3.0%" in by["slow"].reasons[0]
    assert [k for k, e in by.items() if e.regression] == ["slow"]
    # a job-wide threshold of 15% lets the 10% slowdown through; a suite's own one wins
    _, by = _only(new, old, threshold=0.15)
    assert by["slow"].speed.verdict == "same"
    spec = {"suites": [{"regression_threshold": 0.01}]}
    _, by = _only(new, old, threshold=0.15, spec=spec)
    assert by["slow"].speed.verdict == "slower" and by["tiny"].speed.verdict == "slower"


def test_cpu_speed_is_host_normalised_when_both_jobs_timed_the_same_calibration() -> None:
    """The new job ran on a host 30% slower: the same code compares as the same and a 25%
    slower impl (on a host 20% faster) as slower, and the outputs say the ratio is
    host-normalised; with no calibration on one side, or another one, the plain ratio."""
    cpu = Environment(
        device="cpu", device_name="x86_64", torch="2", kassay="0", python="3", hostname="a"
    )
    xs = [1.0 + 0.01 * (i % 5) for i in range(60)]
    cal = [0.5 + 0.005 * (i % 3) for i in range(60)]

    def timed(impl: str, factor: float, host: float, name: str | None = CALIBRATION):
        c = _case(impl, env=cpu)
        c.timing = stats([x * factor * host for x in xs], "cpu_process_time", False, "cpu")
        if name:
            c.timing.calibration, c.timing.calibration_ms = name, [x * host for x in cal]
        return c

    new = [
        timed("same", 1.0, 1.3),
        timed("slow", 1.25, 0.8),
        timed("plain", 1.0, 1.3, None),
        timed("other", 1.0, 1.3, "kassay.cal/2 (test)"),
    ]
    old = [timed(n, 1.0, 1.0) for n in ("same", "slow", "plain", "other")]
    c = compare_reports(_report(new, "j1", envs=(cpu,)), _report(old, "j0", envs=(cpu,)))
    by = {e.impl: e.speed for e in c.cases}
    assert by["same"].host_normalised and by["same"].verdict == "same"
    assert by["same"].ratio == pytest.approx(1.0) and by["same"].raw_ratio == pytest.approx(1.3)
    slow = by["slow"]
    assert slow.host_normalised and slow.verdict == "slower"
    assert slow.ratio == pytest.approx(1.25) and slow.raw_ratio == pytest.approx(1.0)
    (entry,) = [e for e in c.cases if e.regression and e.impl == "slow"]
    assert "host-normalised; plain x1.000" in entry.reasons[0]
    assert "host-normalised) slower" in to_markdown(c)
    for plain in ("plain", "other"):  # the host's 30% is taken for the code's
        assert not by[plain].host_normalised and by[plain].verdict == "slower"
        assert by[plain].ratio == pytest.approx(1.3)


def test_accuracy_changes_beyond_the_policy_noise() -> None:
    # the policy allows factor (2) x the other error + the floor (1e-7 for rel_l2 here)
    new = [_case("worse", rel_l2=3e-6), _case("noise", rel_l2=1.9e-6), _case("better", rel_l2=1e-7)]
    old = [_case("worse"), _case("noise"), _case("better")]
    c, by = _only(new, old)
    assert [(a.metric, a.change) for a in by["worse"].accuracy] == [
        ("rel_l2", "worse"),
        ("max_abs", "worse"),
    ]
    assert by["worse"].accuracy[0].limit == pytest.approx(2.1e-6)
    assert by["worse"].regression and "less accurate: out rel_l2" in by["worse"].reasons[0]
    assert by["noise"].accuracy == [] and not by["noise"].regression
    assert {a.change for a in by["better"].accuracy} == {"better"}
    assert not by["better"].regression
    assert (c.summary.less_accurate, c.summary.more_accurate) == (1, 1)
    # a looser tolerance factor in the suite is looser here too
    _, by = _only(new, old, spec={"suites": [{"tolerance": {"factor": 4.0}}]})
    assert by["worse"].accuracy == []


def test_memory_growth_beyond_the_threshold() -> None:
    mib = 1 << 20
    new = [_case("more", peak=12 * mib), _case("same", peak=10 * mib + 4096)]
    old = [_case("more", peak=10 * mib), _case("same", peak=10 * mib)]
    _, by = _only(new, old)
    assert by["more"].memory.verdict == "more" and by["more"].regression
    assert by["same"].memory.verdict == "same" and not by["same"].regression
