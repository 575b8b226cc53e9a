"""Probe: flce fwd+bwd at N=8192, H=2304, V=256000 (bf16) under memory budgets that change the
chunk rows: 448 MiB gives 9 chunks of 911 rows (not a multiple of 64: the logits and grad_x
GEMMs pad the last row tile of every chunk), 470 MiB 9 chunks of 960 (8 x 960 + 512), 500 MiB
8 chunks of 1024. Uses bench/flce.py's inputs and measurement (do_bench median, peak extra).

    PYTHONPATH=service python3 research/flce_rows_probe.py --out FILE
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_common import make_inputs, measure

from kassay.kernels import flce as kflce

MiB = 1 << 20


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    n, h, v = 8192, 2304, 256000
    x, w, t = make_inputs(n, h, v)
    flop = 6 * n * h * v
    res = {}
    for rnd in range(2):
        for mib in (448, 470, 500):
            rows = kflce.plan_rows(n, v, 2, mib * MiB)

            def fn(xx, ww, tt, b=mib * MiB):
                return kflce.fused_linear_cross_entropy(xx, ww, tt, memory_budget_bytes=b)

            ms, peak, _ = measure(fn, x, w, t)
            key = f"budget {mib} MiB, {rows} rows"
            res.setdefault(key, []).append(
                [round(ms, 3), round(flop / ms / 1e9, 1), round(peak, 4)]
            )
            print(
                f"round {rnd} {key}: {ms:.3f} ms {flop / ms / 1e9:.0f} TFLOP/s {peak:.4f} GiB",
                flush=True,
            )
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
