"""flce inputs with return_token_accuracy plant argmax hits: the output carries signal at large
V (random targets hit 1/V of the rows), no planted row hangs on the logits' rounding, and the
inputs of every other case are untouched."""

import pytest
import torch
import torch.nn.functional as F

import kassay.ops.flce.runtime as flce_runtime
from kassay.contract.spec import GroupSpec, TimingPolicy
from kassay.impls import load
from kassay.ops import get_op
from kassay.validate.engine import run_group

CPU = torch.device("cpu")
OP = get_op("flce")


def _inputs(seed: int = 0, regime: str = "normal", **opts):
    base = {"N": 64, "H": 16, "V": 2048, "dtype": "float32", "return_token_accuracy": True}
    p = OP.parse_params({**base, **opts})
    return p, OP.make_inputs(p, regime, seed, CPU)


@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"dtype": "bfloat16", "softcap": 4.0, "bias": True, "ignore_fraction": 0.25},
        {"dtype": "float16", "reduction": "none", "ce_weight": True},
        {"autocast": "bfloat16", "label_smoothing": 0.1},
    ],
)
def test_only_targets_change_and_accuracy_is_far_from_0_and_1(opts: dict) -> None:
    p, on = _inputs(**opts)
    _, off = _inputs(**{**opts, "return_token_accuracy": False})
    assert sorted(on) == sorted(off)
    for k in off:
        if k != "target":
            assert torch.equal(on[k], off[k]), k
    ignored = off["target"] == p.ignore_index
    assert torch.equal(on["target"] == p.ignore_index, ignored)
    acc = OP.reference(on, p)["token_accuracy"]
    rate = float(acc.sum()) / int((~ignored).sum()) if p.reduction == "none" else float(acc)
    assert 0.15 < rate <= 0.5 + 1 / 64
    # without planting the same rows hit about 1/V of the time: no signal
    assert float(OP.reference(off, p)["token_accuracy"].sum()) <= 1.0


def test_planting_is_seeded() -> None:
    _, a = _inputs(3)
    _, b = _inputs(3)
    _, c = _inputs(4)
    assert torch.equal(a["target"], b["target"]) and not torch.equal(a["target"], c["target"])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("softcap", [None, 4.0])
def test_16bit_eager_logits_hit_exactly_the_reference_rows(
    dtype: str, softcap: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # eager PyTorch in the case dtype: logits rounded to it, softcap in it, argmax with ties to
    # the first column. Without the tie margin some planted row flips; with it none does.
    def flips() -> int:
        n = 0
        for seed in range(4):
            p, inp = _inputs(seed, N=256, H=64, V=8000, dtype=dtype, softcap=softcap, bias=True)
            p = p.model_copy(update={"reduction": "none"})
            ref = OP.reference(inp, p)["token_accuracy"]
            z = F.linear(inp["x"], inp["weight"], inp["bias"])
            if softcap is not None:
                z = softcap * torch.tanh(z / softcap)
            n += int(((z.argmax(-1) == inp["target"]).double() != ref).sum())
        return n

    assert flips() == 0
    monkeypatch.setattr(flce_runtime, "TIE_MARGIN", 0.0)
    assert flips() > 0


def _engine(params: dict, impls: list[str], seed: int = 0) -> dict:
    load(mutants=True)
    g = GroupSpec(
        group_id="g",
        op="flce",
        params=params,
        impls=impls,
        seed=seed,
        timing=TimingPolicy(enabled=False),
    )
    cases = run_group(g, device=CPU, include_mutants=True, ceilings=False)
    return {c.impl: c for c in cases}


_LARGE_V = {
    "N": 32,
    "H": 16,
    "V": 1024,
    "dtype": "float32",
    "return_token_accuracy": True,
    "ignore_fraction": 0.25,
    "bias": True,
}


def test_accuracy_mutant_caught_at_large_v_and_correct_impls_pass() -> None:
    res = _engine(_LARGE_V, ["torch", "kassay", "m_accuracy_counts_ignored"])
    assert res["torch"].status == res["kassay"].status == "passed", res["kassay"].message
    assert res["m_accuracy_counts_ignored"].status == "failed"
    assert "token_accuracy" in res["m_accuracy_counts_ignored"].message


def test_without_planted_hits_the_accuracy_mutant_passes_at_large_v(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # what the inputs gave before: random targets, no hit in 24 rows at V=1024, 0 == 0 (another
    # seed: the engine's reference cache holds seed 0's planted inputs)
    monkeypatch.setattr(flce_runtime, "PLANT_FRACTION", 0.0)
    res = _engine(_LARGE_V, ["torch", "m_accuracy_counts_ignored"], seed=1)
    assert res["m_accuracy_counts_ignored"].status == "passed"
