"""Probe: the grad_x GEMM of one chunk (dlogits [rows, V] @ W [V, H] -> [rows, H], bf16, cuBLAS)
asked in different ways, against the logits GEMM of the same chunk (same FLOPs), on the H200.

At 1792 x 4096 x 128256 cuBLAS's 256x128 tiles make 7 x 32 = 224 tiles on 132 SMs (1.7 waves);
the variants try to fill the second wave: the rows split in two GEMMs on two streams, and the
transposed product (W^T dl^T)^T into a [H, rows] buffer.

    PYTHONPATH=service python3 research/flce_gradx_probe.py --out FILE
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_common import grad_x_operands, probe_parser, run_meta, save, time_rounds

CHUNKS = [(1792, 4096, 128256), (960, 2304, 256000)]


def main() -> int:
    args = probe_parser(__doc__).parse_args()
    out: dict = run_meta()
    side = torch.cuda.Stream()
    for rows, h, v in CHUNKS:
        g, dl, w = grad_x_operands(rows, h, v, seed=2, dl_scale=1e-3)
        x = torch.randn(rows, h, device="cuda", generator=g).to(torch.bfloat16)
        gx = torch.empty(rows, h, device="cuda", dtype=torch.bfloat16)
        gxt = torch.empty(h, rows, device="cuda", dtype=torch.bfloat16)
        z = torch.empty(rows, v, device="cuda", dtype=torch.bfloat16)

        def split2(r0, dl=dl, w=w, gx=gx):
            main = torch.cuda.current_stream()
            side.wait_stream(main)
            torch.mm(dl[:r0], w, out=gx[:r0])
            with torch.cuda.stream(side):
                torch.mm(dl[r0:], w, out=gx[r0:])
            main.wait_stream(side)

        fns = {
            "logits_mm": lambda: torch.mm(x, w.t(), out=z),  # noqa: B023
            "gradx_mm": lambda: torch.mm(dl, w, out=gx),  # noqa: B023
            "gradx_transposed": lambda: torch.mm(w.t(), dl.t(), out=gxt),  # noqa: B023
            "gradx_2streams_half": lambda: split2(rows // 2),  # noqa: B023
            "gradx_2streams_1024": lambda: split2(min(1024, rows // 2)),  # noqa: B023
            "gradx_2streams_quarter": lambda: split2(rows // 4),  # noqa: B023
        }
        ref = torch.mm(dl, w)
        key = f"{rows}x{h}x{v}"
        res: dict = {"max_abs_diff": {}}
        for name, fn in fns.items():
            if name.startswith("gradx"):
                gx.zero_()
                gxt.zero_()
                fn()
                torch.cuda.synchronize()
                got = gxt.t() if "transposed" in name else gx
                res["max_abs_diff"][name] = float((got.float() - ref.float()).abs().max())
        res["ms"] = time_rounds(fns, args.rounds, key)
        print(key, res["max_abs_diff"], flush=True)
        out[key] = res
        dl = w = x = gx = gxt = z = ref = None
        torch.cuda.empty_cache()
    save(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
