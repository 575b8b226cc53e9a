"""pydantic <-> protobuf conversion of the worker contract: lossless round trips, and the
messages mirror the pydantic models field for field."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

pytest.importorskip("grpc")

from kassay.contract import wire as convert
from kassay.contract.results import (
    CaseResult,
    Environment,
    MemoryStats,
    OutputMetrics,
    TimingStats,
    WorstEntry,
)
from kassay.contract.spec import GroupSpec, TimingPolicy, TolerancePolicy, parse_spec
from kassay.contract.v1 import worker_pb2 as pb
from kassay.errors import InvalidSpecError
from kassay.ops import params_model
from kassay.ops.expand import expand
from kassay.ops.lse_merge import LseMergeParams


def _same(a: Any, b: Any) -> bool:
    """Equality that treats NaN as equal to NaN (metrics of missing outputs are NaN)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _groups() -> list[GroupSpec]:
    spec = parse_spec(
        {
            "name": "rt",
            "suites": [
                {
                    "op": "flce",
                    "impls": ["torch", "torch_compile"],
                    "params": {
                        "N": 4,
                        "H": 8,
                        "V": 16,
                        "softcap": [None, 30.0],
                        "bias": [False, True],
                        "reduction": "none",
                        "ignore_fraction": 0.25,
                        "z_loss_scale": 1e-4,
                        "return_z_loss": True,
                        "dtype": "float32",
                        "autocast": ["none", "bfloat16"],
                    },
                    "regimes": ["normal", "all_ignored"],
                    "seeds": [0, 2**40],
                    "tolerance": {"policy": "absolute", "atol": 1e-3, "rtol": None},
                    "timing": {
                        "enabled": False,
                        "warmup": 0,
                        "budget_s": 0.5,
                        "cpu_calibration": False,
                    },
                },
                {
                    "op": "lse_merge",
                    "impls": ["torch"],
                    "baseline": "torch",
                    "params": {
                        "T": 8,
                        "Hh": 2,
                        "D": 4,
                        "K": [2, 5],
                        "dtype": "float16",
                        "lse_layout": ["hT", "Th"],
                        "mode": "step_second_half",
                        "accumulate": "out",
                    },
                    "regimes": ["huge", "fa2_inf"],
                },
            ],
        }
    )
    return expand(spec)


def test_group_round_trip_is_lossless() -> None:
    groups = _groups()
    assert len(groups) > 8
    assert any(g.coverage for g in groups)  # the coverage note travels too
    for g in groups:
        msg = convert.group_to_proto(g)
        wire = pb.GroupSpec.FromString(msg.SerializeToString())
        assert json.loads(wire.params_json) == g.params
        back = convert.group_from_proto(wire, params_model=params_model)  # the worker's edge
        assert back == g
        assert back.model_dump() == g.model_dump()
        assert convert.group_from_proto(wire) == g  # as sent


def test_params_travel_as_data_with_none_as_null() -> None:
    g = next(g for g in _groups() if g.op == "flce" and g.params["softcap"] is None)
    raw = json.loads(convert.group_to_proto(g).params_json)
    assert raw["softcap"] is None and raw["ignore_index"] == -100


def _lse_group(**params: Any) -> pb.GroupSpec:
    return pb.GroupSpec(
        group_id="g",
        op="lse_merge",
        impls=["torch"],
        params_json=json.dumps({"T": 8, "Hh": 2, "D": 4, **params}),
    )


def test_absent_fields_take_the_pydantic_defaults() -> None:
    g = convert.group_from_proto(_lse_group(), params_model=params_model)
    assert g.params == LseMergeParams(T=8, Hh=2, D=4).model_dump()
    assert g.regime == "normal" and g.baseline == "torch"
    assert g.tolerance == TolerancePolicy() and g.timing == TimingPolicy()


def _set_params(m: pb.GroupSpec, **changes: Any) -> None:
    raw = json.loads(m.params_json)
    raw.update(changes)
    m.params_json = json.dumps({k: v for k, v in raw.items() if v is not ...})


@pytest.mark.parametrize(
    ("mutate", "loc"),
    [
        (lambda m: _set_params(m, T=...), ["groups", 0, "params", "T"]),
        (lambda m: _set_params(m, K=1), ["groups", 0, "params", "K"]),
        (lambda m: _set_params(m, dtype="int8"), ["groups", 0, "params", "dtype"]),
        (lambda m: _set_params(m, T="8"), ["groups", 0, "params", "T"]),  # strict: no "8"
        (lambda m: setattr(m, "op", "flce"), ["groups", 0, "params", "N"]),
        (lambda m: setattr(m, "op", ""), ["groups", 0, "op"]),
        (lambda m: m.ClearField("params_json"), ["groups", 0, "params_json"]),
        (lambda m: setattr(m, "params_json", "[1, 2]"), ["groups", 0, "params_json"]),
        (lambda m: setattr(m, "params_json", "{T: 8"), ["groups", 0, "params_json"]),
        (lambda m: m.ClearField("impls"), ["groups", 0, "impls"]),
        (lambda m: setattr(m.timing, "min_reps", 0), ["groups", 0, "timing", "min_reps"]),
        (lambda m: setattr(m.tolerance, "policy", "vibes"), ["groups", 0, "tolerance", "policy"]),
    ],
)
def test_invalid_groups_name_the_field(mutate: Any, loc: list[Any]) -> None:
    msg = _lse_group()
    mutate(msg)
    with pytest.raises(InvalidSpecError) as err:
        convert.groups_from_proto([msg], params_model=params_model)
    locs = [e["loc"] for e in err.value.details["errors"]]
    assert loc in locs, locs


def test_params_with_unknown_keys_or_ops_are_refused_at_the_workers_edge() -> None:
    """The encoder trusts its sender's validated dump; the edge that runs the params (the
    worker's decode, given the ops' models) refuses what the op's model refuses."""
    g = _groups()[0]
    bogus = convert.group_to_proto(g.model_copy(update={"params": {**g.params, "bogus": 1}}))
    with pytest.raises(InvalidSpecError, match=r"params\.bogus: Extra inputs"):
        convert.group_from_proto(bogus, params_model=params_model)
    nope = convert.group_to_proto(g.model_copy(update={"op": "nope"}))
    with pytest.raises(InvalidSpecError, match="unknown op"):
        convert.group_from_proto(nope, params_model=params_model)
    # without the models (a trusted sender's results) the params come back as sent
    assert convert.group_from_proto(bogus).params["bogus"] == 1


def _result(**kw: Any) -> CaseResult:
    g = _groups()[0]
    env = Environment(
        device="cuda:0",
        device_name="NVIDIA H200",
        driver="580.1",
        cuda="13.0",
        torch="2.11.0",
        triton="3.6.0",
        kassay="0.1.0",
        python="3.11.7",
        hostname="gpu1",
        clocks={"clocks.sm": "1980 MHz"},
        ceilings={"matmul_tflops": 795.0, "copy_gbps": 4240.0},
        gpu_uuid="GPU-1234",
        numa={"node": 1, "cpus": [0, 1]},
    )
    base: dict[str, Any] = dict(
        case_id=f"{g.group_id}:torch_compile",
        group_id=g.group_id,
        suite_index=0,
        op="flce",
        impl="torch_compile",
        params=g.params,
        regime=g.regime,
        seed=g.seed,
        dtype="float32",
        status="failed",
        message="grad_weight: rel_l2 above threshold",
        outputs=[
            OutputMetrics(
                name="loss",
                dtype="float32",
                expected_dtype="float32",
                shape=[],
                max_abs=1e-7,
                max_rel=2e-7,
                rel_l2=1e-7,
                max_ulp=1.0,
                nan=0,
                inf=0,
                ref_nan=0,
                ref_inf=0,
                policy="absolute",
                threshold_max_abs=1e-3,
                passed=True,
            ),
            OutputMetrics(
                name="grad_weight",
                dtype="-",
                expected_dtype="float32",
                shape=[16, 8],
                max_abs=float("nan"),
                max_rel=float("inf"),
                rel_l2=float("-inf"),
                max_ulp=float("nan"),
                nan=3,
                inf=2**40,
                ref_nan=0,
                ref_inf=1,
                n_bad=12,
                worst=[
                    WorstEntry(
                        index=[3, 4], value=float("nan"), reference=0.5, abs_err=float("nan")
                    ),
                    WorstEntry(index=[0, 0], value=1.0, reference=-1.0, abs_err=2.0),
                ],
                baseline_max_abs=0.0,
                baseline_rel_l2=1e-300,
                passed=False,
                reason="NaN where the reference is finite",
            ),
        ],
        timing=TimingStats(
            clock="cuda_events",
            n=40,
            median_ms=1.5,
            mean_ms=1.6,
            std_ms=0.1,
            p10_ms=1.4,
            p90_ms=1.8,
            rel_sem=0.004,
            l2_flushed=True,
            tflops=700.0,
            gbps=None,
            roofline_fraction=0.9,
            speedup_vs_baseline=1.3,
        ),
        memory=MemoryStats(
            measured=True, peak_extra_bytes=2**33, model_bytes=2**30, ratio_to_model=8.0, note="n"
        ),
        duration_s=3.25,
        worker="w1",
        device="cuda:0",
        environment=env,
    )
    base.update(kw)
    return CaseResult(**base)


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"timing": None, "memory": None, "environment": None, "worker": None, "device": None},
        {"status": "crashed", "message": "executor died: signal SIGSEGV", "outputs": []},
        {
            "status": "unsupported",
            "op": "lse_merge",
            "params": LseMergeParams(T=3, Hh=1, D=2).model_dump(),
            "dtype": "bfloat16",
        },
        {"coverage": "ragged sizes", "flags": ["baseline_suspect", "biased"]},
        {
            "timing": TimingStats(
                clock="cpu_process_time",
                mode="cpu",
                n=3,
                median_ms=2.5,
                mean_ms=2.6,
                std_ms=0.2,
                p10_ms=2.4,
                p90_ms=2.9,
                rel_sem=0.05,
                samples_ms=[2.5, 2.4, 2.9],
                calibration="kassay.cal/1 (2 fp32 matmuls; torch 2, 1 threads)",
                calibration_ms=[0.8, 0.75, 0.9],
            )
        },
    ],
)
def test_result_round_trip_is_lossless(variant: dict[str, Any]) -> None:
    r = _result(**variant)
    wire = pb.CaseResult.FromString(convert.result_to_proto(r).SerializeToString())
    back = convert.result_from_proto(wire)
    assert _same(back.model_dump(), r.model_dump())
    assert back.environment == r.environment


def test_environment_extras_travel_as_json() -> None:
    env = _result().environment
    assert env is not None
    msg = convert.environment_to_proto(env)
    assert msg.extra["numa"] == '{"cpus": [0, 1], "node": 1}'
    assert convert.environment_from_proto(msg).model_dump() == env.model_dump()


def _pydantic_fields(model: Any) -> set[str]:
    return set(model.model_fields)


@pytest.mark.parametrize(
    ("model", "message", "skip"),
    [
        (TolerancePolicy, pb.TolerancePolicy, set()),
        (TimingPolicy, pb.TimingPolicy, set()),
        (GroupSpec, pb.GroupSpec, {"params_json"}),
        (WorstEntry, pb.WorstEntry, set()),
        (OutputMetrics, pb.OutputMetrics, set()),
        (TimingStats, pb.TimingStats, set()),
        (MemoryStats, pb.MemoryStats, set()),
        (Environment, pb.Environment, {"extra"}),
        (CaseResult, pb.CaseResult, {"params_json"}),
    ],
)
def test_messages_mirror_the_models(model: Any, message: Any, skip: set[str]) -> None:
    proto_fields = set(message.DESCRIPTOR.fields_by_name) - skip
    # params travel as data (params_json), validated by the op's own model
    model_fields = _pydantic_fields(model) - ({"params"} if "params_json" in skip else set())
    assert proto_fields == model_fields
    # nullable pydantic fields are `optional` (or messages) on the wire
    for name, info in model.model_fields.items():
        f = message.DESCRIPTOR.fields_by_name.get(name)
        if f is not None and not f.is_repeated and info.default is None:
            assert f.has_presence, f"{message.DESCRIPTOR.name}.{name} should be optional"


def test_artifacts_travel_with_their_groups() -> None:
    digests = ["a" * 64, "b" * 64]
    for g in _groups()[:3]:
        g = g.model_copy(update={"artifacts": digests})
        wire = pb.GroupSpec.FromString(convert.group_to_proto(g).SerializeToString())
        assert list(wire.artifacts) == digests
        assert convert.group_from_proto(wire) == g
    bad = convert.group_to_proto(_groups()[0])
    bad.artifacts.append("not-a-digest")
    with pytest.raises(InvalidSpecError, match="artifacts"):
        convert.group_from_proto(bad)


def test_results_cross_the_executor_pipe_whole() -> None:
    """A sandboxed executor's results come back as JSON (kassay.worker.frames): every
    field of a result, the verdict flags, coverage note, timing samples and environment extras
    included, must survive it as it survives the wire."""
    from kassay.worker.frames import Channel

    r = _result(coverage="ragged sizes", flags=["nondeterministic"])
    assert r.timing is not None and r.environment is not None
    r.timing = r.timing.model_copy(
        update={
            "clock": "cpu_process_time",
            "mode": "cpu",
            "wall_median_ms": 1.9,
            "samples_ms": [1.5, 1.25, float("inf")],
            "throttle_reasons": ["sw_power_cap"],
            "power_capped": True,
        }
    )
    r.outputs[0] = r.outputs[0].model_copy(
        update={"bias": -1e-9, "bias_limit": 1e-6, "run_to_run_max_abs": 0.0}
    )
    r.environment = Environment(
        **r.environment.model_dump(), reference_cache="hit", artifacts=["a" * 64]
    )
    frame = Channel.encode({"type": "result", "result": r.model_dump()})
    back = CaseResult.model_validate(Channel.decode(frame[4:])["result"])
    assert _same(back.model_dump(), r.model_dump())
    assert back.timing is not None and back.timing.samples_ms[:2] == [1.5, 1.25]
    assert back.environment is not None
    assert back.environment.model_extra == r.environment.model_extra
