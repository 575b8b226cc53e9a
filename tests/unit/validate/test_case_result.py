"""The CaseResult factory: a case is named alike whoever reports it (the engine, the worker's
supervisor for a crash or a timeout, the store for a case that never ran)."""

from __future__ import annotations

import itertools
from typing import Any, get_args

from pydantic import ValidationError

from kassay.contract.spec import GroupSpec, TimingPolicy
from kassay.ops import all_ops, get_op
from kassay.validate.case_result import case_dtype, case_result
from kassay.validate.engine import run_group


def _choices(model: Any, name: str) -> list[Any]:
    field = model.model_fields.get(name)
    return list(get_args(field.annotation)) if field is not None else [None]


def _every_dtype_point() -> list[tuple[str, dict[str, Any]]]:
    """Each op's smallest params at every value of its `dtype` and `autocast` fields."""
    points = []
    for op in all_ops():
        model = op.params_model
        required = {n: 2 for n, f in model.model_fields.items() if f.is_required()}
        for dtype, autocast in itertools.product(
            _choices(model, "dtype"), _choices(model, "autocast")
        ):
            raw = dict(required)
            if dtype is not None:
                raw["dtype"] = dtype
            if autocast is not None:
                raw["autocast"] = autocast
            try:
                points.append((op.name, op.parse_params(raw).model_dump()))
            except ValidationError:  # e.g. autocast with non-float32 params
                continue
    return points


POINTS = _every_dtype_point()


def test_the_points_cover_the_amp_cases() -> None:
    names = {case_dtype(o, p) for o, p in POINTS}
    assert {"amp-bfloat16", "amp-float16", "float32", "bfloat16", "float16"} <= names


def test_case_dtype_falls_back_to_the_params_dtype() -> None:
    assert case_dtype("no_such_op", {"dtype": "float16"}) == "float16"
    assert case_dtype("flce", {"dtype": "bfloat16", "N": "bad"}) == "bfloat16"


def _amp_flce_group(impls: list[str]) -> GroupSpec:
    raw = {"N": 4, "H": 8, "V": 16, "dtype": "float32", "autocast": "bfloat16"}
    return GroupSpec(
        group_id="g-amp",
        op="flce",
        impls=impls,
        params=get_op("flce").parse_params(raw).model_dump(),
        timing=TimingPolicy(enabled=False),
    )


def test_engine_and_factory_name_an_amp_case_alike() -> None:
    """The engine's result of an AMP case and a crash the supervisor reports for it (built by
    the factory from the group alone, as the supervisor does) carry the same dtype."""
    group = _amp_flce_group(["torch"])
    (ran,) = run_group(group, device="cpu", ceilings=False)
    crashed = case_result(group, "torch", "crashed", "the executor died")
    assert ran.status == "passed", ran.message
    assert ran.dtype == crashed.dtype == "amp-bfloat16"
    assert crashed.model_dump(include={"case_id", "group_id", "op", "params", "regime"}) == (
        ran.model_dump(include={"case_id", "group_id", "op", "params", "regime"})
    )


def test_the_store_keeps_the_dtype_recorded_at_submission() -> None:
    group = _amp_flce_group(["torch"])
    res = case_result(group, "torch", "skipped", "job cancelled", dtype="recorded")
    assert res.dtype == "recorded" and res.case_id == "g-amp:torch" and res.message
