"""rmsnorm's self-test probes (kassay.ops.probes): each mutant with a small grid that exposes
it, beside the op's correct impls (`torch`, `triton`)."""

from __future__ import annotations

from typing import Any

from kassay.ops.probes import Probe
from kassay_rmsnorm import OP

#: the correct impls run beside every mutant (kassay.ops.probes: default torch, kassay)
CORRECT = ("torch", "triton")

PROBES: tuple[Probe, ...] = (
    Probe(
        OP.name,
        "m_grad_weight_unnormalised",
        {"N": 64, "H": 96, "dtype": "float32"},
    ),
    Probe(
        OP.name,
        "m_mean_square_in_dtype",
        {"N": 16, "H": 64, "dtype": "float16"},
        ("large",),
    ),
)
PLAIN_PROBES: tuple[Probe, ...] = ()
FAIRNESS: dict[str, Any] = {}
