"""Run a convergence group: train the model with each impl in the op's place and judge the
held-out loss differences (kassay.validate.convergence.stats).

Arms, each trained over the same seeds (seed s: the same initial weights and the same batches
in every arm): the baseline, the control (a correct alternative: the benign band), then each
impl of the group, whose case result is reported as soon as its seeds are done. Evaluation runs
every `eval_every` steps on a fixed held-out set with the reference head and merge.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import math
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from kassay.contract.results import CaseResult, ConvergenceResult
from kassay.contract.spec import ConvergencePolicy, GroupSpec, case_id
from kassay.impls import get_impl, load_with_corpora
from kassay.ops import get_op
from kassay.validate.case_result import case_result
from kassay.validate.convergence import stats
from kassay.validate.convergence.data import Language, uniform_loss
from kassay.validate.convergence.data import held_out as data_held_out
from kassay.validate.convergence.model import Decoder, Shape

#: a run whose held-out loss climbs this far above the uniform guess has diverged
DIVERGED_OVER_UNIFORM = 1.0


@dataclass
class Run:
    curve: list[float]  # held-out loss at each eval step
    calls: int
    diverged: bool

    @property
    def final(self) -> float:
        return self.curve[-1] if self.curve and not self.diverged else math.nan


def eval_steps(policy: ConvergencePolicy) -> list[int]:
    steps = list(range(0, policy.steps, policy.eval_every))
    return [*steps, policy.steps] if steps[-1] != policy.steps else steps


def train(
    policy: ConvergencePolicy,
    seed: int,
    slot: str,
    fn: Any,
    device: torch.device,
) -> Run:
    """One arm at one seed: `fn` takes the model's `slot` ("head" or "merge")."""
    shape = Shape(**policy.shape())
    lang = Language(shape.vocab, shape.seq)
    torch.manual_seed(seed)
    model = Decoder(shape).to(device)  # the same initial weights in every arm at this seed
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=policy.lr,
        betas=(0.9, 0.95),
        weight_decay=0.0,
        fused=device.type == "cuda",  # one launch per step: small models are launch-bound
    )
    # the same batches too, made at once and moved once (the walk is sequential per token)
    data = torch.Generator().manual_seed(seed * 1_000_003 + 7)
    batches = lang.batch(policy.steps * shape.batch, data).to(device)
    batches = batches.view(policy.steps, shape.batch, shape.seq)
    held_out = data_held_out(shape.vocab, shape.seq, policy.eval_batch).to(device)
    kwargs = {slot: fn}
    curve: list[float] = []
    diverged = False
    wanted = set(eval_steps(policy))
    limit = uniform_loss(shape.vocab) + DIVERGED_OVER_UNIFORM

    def evaluate() -> None:
        nonlocal diverged
        with torch.no_grad():
            loss = float(model.loss(held_out))
        curve.append(loss)
        if not math.isfinite(loss) or loss > limit:
            diverged = True

    for step in range(policy.steps):
        if step in wanted:
            evaluate()
            if diverged:
                break
        loss = model.loss(batches[step], **kwargs)
        # a non-finite loss is caught at the next evaluation (no host sync every step): the
        # weights it poisons make the held-out loss non-finite too
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    else:
        evaluate()
    return Run(curve, 0, diverged)


def _train_one(
    impl: Any,
    params: Any,
    policy: ConvergencePolicy,
    slot_mod: Any,
    seed: int,
    device: torch.device,
) -> Run:
    calls = [0]
    run = train(policy, seed, slot_mod.SLOT, slot_mod.wrap(impl, params, calls), device)
    run.calls = calls[0]
    return run


def parallel_seeds(policy: ConvergencePolicy, device: torch.device, n_seeds: int) -> int:
    """How many seeds train side by side, in processes of their own: `policy.parallel`, else
    on a GPU up to half the host's cores (a step of this small model is host-bound, 25-42 ms on
    the H200's host, so one process leaves the GPU idle), on a CPU one."""
    if policy.parallel:
        return min(policy.parallel, n_seeds)
    if device.type != "cuda":
        return 1  # a CPU worker's cores already run torch's threads
    return max(1, min(n_seeds, (os.cpu_count() or 2) // 2))


def _pool(
    policy: ConvergencePolicy,
    device: torch.device,
    n_seeds: int,
    include_testing: bool,
) -> ProcessPoolExecutor | None:
    n = parallel_seeds(policy, device, n_seeds)
    if n <= 1:
        return None
    return ProcessPoolExecutor(
        max_workers=n,
        mp_context=multiprocessing.get_context("spawn"),  # CUDA cannot be forked
        initializer=_child_init,
        initargs=(include_testing, str(device)),
    )


def _child_init(include_testing: bool, device: str) -> None:
    """A seed's process: dies with its parent (an executor killed mid-case leaves no training
    behind), one torch thread (its siblings share the cores), the impls loaded."""
    _die_with_parent()
    torch.set_num_threads(1)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    load_with_corpora(testing=include_testing)  # names reach a child vetted by its parent
    _CHILD["include_testing"] = include_testing


_CHILD: dict[str, Any] = {}
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent (the executor) dies."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _train_in_child(
    op_name: str,
    impl_name: str,
    params_dump: dict[str, Any],
    policy: ConvergencePolicy,
    seed: int,
    device: str,
) -> Run:
    """One seed of one arm in a pool process: impls travel by name (they do not pickle)."""
    op = get_op(op_name)
    impl = get_impl(
        op_name,
        impl_name,
        include_mutants=True,  # the control arm is an alternative (hidden kind)
        include_testing=_CHILD.get("include_testing", False),
    )
    slot_mod = importlib.import_module(op.convergence_module or "")
    return _train_one(
        impl, op.parse_params(params_dump), policy, slot_mod, seed, torch.device(device)
    )


def _finite(xs: list[float]) -> list[float | None]:
    return [x if math.isfinite(x) else None for x in xs]


def run_convergence(
    group: GroupSpec,
    device: torch.device,
    *,
    include_mutants: bool = False,
    include_testing: bool = False,
    on_start: Callable[[str], None] | None = None,
    on_result: Callable[[CaseResult], None] | None = None,
    worker: str | None = None,
    environment: Any = None,
) -> list[CaseResult]:
    policy = group.convergence
    assert policy is not None
    load_with_corpora(testing=include_testing)  # the control arm: an alternative (hidden)
    op = get_op(group.op)
    params = op.parse_params(group.params)
    assert op.convergence_module is not None
    slot_mod = importlib.import_module(op.convergence_module)
    control = policy.control or slot_mod.CONTROL
    seeds = [group.seed + i for i in range(policy.seeds)]
    shape = Shape(**policy.shape())
    lang = Language(shape.vocab, shape.seq)
    expected_calls = policy.steps * (shape.layers if slot_mod.SLOT == "merge" else 1)

    def arm(name: str, *, hidden_ok: bool = False) -> list[Run] | str:
        """Runs of impl `name` over the seeds, or why it cannot be trained here. `hidden_ok`:
        the control arm, which may be a correct alternative (a hidden kind) but no mutant
        unless mutants are enabled."""
        impl = get_impl(
            group.op, name, include_mutants=include_mutants or hidden_ok,
            include_testing=include_testing,
        )  # fmt: skip
        if impl.kind == "mutant" and not include_mutants:
            return f"{name} is a mutant (KASSAY_ENABLE_MUTANTS is off)"
        if impl.remote is not None:
            return "code a job brings is not trained in the convergence model (it runs sandboxed)"
        why = impl.supports(params, device)
        if why:
            return why
        if pool is not None:  # the seeds side by side, one process each
            jobs = [
                pool.submit(_train_in_child, group.op, name, group.params, policy, s, str(device))
                for s in seeds
            ]
            return [j.result() for j in jobs]
        return [_train_one(impl, params, policy, slot_mod, s, device) for s in seeds]

    def result(
        name: str, status: str, message: str, conv: ConvergenceResult | None, *, t0: float
    ) -> CaseResult:
        return case_result(
            group,
            name,
            status,  # type: ignore[arg-type]
            message,
            convergence=conv,
            duration_s=time.perf_counter() - t0,
            worker=worker,
            device=str(device),
            environment=environment,
        )

    results: dict[str, CaseResult] = {}
    pool = _pool(policy, device, len(seeds), include_testing)

    def safe_arm(name: str, *, hidden_ok: bool = False) -> list[Run] | str:
        try:
            return arm(name, hidden_ok=hidden_ok)
        except Exception as exc:  # the impl raised while training
            return f"{type(exc).__name__}: {exc}"

    base = safe_arm(group.baseline)
    ctrl = safe_arm(control, hidden_ok=True) if not isinstance(base, str) else base
    try:
        for name in group.impls:
            if on_start is not None:
                on_start(case_id(group.group_id, name))
            t0 = time.perf_counter()
            try:
                if isinstance(base, str):
                    res = result(
                        name,
                        "error",
                        f"the baseline {group.baseline} cannot train: {base}",
                        None,
                        t0=t0,
                    )
                elif isinstance(ctrl, str):
                    res = result(
                        name, "error", f"the control {control} cannot train: {ctrl}", None, t0=t0
                    )
                else:
                    runs = base if name == group.baseline else arm(name)
                    if isinstance(runs, str):
                        res = result(name, "unsupported", runs, None, t0=t0)
                    else:
                        res = _judge(name, runs, base, ctrl, control, policy, seeds, lang, shape,
                                     expected_calls, functools.partial(result, name, t0=t0))  # fmt: skip
            except Exception as exc:  # the impl raised while training
                res = result(name, "error", f"{type(exc).__name__}: {exc}", None, t0=t0)
            results[name] = res
            if on_result is not None:
                on_result(res)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return [results[n] for n in group.impls]


def _judge(
    name: str,
    runs: list[Run],
    base: list[Run],
    ctrl: list[Run],
    control: str,
    policy: ConvergencePolicy,
    seeds: list[int],
    lang: Language,
    shape: Shape,
    expected_calls: int,
    make: Callable[..., CaseResult],
) -> CaseResult:
    j = stats.judge(
        [r.final for r in runs],
        [r.final for r in base],
        [r.final for r in ctrl],
        policy.margin_sigma,
        policy.margin_floor,
    )
    eq = j.eq
    calls = min(r.calls for r in runs)
    verdict, message = eq.verdict, eq.reason
    not_called = [r.calls for r in runs if not r.diverged and r.calls != expected_calls]
    if not_called:
        verdict = "failed"
        message = f"the impl was called {not_called[0]} times in a run, not {expected_calls}"
    elif any(r.diverged for r in runs):
        verdict = "failed"
        message = "training diverged (held-out loss not finite or past the uniform guess) " + (
            f"at seed(s) {', '.join(str(s) for s, r in zip(seeds, runs, strict=True) if r.diverged)}"
        )
    conv = ConvergenceResult(
        verdict=verdict,  # type: ignore[arg-type]
        steps=policy.steps,
        seeds=seeds,
        eval_steps=eval_steps(policy),
        curves=[_finite(r.curve) for r in runs],
        baseline_curves=[_finite(r.curve) for r in base],
        control=control,
        control_curves=[_finite(r.curve) for r in ctrl],
        diffs=_finite(j.diffs),
        control_diffs=_finite(j.control_diffs),
        mean_diff=eq.mean if math.isfinite(eq.mean) else None,
        ci_low=eq.low if math.isfinite(eq.low) else None,
        ci_high=eq.high if math.isfinite(eq.high) else None,
        margin=j.margin,
        sigma_seed=j.sigma if math.isfinite(j.sigma) else 0.0,
        detectable=verdict == "failed" or j.detectable,  # not called: failed, detectable
        calls=calls,
        entropy_floor=lang.entropy_floor(),
        uniform_loss=uniform_loss(shape.vocab),
    )
    if verdict == "passed":
        note = "detectable against the control arm, not material" if conv.detectable else ""
        return make("passed", note, conv)
    if verdict == "inconclusive":
        # a gate fails closed: the case is failed, its verdict says why
        return make("failed", f"inconclusive: {message}", conv)
    return make("failed", message, conv)
