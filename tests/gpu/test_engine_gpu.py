"""The engine on CUDA: the smoke grid, the selftest, and the float64 reference of the large flce
shape in bounded memory (its time is printed for the record)."""

import time
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_grid_on_cuda() -> None:
    from kassay.contract.spec import load_spec
    from kassay.validate.local import run_job

    report = run_job(load_spec(ROOT / "examples" / "smoke.yaml"), device="cuda")
    bad = [
        (c.op, c.impl, c.label(), c.status, c.message)
        for c in report.cases
        if c.status not in ("passed", "unsupported")
    ]
    assert not bad, bad
    timed = [c for c in report.cases if c.timing is not None]
    assert timed and all(c.timing.clock == "cuda_events" for c in timed if c.timing)
    assert all(c.memory is not None and c.memory.measured for c in timed)
    assert report.environments[0].device_name.startswith("NVIDIA")


def test_selftest_on_cuda() -> None:
    from kassay.validate.selftest import run_selftest

    result = run_selftest(device="cuda")
    print(result.line())
    assert result.ok, [
        (p.probe.mutant, [c.message for c in p.false_failures])
        for p in result.probes
        if not p.detected or p.false_failures
    ]


def test_flce_reference_at_llm_shape_is_bounded() -> None:
    from kassay.ops import get_op

    op = get_op("flce")
    p = op.parse_params({"N": 8192, "H": 4096, "V": 128256, "dtype": "bfloat16"})
    dev = torch.device("cuda")
    inputs = op.make_inputs(p, "normal", 0, dev)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    ref = op.reference(inputs, p)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() - before
    print(f"flce float64 reference N=8192 H=4096 V=128256: {dt:.3f} s, peak {peak / 2**30:.2f} GiB")
    assert torch.isfinite(ref["loss"]) and ref["grad_weight"].dtype == torch.float64
    assert peak < op.reference_bytes(p) * 1.5
