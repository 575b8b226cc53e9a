"""Default coverage: the edge points kassay adds to a suite so that a plain job (the shapes,
dtypes and options a kernel supports, nothing else) still exercises the code paths where kernels
go wrong.

Per op, from the suite's own grid points (their dtypes, modes and options), at small shapes:
- ragged sizes: every dim not a multiple of 16 (so not of 64 or 128 either): tail tiles, masks;
- ignored targets (flce) where the user left ignore_fraction at 0;
- option combinations that interact (flce: bias with softcap, z-loss with label smoothing,
  reduction none with ignored rows, AMP with and without a bias; lse_merge: the other lse
  layout, the other accumulation);
- dims that coincide (a layout mix-up hidden while they differ) and dims that all differ;
- a long reduction at every base dtype (a 16-bit accumulation hides at float32): flce many rows
  for grad_weight, a long vocabulary for grad_input and the lse, a long hidden size for the
  logits; lse_merge K = 64 states;
- the op's other regimes (at the ragged point).
Added points run with timing off (they are for correctness) and carry a note saying why they
were added; `coverage: none` in a suite turns them off.
"""

from __future__ import annotations

from typing import Any

Point = dict[str, Any]
Added = tuple[Point, str, str]  # (params, regime, note)

# Small shapes keep the extra cost bounded (the Triton interpreter on a CPU runs them too).
MAX_BASES = 4


def ragged(d: int) -> int:
    """A size next to d that is not a multiple of 16."""
    if d % 16:
        return d
    return d - 3 if d > 3 else d + 3


def distinct(points: list[Point], keys: tuple[str, ...]) -> list[Point]:
    seen: set[tuple[Any, ...]] = set()
    out = []
    for p in points:
        k = tuple(p.get(x) for x in keys)
        if k not in seen:
            seen.add(k)
            out.append(p)
    return out[:MAX_BASES]
