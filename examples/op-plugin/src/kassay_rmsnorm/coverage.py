"""rmsnorm's default coverage (kassay.ops.coverage): a ragged row length, dims that coincide
and the `large` regime, at each base dtype of the suite."""

from __future__ import annotations

from collections.abc import Iterator

from kassay.ops.coverage import Added, Point, distinct, ragged


def points(
    points: list[Point], regimes: list[str], all_regimes: tuple[str, ...]
) -> Iterator[Added]:
    for b in distinct(points, ("dtype",)):
        rag = {**b, "N": ragged(min(int(b["N"]), 37)), "H": ragged(min(int(b["H"]), 200))}
        yield rag, "normal", "ragged sizes"
        yield {**b, "N": 300, "H": 24}, "normal", "many rows (grad_weight sums over N)"
        for r in all_regimes:
            if r not in regimes:
                yield rag, r, f"regime {r}"
