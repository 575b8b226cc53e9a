"""Markdown tables (for bench/README.md) from a bench/flce.py result file.

python3 bench/flce_table.py bench/results/flce-h200-<date>.json
"""

from __future__ import annotations

import json

NAMES = {
    "kassay": "**kassay** (default budget)",
    "kassay_budget_1GiB": "kassay, budget 1 GiB",
    "kassay_cublas_acc(drifts)": "kassay, bf16 addmm_ accumulation (drifts; comparison only)",
    "kassay_one_more_chunk_128_aligned": "kassay, one more chunk, 128-row aligned (comparison)",
    "torch": "torch eager",
    "torch_compile": "torch.compile",
    "liger": "Liger-Kernel 0.8.5",
    "cce": "Cut Cross-Entropy 25.1.1",
}


def main(path: str) -> None:
    with open(path) as f:
        d = json.load(f)
    print(
        "| N, H, V | impl | ms | TFLOP/s | frac | peak extra GiB | loss | grad_input | grad_weight |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    shape = None
    rows = sorted(
        d["results"],
        key=lambda r: (r["V"], list(NAMES).index(r["impl"]) if r["impl"] in NAMES else 99),
    )
    for r in rows:
        s = f"{r['N']}, {r['H']}, {r['V']}"
        cell = s if s != shape else ""
        shape = s
        name = NAMES.get(r["impl"], r["impl"])
        if "error" in r:
            print(f"| {cell} | {name} | error: {r['error'][:60]} | | | | | | |")
            continue
        e = r["rel_l2"]
        gib = (
            f"**{r['peak_extra_gib']:.2f}**"
            if r["impl"] == "kassay"
            else f"{r['peak_extra_gib']:.2f}"
        )
        print(
            f"| {cell} | {name} | {r['ms']:.1f} | {r['tflops']:.0f} | {r['frac_ceiling']:.2f} | {gib} "
            f"| {e['loss']:.2e} | {e['grad_input']:.2e} | {e['grad_weight']:.2e} |"
        )
    print("\n| N | rows/chunk | ms | TFLOP/s | frac | peak extra GiB |\n|---|---|---|---|---|---|")
    for r in d["sweep"]:
        print(
            f"| {r['N']} | {r['rows_per_chunk']} | {r['ms']:.2f} | {r['tflops']:.0f} "
            f"| {r['frac_ceiling']:.2f} | {r['peak_extra_gib']:.2f} |"
        )


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", help="a bench/flce.py result file (JSON)")
    main(ap.parse_args().result)
