"""What `kassay selftest` runs per op (kassay.validate.selftest): targeted probes (a mutant and
a small grid that exposes its bug), plain probes (a mutant under a suite a new user would write)
and the fairness corpus's plain suite. Each op lists its own in its folder's `probes` module
(`PROBES`, `PLAIN_PROBES`, `FAIRNESS`: a params grid, and optionally `CORRECT`: the op's
correct impls, run beside every mutant and in the fairness suite; default below); torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: an op's correct impls where its probes module names none (its CORRECT)
CORRECT = ("torch", "kassay")


@dataclass(frozen=True)
class Probe:
    op: str
    mutant: str
    params: dict[str, Any]
    regimes: tuple[str, ...] = ("normal",)
    # correct impls that must pass here (None: the op's, its probes module's CORRECT); torch is
    # left out where eager PyTorch itself has the bug
    correct: tuple[str, ...] | None = None
    note: str = ""
    plain: bool = False  # params is a whole plain suite's grid; regimes and coverage default
    baseline: str = "torch"
