"""flce's default coverage points (kassay.ops.coverage says what default coverage is)."""

from __future__ import annotations

from collections.abc import Iterator

from kassay.ops.coverage import Added, Point, distinct, ragged


def points(
    points: list[Point], regimes: list[str], all_regimes: tuple[str, ...]
) -> Iterator[Added]:
    bases = distinct(points, ("dtype", "autocast", "reduction"))
    for i, b in enumerate(bases):
        rag = {
            **b,
            "N": ragged(min(int(b["N"]), 45)),
            "H": ragged(min(int(b["H"]), 40)),
            "V": ragged(min(int(b["V"]), 200)),
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
