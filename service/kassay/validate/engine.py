"""The engine: run one input group -> one CaseResult per impl.

A group shares (op, params, regime, seed): its inputs are generated once and its float64
reference computed once; then every impl runs on the same inputs and is compared, timed and
measured. The same-dtype baseline impl runs first (its errors set the tolerance of the others)
unless its own error is far from the truth (then it fails as `baseline_suspect` and the others
are judged by the absolute policy); when it is not among the group's impls it still runs,
unreported. An error that far off which the case's precision explains is not suspect: the
baseline is judged again, by the same rule, against the op's precision reference (flce: the
truth with 16-bit logits, which cost every eager impl percents at |z| ~ 1e3); passing there, the
case says so (flag `baseline_explained`, the numbers in its message), the precision reference is
kept for the rest of the group, and on that output every other impl passes when it is accurate
(the absolute policy against the exact reference) or computes what a correct impl of that
precision computes (factor x the baseline's error against the precision reference + floor):
"factor x" the baseline's percents against the exact truth would let percent-level bugs through
(kassay.validate.explained). Every impl runs twice on the same inputs (the timing loop's first
call is the second run): outputs that differ bit for bit fail unless the impl declares itself
nondeterministic. An output scaled by a systematic factor beyond the baseline's fails as biased
(kassay.validate.verdicts). An impl that raises yields status `error` with the exception's type
and message: the engine never dies because an impl did.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kassay.contract.results import (
    CaseResult,
    Environment,
    MemoryStats,
    OutputMetrics,
    TimingStats,
    WorstEntry,
)
from kassay.contract.spec import GroupSpec, case_id
from kassay.impls import Impl, get_impl, load
from kassay.ops import Op, OutputSpec, get_op
from kassay.ops.base import CONDITIONING, SCALE_NOISE
from kassay.validate import interpreter
from kassay.validate.case_result import case_result
from kassay.validate.ceilings import measure_ceilings
from kassay.validate.env import environment, resolve_device
from kassay.validate.explained import judge_explained
from kassay.validate.metrics import RawMetrics, compare, rounding_error
from kassay.validate.reference_cache import shared_cache
from kassay.validate.timing import time_call
from kassay.validate.tolerance import Verdict, baseline_usable, judge, tolerances
from kassay.validate.verdicts import (
    Floor,
    check_bias,
    effective_floor,
    participation,
    ref_rms,
    run_to_run,
    suspect_reason,
)

log = logging.getLogger(__name__)
Tensors = dict[str, torch.Tensor]
#: what an output's reason says when the baseline's error there is explained by its precision
EXPLAINED = "baseline explained by its precision"
#: the reference dict's key prefix for an output's rounding noise (Op.reference_noise)
NOISE_KEY = "~noise:"
#: ... and for the figures of an output's floor that only the reference decides (its rounding
#: to the output's dtype and precision, its rms): kept with it in the reference cache, as they
#: took ~1 s of a repeated CI grid to compute again (#15)
FLOOR_KEY = "~floor:"
#: (output spec, the baseline's copy of it, its errors against the exact reference, the floor)
#: -> why the case's precision explains those errors, or None
Explain = Callable[[OutputSpec, torch.Tensor, RawMetrics, Floor], str | None]


@dataclass
class _Precise:
    """An output on which the baseline is explained: the precision reference of it, the rounding
    that reference does (in words) and the baseline's errors against it."""

    ref: torch.Tensor
    what: str
    base: RawMetrics


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _poison_allocator(device: torch.device, nbytes: int) -> None:
    """Fill memory the caching allocator will hand out next with NaN, so an output an impl
    allocates but never writes shows up as NaN instead of as stale or zero data."""
    if device.type != "cuda" or nbytes <= 0:
        return
    free, _total = torch.cuda.mem_get_info(device)
    n = min(nbytes, free // 4) // 4
    if n > 0:
        t = torch.full((n,), float("nan"), device=device)
        del t


class _Run:
    """Outputs, wall time and memory of one call of an impl, and the Triton kernels it launched
    under the CPU interpreter."""

    def __init__(
        self,
        outputs: Tensors | None,
        error: str | None,
        peak: int | None,
        ms: float = 0.0,
        interpreted: int = 0,
    ) -> None:
        self.outputs, self.error, self.peak, self.ms = outputs, error, peak, ms
        self.interpreted = interpreted


def _call(
    impl: Impl, inputs: Tensors, params: Any, device: torch.device, poison_bytes: int
) -> _Run:
    _poison_allocator(device, poison_bytes)
    before = 0
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    launched = interpreter.launches() if device.type == "cpu" else 0
    t0 = time.perf_counter()
    try:
        outs = impl.run(inputs, params)
        _sync(device)
    except Exception as exc:  # the impl's failure is a result, not the engine's
        return _Run(None, f"{type(exc).__name__}: {exc}{interpreter.where(exc)}", None)
    ms = (time.perf_counter() - t0) * 1e3
    peak = None
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - before
    interpreted = interpreter.launches() - launched if device.type == "cpu" else 0
    return _Run(outs, None, peak, ms, interpreted)


def _bfloat16_case(inputs: Tensors, specs: list[OutputSpec]) -> bool:
    """Whether a case computes in bfloat16: an input, an output or the outputs' precision."""
    return any(t.dtype == torch.bfloat16 for t in inputs.values()) or any(
        "bfloat16" in (s.dtype_name, s.precision_name) for s in specs
    )


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


class _Baseline:
    """What the group's baseline left for the other impls, per output: its raw errors (None:
    unusable), whether it was found suspect, and where its error is explained by its precision
    what the others are judged against there."""

    def __init__(self) -> None:
        self.raw: dict[str, RawMetrics | None] = {}
        self.suspect: dict[str, bool] = {}
        self.precise: dict[str, _Precise] = {}


def _unmeasurable(spec: OutputSpec, out: torch.Tensor | None, ref: torch.Tensor) -> str | None:
    if out is None:
        return "output missing"
    if tuple(out.shape) != tuple(ref.shape):
        return f"shape {list(out.shape)} differs from the reference's {list(ref.shape)}"
    return None


def _metrics_for(
    spec: OutputSpec,
    out: torch.Tensor | None,
    ref: torch.Tensor,
    group: GroupSpec,
    baseline: _Baseline,
    floor: Floor,
    *,
    is_baseline: bool,
    second: torch.Tensor | None,
    declared_nondeterministic: bool,
    explain: Explain | None = None,
) -> tuple[OutputMetrics, RawMetrics | None]:
    """Errors and verdict of one output; `second` is the same output from a second run on the
    same inputs (None: not available); `explain` is asked, for the baseline only and only when it
    looks suspect, whether the case's precision explains its error. Another impl's output on
    which the baseline was explained is judged by `judge_explained` (under the baseline policy)."""
    atol, rtol = tolerances(group.tolerance, spec.dtype)
    unmeasurable = _unmeasurable(spec, out, ref)
    if out is None or unmeasurable:
        nan = float("nan")
        return OutputMetrics(
            name=spec.name,
            dtype=_dtype_name(out.dtype) if out is not None else "-",
            expected_dtype=_dtype_name(spec.dtype),
            shape=list(out.shape if out is not None else ref.shape),
            max_abs=nan,
            max_rel=nan,
            rel_l2=nan,
            max_ulp=nan,
            nan=0,
            inf=0,
            ref_nan=0,
            ref_inf=0,
            passed=False,
            reason=unmeasurable or "",
            policy=group.tolerance.policy,
        ), None
    raw = compare(out, ref, atol=atol, rtol=rtol)
    dtype_ok = not spec.strict_dtype or out.dtype == spec.dtype
    floor_t = (floor.max_abs, floor.rel_l2)
    dtype_msg = f"dtype {out.dtype} but the op requires {spec.dtype}"
    suspect_msg = explained = ""
    if is_baseline:
        suspect_msg = suspect_reason(raw, floor) or ""
        if suspect_msg and explain is not None:
            explained = explain(spec, out, raw, floor) or ""
            suspect_msg = "" if explained else suspect_msg
        suspect = bool(suspect_msg)
        # a trusted baseline meets its own bar unless NaN/Inf, zeros or a wrong dtype
        base = None if suspect else raw
    else:
        base = baseline.raw.get(spec.name)
        suspect = baseline.suspect.get(spec.name, False)
    precise = None if is_baseline else baseline.precise.get(spec.name)
    ev = None
    if precise is not None and group.tolerance.policy == "baseline":
        ev = judge_explained(
            spec.name,
            raw,
            compare(out, precise.ref, atol=atol, rtol=rtol),
            precise.base,
            policy=group.tolerance,
            atol_rtol=(atol, rtol),
            floor=floor,
            dtype_ok=dtype_ok,
            dtype_msg=dtype_msg,
            precision=precise.what,
        )
        # the tolerance's limits are not against the reported (exact) errors: none recorded
        v = Verdict(ev.passed, ev.reason, ev.policy)
        spread_limit: float | None = ev.spread_limit
    else:
        v = judge(
            raw,
            policy=group.tolerance,
            base=base,
            floor=floor_t,
            dtype_ok=dtype_ok,
            dtype_msg=dtype_msg,
            base_suspect=suspect,
        )
        spread_limit = v.threshold_max_abs
    passed, reasons = v.passed, [v.reason] if v.reason and not v.passed else []
    if suspect_msg:
        passed, reasons = False, [suspect_msg, *reasons]
    # systematic scale: judged against the trusted baseline's own (0 when there is none); on an
    # explained output judge_explained did it
    bias_limit = None
    if ev is not None:
        bias_limit = ev.bias_limit
    elif not is_baseline and not raw.mismatched_nonfinite:
        bv = check_bias(
            spec.name,
            raw,
            base if baseline_usable(base) and not suspect else None,
            floor,
            group.tolerance.factor,
        )
        bias_limit = bv.limit
        if not bv.passed:
            passed, reasons = False, [*reasons, bv.reason]
    spread = None
    if second is not None:
        rr = run_to_run(out, second)
        spread = rr.max_abs
        if not rr.identical:
            what = (
                f"nondeterministic: a second run on the same inputs differs in {rr.n_diff} "
                f"element(s) (max |run 1 - run 2| {rr.max_abs:.3g})"
            )
            limit = spread_limit if spread_limit is not None else atol
            if not declared_nondeterministic:
                passed, reasons = False, [*reasons, what]
            elif not rr.max_abs <= limit:
                passed, reasons = False, [*reasons, f"{what} beyond the limit {limit:.3g}"]
    return OutputMetrics(
        name=spec.name,
        dtype=_dtype_name(out.dtype),
        expected_dtype=_dtype_name(spec.dtype),
        shape=list(out.shape),
        max_abs=raw.max_abs,
        max_rel=raw.max_rel,
        rel_l2=raw.rel_l2,
        max_ulp=raw.max_ulp,
        nan=raw.nan,
        inf=raw.inf,
        ref_nan=raw.ref_nan,
        ref_inf=raw.ref_inf,
        n_bad=raw.n_bad,
        worst=[WorstEntry(index=i, value=o, reference=r, abs_err=e) for i, o, r, e in raw.worst],
        policy=v.policy,
        threshold_max_abs=v.threshold_max_abs,
        threshold_rel_l2=v.threshold_rel_l2,
        baseline_max_abs=base.max_abs if base is not None else None,
        baseline_rel_l2=base.rel_l2 if base is not None else None,
        passed=passed,
        reason="; ".join(
            r for r in ([*reasons, explained] if not passed else [v.reason, explained]) if r
        ),
        baseline_suspect=suspect,
        bias=raw.bias,
        bias_limit=bias_limit,
        run_to_run_max_abs=spread,
    ), (None if suspect else raw)


def _flags(outputs: list[OutputMetrics]) -> list[str]:
    flags = []
    if any(o.baseline_suspect for o in outputs):
        flags.append("baseline_suspect")
    if any(EXPLAINED in o.reason for o in outputs):
        flags.append("baseline_explained")
    if any("nondeterministic" in o.reason or (o.run_to_run_max_abs or 0) > 0 for o in outputs):
        flags.append("nondeterministic")
    if any(" biased by " in o.reason for o in outputs):
        flags.append("biased")
    return flags


def _throughput(t: TimingStats, op: Op, params: Any, ceilings: dict[str, float] | None) -> None:
    sec = t.median_ms * 1e-3
    if sec <= 0:
        return
    flops, nbytes = op.flops(params), op.bytes_moved(params)
    t.tflops = flops / sec / 1e12
    t.gbps = nbytes / sec / 1e9
    if ceilings:
        floor_s = max(
            flops / (ceilings["matmul_tflops"] * 1e12), nbytes / (ceilings["copy_gbps"] * 1e9)
        )
        t.roofline_fraction = floor_s / sec


class GroupRunner:
    """Runs the cases of one group; kept as an object so inputs and reference are built once."""

    def __init__(
        self,
        group: GroupSpec,
        device: torch.device,
        *,
        include_mutants: bool,
        include_testing: bool,
        worker: str | None,
        ceilings: bool | dict[str, float],
    ) -> None:
        self.group = group
        self.device = device
        self.worker = worker
        self.op = get_op(group.op)
        self.params = self.op.parse_params(group.params)
        self.env = environment(device)
        self.ceilings = (
            dict(ceilings)
            if isinstance(ceilings, dict)
            else measure_ceilings(device)
            if ceilings
            else None
        )
        self.include = {"include_mutants": include_mutants, "include_testing": include_testing}
        self.specs = self.op.outputs(self.params)
        cache = shared_cache()
        self.inputs, self.ref, hit = cache.get_or_make(
            cache.key(group.op, group.params, group.regime, group.seed, device),
            device,
            lambda: self.op.make_inputs(self.params, group.regime, group.seed, device),
            self._make_reference,
        )
        self.env = Environment.model_validate(
            {**self.env.model_dump(), "reference_cache": "hit" if hit else "miss"}
        )
        self.floors = {s.name: self._floor(s) for s in self.specs}
        self.baseline = _Baseline()
        self._precision_ref: Tensors | None = None
        self.base_median: float | None = None
        self.poison = 2 * self.op.unavoidable_bytes(self.params)
        self.bfloat16 = _bfloat16_case(self.inputs, self.specs)

    def _make_reference(self, inputs: Tensors) -> Tensors:
        ref, noise = self.op.reference_noise(inputs, self.params)
        # kept with the reference (and in its cache) under names no output can have
        for name, sigma in noise.items():
            ref[NOISE_KEY + name] = torch.tensor(sigma, dtype=torch.float64)
        for spec in self.specs:
            out = ref[spec.name]
            prec = spec.precision if spec.precision not in (None, spec.dtype) else None
            ref[FLOOR_KEY + spec.name] = torch.tensor(
                [
                    *rounding_error(out, spec.dtype),
                    ref_rms(out),
                    *(rounding_error(out, prec) if prec is not None else (math.nan, math.nan)),
                    participation(out),
                ],
                dtype=torch.float64,
            )
        return ref

    def _floor(self, spec: OutputSpec) -> Floor:
        abs_err, rel_err, rms, p_abs, p_rel, part = self.ref[FLOOR_KEY + spec.name].tolist()
        noise = self.ref.get(NOISE_KEY + spec.name)
        scale_noise = self.ref.get(NOISE_KEY + SCALE_NOISE + spec.name)
        cond = [self.ref.get(NOISE_KEY + CONDITIONING + k + spec.name) for k in ("abs:", "rel:")]
        return effective_floor(
            (abs_err, rel_err),
            spec.reduction,
            rms,
            (p_abs, p_rel) if not math.isnan(p_abs) else None,
            noise_abs=float(noise) if noise is not None else 0.0,
            scale_noise=float(scale_noise) if scale_noise is not None else 0.0,
            conditioning=(
                float(cond[0]) if cond[0] is not None else 0.0,
                float(cond[1]) if cond[1] is not None else 0.0,
            ),
            participation=part,
        )

    def _explain(
        self, spec: OutputSpec, out: torch.Tensor, raw: RawMetrics, floor: Floor
    ) -> str | None:
        """Is the baseline's error on `spec`, suspect against the exact reference, what a
        correct impl of the case's precision makes? Judged by the same suspect rule against the
        op's precision reference, computed here on first need (a second float64 reference).
        Where it is, that output of the precision reference and the baseline's errors against
        it are kept (self.baseline.precise) to judge the other impls by."""
        what = self.op.precision_rounding(self.params)
        if what is None:
            return None
        if self._precision_ref is None:
            self._precision_ref = self.op.precision_reference(self.inputs, self.params)
        ref = self._precision_ref.get(spec.name)
        if ref is None or tuple(ref.shape) != tuple(out.shape):
            return None
        atol, rtol = tolerances(self.group.tolerance, spec.dtype)
        there = compare(out, ref, atol=atol, rtol=rtol)
        if there.mismatched_nonfinite or suspect_reason(there, floor) is not None:
            return None
        self.baseline.precise[spec.name] = _Precise(ref, what, there)
        return (
            f"{EXPLAINED}: rel_l2 {raw.rel_l2:.3g} against the exact "
            f"reference, {there.rel_l2:.3g} against the reference with {what}; the others "
            "are judged against both"
        )

    def close(self) -> None:
        """Free what the group held beyond its cached inputs and reference: the precision
        reference's outputs kept for an explained baseline."""
        self.baseline.precise.clear()
        self._precision_ref = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _result(self, impl_name: str, status: str, message: str = "", **kw: Any) -> CaseResult:
        return case_result(
            self.group,
            impl_name,
            status,  # type: ignore[arg-type]
            message,
            worker=self.worker,
            device=str(self.device),
            environment=self.env,
            **kw,
        )

    def _speed(self, timing: TimingStats, is_baseline: bool) -> None:
        """Throughput, roofline and speed-up against the baseline of a timed case."""
        _throughput(timing, self.op, self.params, self.ceilings)
        if is_baseline:
            self.base_median = timing.median_ms
        elif self.base_median:
            timing.speedup_vs_baseline = self.base_median / timing.median_ms

    def run_case(self, impl_name: str, *, is_baseline: bool = False) -> CaseResult:
        t0 = time.perf_counter()
        impl = get_impl(self.group.op, impl_name, **self.include)
        reason = impl.supports(self.params, self.device)
        if reason:
            return self._result(impl_name, "unsupported", reason)
        remote = impl.remote
        second: list[Tensors] = []
        timing = None
        timing_error = ""
        if remote is not None:
            # code a job brought: it ran in its own sandboxed process, which hands back its
            # outputs and its own timing and memory; the verdict is made here
            rr = remote(
                self.inputs,
                self.params,
                self.group.timing.model_dump() if self.group.timing.enabled else None,
                f"{self.op.name}/{impl.name}",
            )
            if rr.unsupported:
                return self._result(impl_name, "unsupported", rr.unsupported, ran_in="sandbox")
            if rr.crashed:
                if is_baseline:
                    self.baseline.raw = dict.fromkeys(self.floors)
                return self._result(
                    impl_name,
                    "crashed",
                    rr.error or "the sandbox died",
                    duration_s=time.perf_counter() - t0,
                    ran_in="sandbox",
                )
            run = _Run(rr.outputs, rr.error, rr.peak_bytes, rr.ms, rr.interpreted)
            if rr.second is not None:
                second.append(rr.second)
            timing_error = rr.timing_error
            if rr.timing is not None and run.error is None:
                try:
                    timing = TimingStats.model_validate(rr.timing)
                except ValueError as exc:
                    timing_error = f"the sandbox's timing figures are not valid: {exc}"[:500]
        else:
            run = _call(impl, self.inputs, self.params, self.device, self.poison)
        ran_in = "sandbox" if remote is not None else "trusted"
        if run.interpreted and self.bfloat16 and interpreter.interpreting():
            if is_baseline:  # the interpreter's numbers set no one's limits
                self.baseline.raw = dict.fromkeys(self.floors)
            return self._result(
                impl_name,
                "skipped",
                interpreter.NOT_JUDGED,
                duration_s=time.perf_counter() - t0,
                ran_in=ran_in,
            )
        if run.error is not None or run.outputs is None:
            if is_baseline:
                self.baseline.raw = dict.fromkeys(self.floors)
            return self._result(
                impl_name,
                "error",
                run.error or "no outputs",
                duration_s=time.perf_counter() - t0,
                ran_in=ran_in,
            )
        model = self.op.unavoidable_bytes(self.params)
        where = " (measured in the sandbox the job's code ran in)" if remote is not None else ""
        if run.peak is not None:
            memory = MemoryStats(
                measured=True,
                peak_extra_bytes=run.peak,
                model_bytes=model,
                ratio_to_model=run.peak / model if model else None,
                note=where.strip(" ()"),
            )
        else:
            memory = MemoryStats(
                measured=False,
                model_bytes=model,
                note="peak memory is measured on CUDA devices only",
            )
        if remote is not None:
            if timing is not None:
                self._speed(timing, is_baseline)
        elif self.group.timing.enabled:
            # The second run on the same inputs (determinism): the timing loop's first call
            # when the case is timed, else one more call.

            def timed() -> Tensors:
                outs = impl.run(self.inputs, self.params)
                if not second:
                    second.append(outs)
                return outs

            try:
                timing = time_call(
                    timed,
                    self.device,
                    self.group.timing,
                    capture_key=f"{self.op.name}/{impl.name}",
                    ran_ms=run.ms,
                )
                self._speed(timing, is_baseline)
            except Exception as exc:  # timing re-runs the impl; a flaky impl is a result too
                timing_error = f"raised while timing: {type(exc).__name__}: {exc}"
        else:
            again = _call(impl, self.inputs, self.params, self.device, 0)
            if again.outputs is not None:
                second.append(again.outputs)
            elif again.error:
                timing_error = f"raised on a second run: {again.error}"
        outputs: list[OutputMetrics] = []
        for spec in self.specs:
            om, raw = _metrics_for(
                spec,
                run.outputs.get(spec.name),
                self.ref[spec.name],
                self.group,
                self.baseline,
                self.floors[spec.name],
                is_baseline=is_baseline,
                second=second[0].get(spec.name) if second else None,
                declared_nondeterministic=impl.nondeterministic,
                explain=self._explain if is_baseline else None,
            )
            if is_baseline:
                self.baseline.raw[spec.name] = raw
                self.baseline.suspect[spec.name] = om.baseline_suspect
            outputs.append(om)
        del run
        second.clear()
        # The outputs on which the baseline is explained stay (in self.baseline.precise) to
        # judge the other impls by, until the group ends (close); the rest go now.
        self._precision_ref = None
        failed = [o for o in outputs if not o.passed]
        status = "failed" if failed else "passed"
        noted = [o for o in outputs if o.passed and EXPLAINED in o.reason]
        message = "; ".join(f"{o.name}: {o.reason}" for o in failed + noted)
        if timing_error:
            status, message = "error", timing_error
        # Outputs are freed by reference counting (a full gc.collect() here cost ~100 ms a
        # case); the allocator's cache is emptied when the group ends (close), as the group's
        # next impl needs blocks of the same sizes
        return self._result(
            impl_name,
            status,
            message,
            outputs=outputs,
            timing=timing,
            memory=memory,
            duration_s=time.perf_counter() - t0,
            flags=_flags(outputs),
            ran_in=ran_in,
        )


def run_group(
    group: GroupSpec,
    *,
    device: str | torch.device = "auto",
    include_mutants: bool = False,
    include_testing: bool = False,
    on_start: Callable[[str], None] | None = None,
    on_result: Callable[[CaseResult], None] | None = None,
    worker: str | None = None,
    ceilings: bool | dict[str, float] = True,
) -> list[CaseResult]:
    """Run every impl of `group`; results come back in the group's impl order, and also one by
    one through on_result as they finish (on_start fires before each case). `ceilings`: True
    measures the device's matmul/copy ceilings (once per process), a dict supplies them (a
    restarted executor reuses its predecessor's), False leaves roofline fractions out."""
    load(mutants=include_mutants, testing=include_testing)
    dev = resolve_device(device)
    if group.convergence is not None:
        from kassay.validate.convergence import run_convergence

        return run_convergence(
            group,
            dev,
            include_mutants=include_mutants,
            include_testing=include_testing,
            on_start=on_start,
            on_result=on_result,
            worker=worker,
            environment=environment(dev),
        )
    runner = GroupRunner(
        group,
        dev,
        include_mutants=include_mutants,
        include_testing=include_testing,
        worker=worker,
        ceilings=ceilings,
    )
    order = list(group.impls)
    if group.baseline in order:
        order.remove(group.baseline)
        order.insert(0, group.baseline)
    else:
        base = runner.run_case(group.baseline, is_baseline=True)
        if base.status not in ("passed", "failed"):
            log.info(
                "baseline %s unusable for %s: %s", group.baseline, group.group_id, base.message
            )
    results: dict[str, CaseResult] = {}
    try:
        for name in order:
            if on_start is not None:
                on_start(case_id(group.group_id, name))
            res = runner.run_case(name, is_baseline=name == group.baseline)
            results[name] = res
            if on_result is not None:
                on_result(res)
    finally:
        runner.close()
    return [results[n] for n in group.impls]
