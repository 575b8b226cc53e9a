"""lse_merge's default coverage points (kassay.ops.coverage says what default coverage is)."""

from __future__ import annotations

from collections.abc import Iterator

from kassay.ops.coverage import Added, Point, distinct


def points(
    points: list[Point], regimes: list[str], all_regimes: tuple[str, ...]
) -> Iterator[Added]:
    bases = distinct(points, ("dtype", "mode", "accumulate"))
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
