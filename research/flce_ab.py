"""A/B of two versions of kassay's flce on the same GPU in one process: fwd+bwd at both target
shapes, the versions interleaved over rounds (the H200's clocks follow its power limit and
temperature, so only measurements of the same run compare).

    PYTHONPATH=service python3 research/flce_ab.py --old DIR --out FILE

DIR holds the old version as `old_flce.py` + `_old_flce_kernels.py` (old_flce importing the
kernels as `import _old_flce_kernels as K`), e.g. from `git show REV:service/kassay/kernels/...`.
Instead of --old, `--toggle FIELD` takes as "old" the current code with the boolean field FIELD
of `FlceConfig` switched off (e.g. grads_fused; runs before the config object toggled the
constant GRADS_FUSED of `_flce_kernels`); `--shapes "N,H,V N,H,V"` replaces the two target
shapes.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_common import SHAPES, make_inputs, measure, probe_parser, run_meta, save

from kassay.kernels import flce as kflce
from kassay.kernels.flce import FlceConfig


def _with_flag_off(fn, flag: str):
    """fn with config= the shipped FlceConfig but its boolean field `flag` False."""
    cfg = dataclasses.replace(FlceConfig(), **{flag: False})
    return functools.partial(fn, config=cfg)


def main() -> int:
    ap = probe_parser(__doc__)
    old_src = ap.add_mutually_exclusive_group(required=True)
    old_src.add_argument("--old", type=Path)
    old_src.add_argument("--toggle", help="a boolean field of FlceConfig, off for 'old'")
    ap.add_argument("--old-rev", default="")
    ap.add_argument("--shapes", help='"N,H,V N,H,V" (default: the two target shapes)')
    args = ap.parse_args()
    new = kflce.fused_linear_cross_entropy
    if args.toggle:
        assert isinstance(getattr(FlceConfig(), args.toggle), bool), args.toggle
        old = _with_flag_off(new, args.toggle)
    else:
        sys.path.insert(0, str(args.old))
        import old_flce  # type: ignore[import-not-found]

        old = old_flce.fused_linear_cross_entropy
    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(d) for d in sh.split(",")) for sh in args.shapes.split()]

    out: dict = {
        **run_meta(),
        "old_rev": args.old_rev,
        "toggle": args.toggle,
        "ms_tflops_gib": {},
    }
    versions = {"old": old, "new": new}
    for n, h, v in shapes:
        x, w, t = make_inputs(n, h, v)
        flop = 6 * n * h * v
        res = out["ms_tflops_gib"].setdefault(f"{n},{h},{v}", {})
        for r in range(args.rounds):
            for name, fn in versions.items():
                ms, peak, _ = measure(fn, x, w, t)
                res.setdefault(name, []).append(
                    [round(ms, 3), round(flop / ms / 1e9, 1), round(peak, 4)]
                )
                print(n, h, v, "round", r, name, f"{ms:.3f} ms {peak:.4f} GiB", flush=True)
    save(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
