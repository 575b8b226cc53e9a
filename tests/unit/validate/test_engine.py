"""The engine on CPU: statuses, baseline handling, timing labels, memory note."""

from typing import Any

import pytest
import torch

from kassay.contract.spec import GroupSpec, TimingPolicy
from kassay.impls import Impl, register
from kassay.ops.lse_merge.baseline import merge_torch
from kassay.ops.lse_merge.harness import as_run
from kassay.validate.engine import run_group


def _raise(outs: Any, lses: Any, **_: Any) -> Any:
    raise RuntimeError("kernel exploded")


def _fp16_out(outs: torch.Tensor, lses: torch.Tensor, **kw: Any) -> Any:
    out, lse = merge_torch(outs, lses, **kw)
    return out.half(), lse


register(Impl("lse_merge", "t_raise", as_run(_raise, None)), replace=True)
register(Impl("lse_merge", "t_fp16", as_run(_fp16_out, None)), replace=True)
register(
    Impl(
        "lse_merge",
        "t_never",
        as_run(merge_torch, None),
        supports=lambda p, d: "never supported here",
    ),
    replace=True,
)


def _group(impls: list[str], **kw: Any) -> GroupSpec:
    params = {"T": 16, "Hh": 2, "D": 8, "K": 2, "dtype": "float32", "mode": "merge"}
    kw.setdefault("timing", TimingPolicy(min_reps=2, max_reps=3, budget_s=0.2))
    return GroupSpec(group_id="g", op="lse_merge", params=params, impls=impls, **kw)


def test_statuses_and_messages() -> None:
    res = run_group(
        _group(["torch", "te_style", "t_raise", "t_never", "t_fp16"]), device="cpu", ceilings=False
    )
    by = {r.impl: r for r in res}
    assert [r.impl for r in res] == ["torch", "te_style", "t_raise", "t_never", "t_fp16"]
    assert by["torch"].status == "passed"
    assert by["te_style"].status == "unsupported" and "in-place" in by["te_style"].message
    assert by["t_raise"].status == "error"
    assert by["t_raise"].message.startswith("RuntimeError: kernel exploded")
    assert by["t_never"].status == "unsupported"
    assert by["t_fp16"].status == "failed" and "requires torch.float32" in by["t_fp16"].message
    t = by["torch"].timing
    assert t is not None and t.clock == "cpu_perf_counter" and 2 <= t.n <= 3
    assert t.tflops is not None and t.gbps is not None and t.roofline_fraction is None
    mem = by["torch"].memory
    assert mem is not None and not mem.measured and "CUDA" in mem.note
    assert by["torch"].environment is not None and by["torch"].environment.device == "cpu"
    assert by["torch"].case_id == "g:torch"


def test_baseline_runs_even_when_not_listed() -> None:
    res = run_group(_group(["t_fp16"]), device="cpu", ceilings=False)
    assert len(res) == 1
    out = next(o for o in res[0].outputs if o.name == "lse")
    assert out.policy == "baseline" and out.baseline_rel_l2 is not None


def test_callbacks_fire_in_order() -> None:
    seen: list[str] = []
    run_group(
        _group(["t_raise", "torch"], timing=TimingPolicy(enabled=False)),
        device="cpu",
        on_start=lambda cid: seen.append("start " + cid),
        on_result=lambda r: seen.append("done " + r.case_id),
        ceilings=False,
    )
    # the baseline runs first so its errors can set the others' tolerance
    assert seen == ["start g:torch", "done g:torch", "start g:t_raise", "done g:t_raise"]


def test_ceilings_and_roofline_on_cpu() -> None:
    res = run_group(_group(["torch"]), device="cpu")
    t = res[0].timing
    assert t is not None and t.roofline_fraction is not None and t.roofline_fraction > 0


def test_cuda_device_without_cuda_is_a_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        run_group(_group(["torch"]), device="cuda")


def _wrong_shape(outs: torch.Tensor, lses: torch.Tensor, **kw: Any) -> Any:
    out, lse = merge_torch(outs, lses, **kw)
    return out[:-1], lse


register(Impl("lse_merge", "t_shape", as_run(_wrong_shape, None)), replace=True)


def test_wrong_shape_and_missing_outputs_fail_with_a_reason() -> None:
    from kassay.ops.registry import Impl as _Impl

    def run_missing(inputs: dict, params: Any) -> dict:
        return {"out": as_run(merge_torch, None)(inputs, params)["out"]}

    register(_Impl("lse_merge", "t_missing", run_missing), replace=True)
    res = run_group(
        _group(["t_shape", "t_missing"], timing=TimingPolicy(enabled=False)),
        device="cpu",
        ceilings=False,
    )
    by = {r.impl: r for r in res}
    assert (
        by["t_shape"].status == "failed" and "differs from the reference" in by["t_shape"].message
    )
    assert by["t_missing"].status == "failed" and "lse: output missing" in by["t_missing"].message
