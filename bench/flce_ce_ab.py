"""A/B of the cross-entropy kernel alone (pass 1 + in-place dlogits) on one chunk of each target
shape (1792 x 128256 and 960 x 256000, bf16): an old version of `_flce_kernels` against the
current one, interleaved over rounds, plus the current kernel at other grid sizes (rows in
flight: with fewer, a row's second pass is likelier to find it in L2). Checks the current
kernel's outputs against the old one's (max abs difference of dlogits, lse, loss).

    PYTHONPATH=service python3 bench/flce_ce_ab.py --old DIR --out FILE

DIR holds the old kernels as `_old_flce_kernels.py` (e.g. `git show REV:service/kassay/kernels/
_flce_kernels.py`); the launch arguments are those of the current `_launch_ce`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from flce import ce_chunk, probe_parser, run_meta, save, time_rounds

from kassay.kernels import _flce_kernels as K
from kassay.kernels import flce as kflce

CHUNKS = [(1792, 128256, 8192), (960, 256000, 8192)]  # rows, V, rows of the whole batch
GRIDS = [66, 99]  # programs (the shipped grid is one per SM)


def main() -> int:
    ap = probe_parser(__doc__)
    ap.add_argument("--old", type=Path, required=True)
    args = ap.parse_args()
    sys.path.insert(0, str(args.old))
    import _old_flce_kernels as old_k  # type: ignore[import-not-found]

    new_kernel = K._ce_rows_kernel
    out: dict = run_meta()
    for rows, v, n in CHUNKS:
        z0, t, scale, f32, z = ce_chunk(rows, v, n)

        def run(kernel, programs=None, z=z, t=t, scale=scale, f32=f32, v=v):
            K._ce_rows_kernel = kernel
            kflce._launch_ce(
                z, t, *f32, scale, False, V=v, ignore_index=-100, label_smoothing=0.0,
                z_loss_scale=0.0, softcap=None, compute_grad=True, programs=programs,
            )  # fmt: skip
            K._ce_rows_kernel = new_kernel

        variants = {"old": (old_k._ce_rows_kernel, None), "new": (new_kernel, None)}
        variants.update({f"new_grid{p}": (new_kernel, p) for p in GRIDS})
        key = f"{rows}x{v}"
        res: dict = {"ms": {}, "max_abs_diff_new_vs_old": {}}
        outs = {}
        for name in ("old", "new"):
            z.copy_(z0)
            run(variants[name][0])
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
