"""bench/convergence_horizon.py re-judges a convergence report at every eval step: at the last
step it must give the verdict the runner gave (the H200's 400-step job, 2026-12-05)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _module():
    spec = importlib.util.spec_from_file_location("horizon", ROOT / "bench/convergence_horizon.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["horizon"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_the_last_step_gives_the_runners_verdicts() -> None:
    data = json.loads(
        (ROOT / "bench/results/convergence-h200-2026-12-05-400steps.json").read_text()
    )
    report = data["report"]
    from kassay.contract.spec import ConvergencePolicy

    defaults = ConvergencePolicy()
    points = _module().horizon(report, defaults.margin_sigma, defaults.margin_floor)
    last = {p.case: p for p in points if p.step == 400}
    judged = {f"{c['op']}.{c['impl']}": c["convergence"] for c in report["cases"]}
    assert set(last) == set(judged)
    for name, conv in judged.items():
        p = last[name]
        if conv["mean_diff"] is None:  # diverged: its curve stops before the last step
            assert conv["verdict"] == "failed"
            continue
        assert p.eq.verdict == conv["verdict"], name
        assert abs(p.eq.margin - conv["margin"]) < 1e-12 and p.detectable == conv["detectable"]
    # the stale lse diverged early: the horizon shows it judged failed at the step before
    stale = [p for p in points if p.case == "lse_merge.m_stale_lse"]
    assert any(p.eq.verdict == "failed" for p in stale)
