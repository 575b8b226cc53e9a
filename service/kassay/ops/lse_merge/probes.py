"""lse_merge's self-test probes (kassay.ops.probes): the mutants of kassay.ops.lse_merge.mutants,
each with a grid that exposes it, or under a plain suite; and the fairness corpus's plain
suite."""

from __future__ import annotations

from typing import Any

from kassay.ops.probes import Probe

_L = {"T": 64, "Hh": 4, "D": 16, "K": 3, "dtype": "float32"}

PROBES: tuple[Probe, ...] = (
    Probe("lse_merge", "m_naive_logaddexp", {**_L, "mode": "merge"}, ("huge",)),
    Probe("lse_merge", "m_empty_nan", {**_L, "mode": "step"}, ("empty_rows", "fa2_inf")),
    Probe("lse_merge", "m_copy_update", {**_L, "mode": "step"}),
    Probe(
        "lse_merge",
        "m_out_dtype_accum",
        {
            "T": 128,
            "Hh": 4,
            "D": 64,
            "K": 64,
            "dtype": "bfloat16",
            "mode": "step",
            "accumulate": "float32",
        },
    ),
    Probe("lse_merge", "m_zeros", {**_L, "mode": "merge"}),
    Probe("lse_merge", "m_stale_lse", {**_L, "mode": "step"}),
    Probe(
        "lse_merge",
        "m_garbage_empty",
        {**_L, "mode": "step"},
        ("empty_rows",),
        ("kassay",),
        "the baseline is a mutant whose errors would have widened the limits",
        baseline="m_stale_empty_baseline",
    ),
    Probe(
        "lse_merge",
        "m_stale_empty_baseline",
        {**_L, "mode": "step"},
        ("fa2_inf",),
        ("kassay",),
        "a wrong baseline is itself caught (baseline_suspect)",
        baseline="m_stale_empty_baseline",
    ),
)

# What a new user writes: shapes, dtypes, options; nothing aimed at a bug.
_PLAIN = {
    "T": 64,
    "Hh": 4,
    "D": 32,
    "K": 4,
    "dtype": ["float32", "float16"],
    "mode": ["merge", "step"],
}
PLAIN_PROBES: tuple[Probe, ...] = tuple(
    Probe("lse_merge", m, _PLAIN, ("plain",), plain=True)
    for m in (
        "m_layout_from_shape",
        "m_states_capped",
        "m_truncating_round",
        "m_unordered_merge",
        "m_stale_acc",
        "m_merge_out_accum",
    )
)

# Every dtype and every mode.
FAIRNESS: dict[str, Any] = {
    "T": 64,
    "Hh": 4,
    "D": 32,
    "K": 4,
    "dtype": ["float32", "float16", "bfloat16"],
    "mode": ["merge", "step", "step_second_half"],
}
