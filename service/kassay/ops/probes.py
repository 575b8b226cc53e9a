"""What `kassay selftest` runs per op (kassay.validate.selftest): targeted probes (a mutant and
a small grid that exposes its bug), plain probes (a mutant under a suite a new user would write)
and the fairness corpus's plain suite. Each op lists its own in its folder's `probes` module
(`PROBES`, `PLAIN_PROBES`, `FAIRNESS`: a params grid); torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: the correct impls every probe runs beside its mutant unless it names others
CORRECT = ("torch", "kassay")


@dataclass(frozen=True)
class Probe:
    op: str
    mutant: str
    params: dict[str, Any]
    regimes: tuple[str, ...] = ("normal",)
    # correct impls that must pass here; torch is left out where eager PyTorch itself has the bug
    correct: tuple[str, ...] = CORRECT
    note: str = ""
    plain: bool = False  # params is a whole plain suite's grid; regimes and coverage default
    baseline: str = "torch"
