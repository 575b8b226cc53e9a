"""Is CCE's grad_input error at the target shape its gradient filter? (#14)

The H200 false-failure table (bench/results/verdicts-h200-h200-2026-12-03.json) left CCE's
grad_input at ~2x eager torch's rel_l2 at N=8192 H=4096 V=128256 bf16 on both seeds. CCE skips
backward blocks whose softmax values all fall below `filter_eps` (default "high": the bf16
resolution), so the gradient it drops is small but not zero. This runs the same inputs through
eager torch and CCE with filter_eps left at its default and with filter_eps=None (no filter), and
prints every output's rel_l2 against kassay's float64 reference.

    PYTHONPATH=service python3 research/cce_filter_probe.py [--seeds 2] [--out F.json]

If CCE without the filter lands at eager's error, the 2x is the filter's documented trade, a
true finding about CCE's default and not a false failure of kassay's limits.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch

from kassay.impls import flce_harness, registry
from kassay.ops import get_op
from kassay.ops.flce import FlceParams

DEV = torch.device("cuda")
OUTPUTS = ("loss", "grad_input", "grad_weight")


def rel_l2(got: torch.Tensor, ref: torch.Tensor) -> float:
    d = got.double() - ref.double()
    return float(d.norm() / ref.double().norm().clamp_min(1e-300))


def cce_fn(filter_eps: Any) -> Any:
    def fn(x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, b: Any, p: FlceParams) -> Any:
        from cut_cross_entropy import linear_cross_entropy

        kw = {} if filter_eps == "default" else {"filter_eps": filter_eps}
        return linear_cross_entropy(
            x, w, target, ignore_index=p.ignore_index, reduction=p.reduction, **kw
        )

    return fn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    registry.load()
    op = get_op("flce")
    params = op.parse_params(
        {"N": 8192, "H": 4096, "V": 128256, "dtype": "bfloat16", "ignore_fraction": 0.1}
    )
    runs = {
        "torch": registry.get_impl("flce", "torch").run,
        "cce_default": flce_harness.as_run(cce_fn("default")),
        "cce_filter_none": flce_harness.as_run(cce_fn(None)),
    }
    rows = []
    for seed in range(args.seeds):
        inputs = op.make_inputs(params, "normal", seed, DEV)
        ref = op.reference(inputs, params)
        for name, run in runs.items():
            out = run(inputs, params)
            row = {"seed": seed, "impl": name}
            row.update({k: rel_l2(out[k], ref[k]) for k in OUTPUTS if k in out})
            rows.append(row)
            print(json.dumps(row), flush=True)
            del out
        del inputs, ref
        torch.cuda.empty_cache()
    if args.out:
        import cut_cross_entropy

        meta = {
            "what": "CCE grad error with and without its backward filter (filter_eps)",
            "params": params.model_dump(),
            "torch": torch.__version__,
            "cce": getattr(cut_cross_entropy, "__version__", "?"),
            "device": torch.cuda.get_device_name(),
            "rows": rows,
        }
        with open(args.out, "w") as f:
            json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
