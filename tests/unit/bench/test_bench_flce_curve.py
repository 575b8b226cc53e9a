"""bench/flce.py --budgets: the sweep's budgets and the per-peer verdicts (no GPU needed)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

flce_bench = importlib.import_module("flce")  # bench/flce.py: must import here


def test_budget_points_span_the_smallest_chunk_to_3_gib_with_distinct_plans():
    pts = flce_bench.budget_points(8192, 128256, 16)
    budgets = [b for b, _ in pts]
    rows = [r for _, r in pts]
    assert budgets == sorted(budgets) and len(set(rows)) == len(rows)
    assert rows[0] == 16 and budgets[0] == 16 * 128256 * 2
    assert max(budgets) <= 3 * 2**30 and rows[-1] == 8192  # one chunk fits in 2 GiB
    # the second shape's single chunk needs 3.9 GiB: the sweep stops below 3 GiB
    assert all(b <= 3 * 2**30 for b, _ in flce_bench.budget_points(8192, 256000, 16))
    assert flce_bench.budget_points(8192, 128256, 1)[0][1] == 1  # down to one row on request


def _row(impl, ms, gib, rows=None):
    r = {"N": 8, "H": 4, "V": 16, "impl": impl, "ms": ms, "peak_extra_gib": gib}
    return {**r, "rows_per_chunk": rows} if rows else r


def test_verdicts_take_kassays_fastest_point_at_no_more_memory():
    curve = [_row("kassay", 50.0, 1.0, 256), _row("kassay", 40.0, 1.5, 1792)]
    peers = [
        _row("liger", 54.0, 1.1),  # kassay at <= 1.1 GiB: 50 ms, faster
        _row("torch_compile", 38.0, 3.0),  # kassay's best at <= 3 GiB: 40 ms, not faster
        _row("cce", 50.0, 0.5),  # kassay has nothing at <= 0.5 GiB
        {"N": 8, "H": 4, "V": 16, "impl": "eager", "error": "OOM"},
    ]
    lines = flce_bench.curve_verdicts(curve, peers)
    assert "kassay faster: 50.0 ms at 1.00 GiB" in lines[0]
    assert "NOT faster: 40.0 ms" in lines[1]
    assert "no point at this memory" in lines[2]
    assert "error" in lines[3]


def test_plot_script_writes_table_and_png(tmp_path):
    import matplotlib  # noqa: F401  (dev extra: the plot must be drawn in CI)

    curve = [_row("kassay", 50.0, 1.0, 256), _row("kassay", 40.0, 1.5, 1792)]
    curve[0]["schedule"] = curve[1]["schedule"] = "rows"
    vocab = [
        {**_row("kassay", 60.0, 0.9), "schedule": "vocab", "cols_per_panel": c}
        for c in (64, 512, 8192)
    ]
    data = {"curve": curve + vocab, "peers": [_row("liger", 54.0, 1.1)], "verdicts": ["v"]}
    src = tmp_path / "curve.json"
    src.write_text(json.dumps(data))
    res = subprocess.run(
        [sys.executable, str(BENCH / "flce_plot.py"), str(src)],
        capture_output=True,
        text=True,
        check=True,
    )
    # both schedules in the table, each point's chunk named in its own unit
    assert "| 8, 4, 16 | kassay | rows | 256 rows | 50.00 | 1.000 |" in res.stdout
    assert "| 8, 4, 16 | kassay | vocab | 512 cols | 60.00 | 0.900 |" in res.stdout
    assert "| 8, 4, 16 | liger |  |  | 54.00 | 1.100 |" in res.stdout
    png = tmp_path / "curve.png"
    assert png.read_bytes()[:4] == b"\x89PNG"
