"""Suites whose cases take a known, steady time: jobs that last long enough to kill a process
(an API replica, a worker) in the middle of them."""

from __future__ import annotations

from typing import Any


def slow_lse_suite(seeds: int) -> dict[str, Any]:
    """Timed lse_merge cases of ~0.3 s each (torch and ring_style, 2 x `seeds` cases)."""
    return {
        "op": "lse_merge",
        "impls": ["torch", "ring_style"],
        "params": {"T": 8, "Hh": 2, "D": 4, "dtype": "float32", "mode": "step"},
        "seeds": list(range(seeds)),
        "regimes": ["normal"],
        "coverage": "none",
        "timing": {
            "enabled": True,
            "warmup": 0,
            "min_reps": 5,
            "max_reps": 100_000,
            "target_rel_sem": 1e-6,
            "budget_s": 0.3,
        },
    }
