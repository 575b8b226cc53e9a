"""What does meeting min_reps by time cost a slow call's median? (#15: TimingPolicy's
min_reps_time_s, default 1.0 s, lets three repetitions of a 0.5 s call stand for min_reps=5.)

For the CI grid's flce cases (examples/ci-grid.yaml: N in {4096, 8192}, H=4096, V=128256, bf16
and float32, torch and kassay) times each call with a long policy (20 repetitions, the
reference median), then `--trials` times with the default policy and with the time rule off
(min_reps 5 regardless), and reports each one's median against the reference: the largest
deviation is what the rule costs, the repetitions and seconds what it saves.

    PYTHONPATH=service python3 research/long_call_reps.py [--trials 3] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import datetime, timezone

import torch

from kassay.impls import get_impl, load
from kassay.ops import get_op
from kassay.validate.spec import TimingPolicy
from kassay.validate.timing import time_call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    load()
    dev = torch.device("cuda")
    op = get_op("flce")
    reference = TimingPolicy(min_reps=20, max_reps=20, min_reps_time_s=0, target_rel_sem=1e-9)
    policies = {"default": TimingPolicy(), "count_only": TimingPolicy(min_reps_time_s=0)}
    rows = []
    for dtype in ("float32", "bfloat16"):
        for n in (4096, 8192):
            params = op.parse_params({"N": n, "H": 4096, "V": 128256, "dtype": dtype})
            inputs = op.make_inputs(params, "normal", 0, dev)
            for name in ("torch", "kassay"):
                impl = get_impl("flce", name)

                def call(impl=impl, params=params, inputs=inputs) -> object:  # type: ignore[no-untyped-def]
                    return impl.run(inputs, params)

                ref = time_call(call, dev, reference)
                row = {
                    "case": f"flce N={n} {dtype} {name}",
                    "reference_median_ms": ref.median_ms,
                    "reference_samples_ms": ref.samples_ms,
                }
                for label, policy in policies.items():
                    trials = []
                    for _ in range(args.trials):
                        t0 = time.perf_counter()
                        t = time_call(call, dev, policy)
                        trials.append(
                            {
                                "n": t.n,
                                "median_ms": t.median_ms,
                                "rel_sem": t.rel_sem,
                                "dev_vs_reference": t.median_ms / ref.median_ms - 1,
                                "seconds": time.perf_counter() - t0,
                            }
                        )
                    row[label] = trials
                rows.append(row)
                worst = {k: max(abs(t["dev_vs_reference"]) for t in row[k]) for k in policies}
                reps = {k: [t["n"] for t in row[k]] for k in policies}
                print(
                    f"{row['case']:28s} ref {ref.median_ms:8.2f} ms (rel_sem {ref.rel_sem:.2%}) "
                    + "  ".join(f"{k}: reps {reps[k]} worst {worst[k]:.3%}" for k in policies),
                    flush=True,
                )
                del impl
            del inputs
            torch.cuda.empty_cache()
    summary = {
        k: {
            "worst_abs_dev": max(abs(t["dev_vs_reference"]) for r in rows for t in r[k]),
            "seconds": sum(t["seconds"] for r in rows for t in r[k]) / args.trials,
        }
        for k in policies
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "date": datetime.now(timezone.utc).date().isoformat(),
                    "command": "python3 research/long_call_reps.py "
                    + f"--trials {args.trials} --out {args.out}",
                    "gpu": torch.cuda.get_device_name(dev),
                    "versions": {
                        "python": platform.python_version(),
                        "torch": torch.__version__,
                    },
                    "policies": {k: p.model_dump() for k, p in policies.items()},
                    "reference_policy": reference.model_dump(),
                    "summary": summary,
                    "rows": rows,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
