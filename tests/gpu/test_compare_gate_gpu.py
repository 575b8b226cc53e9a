"""The regression gate's noise criterion on a GPU: the same code timed again is "same" at the
default 3% threshold every time, and the same impl made 20% slower is "slower" every time (five
runs each; `pytest -s` prints the ratios for bench/README.md). (On the CPU this runs only on a
quiet host: a shared 2-core runner drifts by tens of percent, tests/integration/test_compare_gate.py.)"""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

RUNS = 5


def _timing(monkeypatch, extra: float):
    from kassay.contract.spec import JobSpec
    from kassay.impls.testing import EXTRA_PASS_ENV
    from kassay.ops.expand import expand
    from kassay.validate.engine import run_group
    from kassay.validate.local import local_impl_check

    monkeypatch.setenv(EXTRA_PASS_ENV, str(extra))
    spec = JobSpec.model_validate(
        {
            "name": "gate",
            "suites": [
                {
                    "op": "flce",
                    "impls": ["slowable"],
                    "baseline": "slowable",
                    "params": {"N": 4096, "H": 4096, "V": 32768, "dtype": "bfloat16"},
                    "regimes": ["normal"],
                    "coverage": "none",
                    "timing": {"min_reps": 30, "max_reps": 200, "budget_s": 1.0},
                }
            ],
        }
    )
    (group,) = expand(spec, check_impl=local_impl_check(include_testing=True))
    (case,) = run_group(group, device="cuda", include_testing=True, ceilings=False)
    assert case.timing is not None and case.timing.samples_ms
    return case.timing


def test_same_code_is_same_and_twenty_percent_slower_is_slower(monkeypatch) -> None:
    from kassay.validate.compare_reports import DEFAULT_THRESHOLD, speed_change
    from kassay.validate.median_ratio import DEFAULT_CONFIDENCE

    main = _timing(monkeypatch, 0.0)
    same = [
        speed_change(_timing(monkeypatch, 0.0), main, DEFAULT_THRESHOLD, DEFAULT_CONFIDENCE)
        for _ in range(RUNS)
    ]
    slower = [
        speed_change(_timing(monkeypatch, 0.2), main, DEFAULT_THRESHOLD, DEFAULT_CONFIDENCE)
        for _ in range(RUNS)
    ]
    ratios = [f"{c.ratio:.3f} [{c.low:.3f}, {c.high:.3f}]" for c in same + slower if c]
    print(f"\nsame code x{RUNS}: {ratios[:RUNS]}\n20% extra pass x{RUNS}: {ratios[RUNS:]}")
    assert all(c is not None and c.verdict == "same" for c in same), ratios
    assert all(c is not None and c.verdict == "slower" for c in slower), ratios
    assert all(1.12 < c.ratio < 1.3 for c in slower if c), ratios
