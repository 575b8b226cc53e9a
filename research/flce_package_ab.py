"""Same-run A/B of kassay flce's default call: two versions of the whole package, alternating
processes (research/flce_ab.py instead swaps single kernel files inside one process).

Runs `bench/flce.py --ab` (the default call at both target shapes, repeated do_bench medians)
in fresh processes, base and new in turn (B A B A ...: clock and temperature drift fall on
both), and prints each shape's median of medians, the spread and new/base.

On the H200 in one call, with main's package copied beside the working tree first (here):
    rm -rf .ab_base && mkdir .ab_base && git archive main service/kassay | tar -x -C .ab_base
    grep -qx '/.ab_base/' .git/info/exclude || echo /.ab_base/ >> .git/info/exclude
then run there (carry .ab_base):
    python3 research/flce_package_ab.py --base .ab_base/service --new service --out research/results/...json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_common import run_meta, save

BENCH = Path(__file__).resolve().parents[1] / "bench"


def one_run(service_dir: str, repeats: int) -> list[dict]:
    """bench/flce.py --ab with `service_dir` first on PYTHONPATH: its rows."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ab.json"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(service_dir).resolve()), str(BENCH), env.get("PYTHONPATH", "")]
        )
        cmd = [sys.executable, str(BENCH / "flce.py"), "--ab", "--ab-repeats", str(repeats)]
        subprocess.run([*cmd, "--out", str(out)], env=env, check=True)
        return json.loads(out.read_text())["ab"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the base version's service/ folder")
    ap.add_argument("--new", default=str(BENCH.parent / "service"))
    ap.add_argument("--rounds", type=int, default=3, help="processes per version")
    ap.add_argument("--repeats", type=int, default=5, help="do_bench medians per process")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"base": [], "new": []}
    for i in range(args.rounds):
        for label in ("new", "base") if i % 2 == 0 else ("base", "new"):
            rows = one_run(args.base if label == "base" else args.new, args.repeats)
            runs[label] += rows
    summary = []
    for shape in sorted({(r["N"], r["H"], r["V"]) for r in runs["new"]}):
        ms = {
            k: sorted(s for r in v if (r["N"], r["H"], r["V"]) == shape for s in r["ms_samples"])
            for k, v in runs.items()
        }
        med = {k: v[len(v) // 2] for k, v in ms.items()}
        line = {
            "shape": shape,
            "base_ms": med["base"],
            "new_ms": med["new"],
            "new_over_base": med["new"] / med["base"],
            "base_range": [ms["base"][0], ms["base"][-1]],
            "new_range": [ms["new"][0], ms["new"][-1]],
        }
        summary.append(line)
        print(
            f"N,H,V={shape}: base {med['base']:.3f} ms [{ms['base'][0]:.3f}, {ms['base'][-1]:.3f}]"
            f"  new {med['new']:.3f} ms [{ms['new'][0]:.3f}, {ms['new'][-1]:.3f}]"
            f"  new/base {line['new_over_base']:.4f}",
            flush=True,
        )
    save({**run_meta(), "runs": runs, "summary": summary}, Path(args.out) if args.out else None)


if __name__ == "__main__":
    main()
