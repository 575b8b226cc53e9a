"""Plot the time-memory curve of `bench/flce.py --budgets` (CPU side, needs matplotlib).

    python3 bench/flce_plot.py bench/results/flce-budgets-h200-<date>.json [--out curve.png]

One panel per target shape: kassay's points over the memory budgets (a line per schedule, each
point labelled with its rows per chunk or columns per panel) and each peer's single (peak
memory, time) point; lower left is better. Also prints the table and, for each peer, kassay's fastest point at no more memory.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def table(data: dict) -> str:
    lines = [
        "| N, H, V | impl | schedule | chunk | ms | peak extra GiB |",
        "|---|---|---|---|---|---|",
    ]
    for r in data["curve"] + data["peers"]:
        shape = f"{r['N']}, {r['H']}, {r['V']}"
        if "error" in r:
            lines.append(f"| {shape} | {r['impl']} | | | error | |")
            continue
        sched = r.get("schedule", "")
        lines.append(
            f"| {shape} | {r['impl']} | {sched} | {_chunk(r)} | {r['ms']:.2f} "
            f"| {r['peak_extra_gib']:.3f} |"
        )
    return "\n".join(lines)


def _chunk(r: dict) -> str:
    """A curve point's chunk: rows per row chunk, or columns per vocabulary panel."""
    if r.get("rows_per_chunk"):
        return f"{r['rows_per_chunk']} rows"
    if r.get("cols_per_panel"):
        return f"{r['cols_per_panel']} cols"
    return ""


def plot(data: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = sorted({(r["N"], r["H"], r["V"]) for r in data["curve"]})
    fig, axes = plt.subplots(1, len(shapes), figsize=(7 * len(shapes), 5), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        for sched in ("rows", "vocab"):
            pts = [
                r
                for r in data["curve"]
                if (r["N"], r["H"], r["V"]) == shape and "ms" in r
                and r.get("schedule", "rows") == sched
            ]  # fmt: skip
            if not pts:
                continue
            pts.sort(key=lambda r: r["peak_extra_gib"])
            xs = [r["peak_extra_gib"] for r in pts]
            ax.plot(xs, [r["ms"] for r in pts], "o-", label=f"kassay, {sched} schedule")
            # the vocabulary schedule's points sit at one time: label its two ends only
            for r in pts if sched == "rows" else [pts[0], pts[-1]]:
                ax.annotate(_chunk(r), (r["peak_extra_gib"], r["ms"]), fontsize=6)
        for r in data["peers"]:
            if (r["N"], r["H"], r["V"]) == shape and "ms" in r:
                ax.plot(r["peak_extra_gib"], r["ms"], "s", label=r["impl"])
        ax.set_xscale("log")
        ax.set_yscale("log")  # chunks under ~64 rows run 10-20x slower: keep the knee readable
        ax.set_xlabel("peak extra memory, GiB (log)")
        ax.set_ylabel("forward + backward, ms (log)")
        ax.set_title(f"flce bf16 N={shape[0]} H={shape[1]} V={shape[2]}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("--out", default=None, help="PNG path (default: the JSON's, .png)")
    args = ap.parse_args()
    data = json.loads(Path(args.json).read_text())
    print(table(data))
    for line in data.get("verdicts", []):
        print(line)
    plot(data, Path(args.out) if args.out else Path(args.json).with_suffix(".png"))


if __name__ == "__main__":
    main()
