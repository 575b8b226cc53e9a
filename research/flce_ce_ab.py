"""A/B of the cross-entropy kernel alone (pass 1 + in-place dlogits) on one chunk of each target
shape (1792 x 128256 and 960 x 256000, bf16): an old version of `_flce_kernels` against the
current one, interleaved over rounds, plus the current kernel at other grid sizes (rows in
flight: with fewer, a row's second pass is likelier to find it in L2) and without its L2
eviction hints (`FlceConfig.ce_l2_hints`). Checks the current kernel's outputs
against the old one's (max abs difference of dlogits, lse, loss).

    PYTHONPATH=service python3 research/flce_ce_ab.py [--old DIR] --out FILE

DIR holds the old kernels as `_old_flce_kernels.py` (e.g. `git show REV:service/kassay/kernels/
_flce_kernels.py`); the launch arguments are those of the current `_launch_ce`. Without --old
the reference is the current kernel without hints.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_common import ce_chunk, probe_parser, run_meta, save, time_rounds

from kassay.kernels import _flce_kernels as K
from kassay.kernels import _flce_launch as kl
from kassay.kernels.flce import FlceConfig

CHUNKS = [(1792, 128256, 8192), (960, 256000, 8192)]  # rows, V, rows of the whole batch
GRIDS = [66, 99]  # programs (the shipped grid is one per SM)
TOGGLES = {"no_hints": {"cfg": FlceConfig(ce_l2_hints=False)}}  # current kernel, L2 hints off


def main() -> int:
    ap = probe_parser(__doc__)
    ap.add_argument("--old", type=Path)
    ap.add_argument("--grids", action="store_true", help="also time the grids of GRIDS")
    args = ap.parse_args()
    old_kernel = None
    if args.old:
        sys.path.insert(0, str(args.old))
        import _old_flce_kernels as old_k  # type: ignore[import-not-found]

        old_kernel = old_k._ce_rows_kernel
    new_kernel = K._ce_rows_kernel
    out: dict = run_meta()
    for rows, v, n in CHUNKS:
        z0, t, scale, f32, z = ce_chunk(rows, v, n)

        def run(kernel, programs=None, kw=None, z=z, t=t, scale=scale, f32=f32, v=v):
            K._ce_rows_kernel = kernel
            try:
                kl._launch_ce(
                    z, t, *f32, scale, False, V=v, ignore_index=-100, label_smoothing=0.0,
                    z_loss_scale=0.0, softcap=None, compute_grad=True, programs=programs,
                    **(kw or {}),
                )  # fmt: skip
            finally:
                K._ce_rows_kernel = new_kernel

        variants: dict = {"new": (new_kernel, None, None)}
        if old_kernel is not None:
            variants["old"] = (old_kernel, None, {})
        else:
            variants["old"] = (new_kernel, None, TOGGLES["no_hints"])
        variants.update({f"new_{k}": (new_kernel, None, kw) for k, kw in TOGGLES.items()})
        if args.grids:
            variants.update({f"new_grid{p}": (new_kernel, p, None) for p in GRIDS})
        key = f"{rows}x{v}"
        res: dict = {"ms": {}, "max_abs_diff_new_vs_old": {}}
        outs = {}
        for name in ("old", "new"):
            z.copy_(z0)
            run(*variants[name])
            outs[name] = (z.float(), [a.clone() for a in f32])
        d = {"dlogits": float((outs["new"][0] - outs["old"][0]).abs().max())}
        for i, nm in enumerate(("loss", "zloss", "lse")):
            d[nm] = float((outs["new"][1][i] - outs["old"][1][i]).abs().max())
        res["max_abs_diff_new_vs_old"] = d
        res["max_abs_dlogits"] = float(outs["old"][0].abs().max())
        print(key, "diff new vs old", d, flush=True)
        outs = {}
        fns = {name: lambda kp=kp: run(*kp) for name, kp in variants.items()}
        res["ms"] = time_rounds(fns, args.rounds, key)
        out[key] = res
        z0 = z = None
        torch.cuda.empty_cache()
    save(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
