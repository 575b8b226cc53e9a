"""Convergence, its parts: the equivalence verdict on matched differences, the language's
entropy floor, a convergence suite's expansion (the model sets the op's shape; options it
cannot train with are a 422 saying why) and its travel over the wire, and one tiny training run
per op slot (the impl is called once per step and layer, matched seeds give identical runs)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from kassay.contract.spec import ConvergencePolicy, parse_spec
from kassay.errors import InvalidSpecError
from kassay.ops.expand import expand
from kassay.validate.convergence import stats
from kassay.validate.convergence.data import Language


def test_equivalence_passes_fails_and_asks_for_more_seeds() -> None:
    assert stats.equivalence([0.001, -0.002, 0.0005, 0.001], 0.01).verdict == "passed"
    assert stats.equivalence([0.0, 0.0, 0.0], 0.005).verdict == "passed"  # bit-identical
    far = stats.equivalence([0.30, 0.32, 0.31], 0.01)
    assert far.verdict == "failed" and far.low > 0.01 and "beyond the margin" in far.reason
    assert stats.equivalence([-0.3, -0.31, -0.29], 0.01).verdict == "failed"  # either side
    wide = stats.equivalence([0.02, -0.01, 0.03], 0.01)
    assert wide.verdict == "inconclusive" and "more seeds" in wide.reason
    assert stats.equivalence([0.0, math.nan], 0.01).verdict == "failed"


def test_detectable_against_the_control_arm() -> None:
    control = [1e-4, -2e-4, 0.5e-4, -1e-4]
    assert stats.detectable([0.004, 0.0041, 0.0039, 0.0042], control)
    assert not stats.detectable([1.2e-4, -1e-4, 0.3e-4, -1.5e-4], control)


def test_a_failed_difference_is_detectable_even_where_welch_with_three_seeds_is_not() -> None:
    """The CPU smoke's gross flce gradient bug: three seeds, differences +0.63/+1.56/+0.81
    nats against a control at +-1e-7. The TOST places them beyond the margin; Welch's t at 5%
    two-sided (df ~ 2) alone would call them not detectable."""
    from kassay.validate.convergence.model import Shape
    from kassay.validate.convergence.runner import Run, _judge

    assert not stats.detectable([0.63, 1.56, 0.81], [-1e-7, 1e-7, -1e-7])
    policy = ConvergencePolicy(steps=10, seeds=3, eval_every=5)
    base = [Run([2.0, 1.0, f], 10, False) for f in (0.80, 0.85, 0.83)]
    ctrl = [
        Run([2.0, 1.0, b.final + e], 10, False)
        for b, e in zip(base, (-1e-7, 1e-7, -1e-7), strict=True)
    ]
    runs = [
        Run([2.0, 1.5, b.final + d], 10, False)
        for b, d in zip(base, (0.63, 1.56, 0.81), strict=True)
    ]

    def make(status: str, message: str, conv: object) -> tuple[str, str, object]:
        return status, message, conv

    status, message, conv = _judge(
        "m", runs, base, ctrl, "alt", policy, [0, 1, 2], Language(16, 32),
        Shape(**policy.shape()), 10, make,
    )  # fmt: skip
    assert status == "failed" and "beyond the margin" in message
    assert conv.verdict == "failed" and conv.detectable  # type: ignore[attr-defined]


def test_the_language_has_a_known_floor_and_a_copied_half() -> None:
    lang = Language(vocab=16, seq=32)
    p = lang.transitions
    assert torch.allclose(p.sum(dim=1), torch.ones(16, dtype=torch.float64))
    batch = lang.batch(8, torch.Generator().manual_seed(0))
    assert torch.equal(batch[:, :16], batch[:, 16:])
    assert 0 < lang.entropy_floor() < math.log(4)
    again = lang.batch(8, torch.Generator().manual_seed(0))
    assert torch.equal(batch, again)


def _spec(**suite: object) -> dict:
    return {
        "name": "conv",
        "suites": [
            {
                "op": "lse_merge",
                "impls": ["torch", "kassay"],
                "params": {"mode": "step"},
                "convergence": {"steps": 10, "seeds": 2},
                **suite,
            }
        ],
    }


def test_a_convergence_suite_expands_to_one_group_the_model_shapes() -> None:
    (g,) = expand(parse_spec(_spec()))
    assert g.regime.startswith("convergence-") and g.convergence is not None
    # a policy training differently is another case key; `parallel` changes no result
    (other,) = expand(parse_spec(_spec(convergence={"steps": 11, "seeds": 2})))
    (same,) = expand(parse_spec(_spec(convergence={"steps": 10, "seeds": 2, "parallel": 2})))
    assert other.regime != g.regime and same.regime == g.regime
    pol = ConvergencePolicy()
    assert g.params["T"] == pol.batch * pol.seq and g.params["K"] == pol.chunks
    assert g.params["mode"] == "step" and not g.timing.enabled
    (f,) = expand(parse_spec(_spec(op="flce", params={"label_smoothing": 0.1})))
    assert (f.params["N"], f.params["H"], f.params["V"]) == (
        pol.batch * (pol.seq - 1),
        pol.dim,
        pol.vocab,
    )


@pytest.mark.parametrize(
    ("suite", "why"),
    [
        ({"params": {"T": 64}}, "sets only dtype, mode and accumulate"),
        ({"params": {"mode": "step_second_half"}}, "step_second_half"),
        ({"op": "flce", "params": {"reduction": "none"}}, "not reduction"),
        ({"convergence": {"dim": 30, "heads": 4}}, "even head size"),
        ({"convergence": {"seeds": 1}}, "seeds"),
    ],
)
def test_what_the_model_cannot_train_with_is_refused_saying_why(suite: dict, why: str) -> None:
    with pytest.raises(InvalidSpecError, match=why):
        expand(parse_spec(_spec(**suite)))


def test_convergence_groups_and_results_cross_the_wire() -> None:
    from kassay.contract import wire
    from kassay.contract.results import ConvergenceResult
    from kassay.contract.v1 import worker_pb2 as pb
    from kassay.validate.case_result import case_result

    (g,) = expand(parse_spec(_spec()))
    back = wire.group_from_proto(
        pb.GroupSpec.FromString(wire.group_to_proto(g).SerializeToString())
    )
    assert back == g
    conv = ConvergenceResult(
        verdict="inconclusive",
        steps=10,
        seeds=[0, 1],
        eval_steps=[0, 10],
        curves=[[2.8, 1.0], [2.7, None]],
        baseline_curves=[[2.8, 1.0], [2.7, 1.1]],
        control="alt_pairwise",
        control_curves=[[2.8, 1.0], [2.7, 1.1]],
        diffs=[0.0, None],
        control_diffs=[0.0, 0.0],
        mean_diff=None,
        ci_low=None,
        ci_high=None,
        margin=0.005,
        sigma_seed=0.07,
        detectable=True,
        calls=20,
        entropy_floor=0.62,
        uniform_loss=2.77,
    )
    res = case_result(g, "kassay", "failed", "inconclusive", convergence=conv)
    msg = pb.CaseResult.FromString(wire.result_to_proto(res).SerializeToString())
    assert json.loads(msg.convergence)["verdict"] == "inconclusive"
    assert wire.result_from_proto(msg) == res


def test_matched_seeds_train_identically_and_every_step_calls_the_impl() -> None:
    from kassay.impls import get_impl, load
    from kassay.ops import get_op
    from kassay.validate.convergence.runner import train

    load()
    pol = ConvergencePolicy(steps=6, seeds=2, eval_every=3, batch=4)
    for op_name, options in (("lse_merge", {"mode": "step"}), ("flce", {})):
        op = get_op(op_name)
        params = op.parse_params(op.convergence_params(pol.shape(), options))
        import importlib

        slot = importlib.import_module(op.convergence_module)
        runs = []
        for _ in range(2):
            calls = [0]
            fn = slot.wrap(get_impl(op_name, "torch"), params, calls)
            runs.append((train(pol, 0, slot.SLOT, fn, torch.device("cpu")), calls[0]))
        (a, ca), (b, cb) = runs
        assert a.curve == b.curve and len(a.curve) == 3  # steps 0, 3 and the end
        per_step = pol.layers if slot.SLOT == "merge" else 1
        assert ca == cb == pol.steps * per_step
