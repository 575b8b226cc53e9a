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

from collections.abc import Callable, Iterator
from typing import Any

Point = dict[str, Any]
Added = tuple[Point, str, str]  # (params, regime, note)

# Small shapes keep the extra cost bounded (the Triton interpreter on a CPU runs them too).
_MAX_BASES = 4


def _ragged(d: int) -> int:
    """A size next to d that is not a multiple of 16."""
    if d % 16:
        return d
    return d - 3 if d > 3 else d + 3


def _distinct(points: list[Point], keys: tuple[str, ...]) -> list[Point]:
    seen: set[tuple[Any, ...]] = set()
    out = []
    for p in points:
        k = tuple(p.get(x) for x in keys)
        if k not in seen:
            seen.add(k)
            out.append(p)
    return out[:_MAX_BASES]


def _flce(points: list[Point], regimes: list[str], all_regimes: tuple[str, ...]) -> Iterator[Added]:
    bases = _distinct(points, ("dtype", "autocast", "reduction"))
    for i, b in enumerate(bases):
        rag = {
            **b,
            "N": _ragged(min(int(b["N"]), 45)),
            "H": _ragged(min(int(b["H"]), 40)),
            "V": _ragged(min(int(b["V"]), 200)),
        }
        if len({rag["N"], rag["H"], rag["V"]}) < 3:  # dims that happen to coincide hide mix-ups
            rag.update(N=45, H=40, V=197)
        ign = max(float(b.get("ignore_fraction", 0.0)), 0.25)
        yield {**rag, "ignore_fraction": ign}, "normal", "ragged sizes, ignored targets"
        # every accumulation length, at every base (its dtype, autocast, reduction): many rows
        # (grad_weight sums over N; more than 256 non-ignored rows, an odd count), a long
        # vocabulary (grad_input and the lse sum over V) and a long hidden size (the logits'
        # dot products), apart: the Triton interpreter's cost grows with N * H * V
        yield (
            {**b, "N": 351, "H": 16, "V": 48, "ignore_fraction": ign},
            "normal",
            "long reduction (N=351 rows)",
        )
        yield {**b, "N": 6, "H": 16, "V": 2000}, "normal", "long reduction (V=2000)"
        yield {**b, "N": 12, "H": 1000, "V": 40}, "normal", "long reduction (H=1000)"
        if i:
            continue  # the rest once per suite: option interplay does not depend on the base
        yield {**rag, "bias": True, "softcap": 30.0}, "normal", "options bias+softcap"
        yield (
            {**rag, "z_loss_scale": 1e-3, "return_z_loss": True, "label_smoothing": 0.1},
            "normal",
            "options z-loss+label smoothing",
        )
        yield (
            {**rag, "reduction": "none", "ignore_fraction": ign, "label_smoothing": 0.1},
            "normal",
            "options reduction none+ignored targets",
        )
        if b.get("dtype") == "float32" and b.get("autocast", "none") == "none":
            for bias in (False, True):
                yield (
                    {**rag, "autocast": "float16", "bias": bias},
                    "normal",
                    f"options autocast float16, bias {'on' if bias else 'off'}",
                )
        yield {**b, "N": 40, "H": 40, "V": 40}, "normal", "dims coincide (N=H=V)"
        for r in all_regimes:
            if r not in regimes:
                yield rag, r, f"regime {r}"


def _lse_merge(
    points: list[Point], regimes: list[str], all_regimes: tuple[str, ...]
) -> Iterator[Added]:
    bases = _distinct(points, ("dtype", "mode", "accumulate"))
    first_of_mode: set[str] = set()
    for b in bases:
        k = int(b.get("K", 2))
        rag = {**b, "T": 37, "Hh": 3, "D": 24, "K": max(k, 3)}
        yield rag, "normal", "ragged sizes"
        # at every base: accumulating K states in the out dtype hides at float32
        yield {**b, "T": 9, "Hh": 2, "D": 24, "K": 64}, "normal", "long reduction (K=64)"
        mode = b.get("mode", "merge")
        if mode in first_of_mode:
            continue
        first_of_mode.add(mode)
        other_layout = "Th" if b.get("lse_layout", "hT") == "hT" else "hT"
        yield {**rag, "lse_layout": other_layout}, "normal", f"options lse_layout {other_layout}"
        if mode != "merge":
            other_acc = "out" if b.get("accumulate", "float32") == "float32" else "float32"
            yield {**rag, "accumulate": other_acc}, "normal", f"options accumulate {other_acc}"
        yield {**b, "T": 8, "Hh": 8, "D": 8}, "normal", "dims coincide (T=Hh=D)"
        for r in all_regimes:
            if r not in regimes:
                yield rag, r, f"regime {r}"


GENERATORS: dict[str, Callable[[list[Point], list[str], tuple[str, ...]], Iterator[Added]]] = {
    "flce": _flce,
    "lse_merge": _lse_merge,
}


def coverage_points(
    op: str, points: list[Point], regimes: list[str], all_regimes: tuple[str, ...]
) -> list[Added]:
    """The points default coverage adds to a suite of `op` whose grid is `points` (validated
    params dumps) run in `regimes`; may repeat a user point (the caller drops those)."""
    gen = GENERATORS.get(op)
    return list(gen(points, regimes, all_regimes)) if gen and points else []
