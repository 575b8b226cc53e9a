"""What the flce probes share: bench/flce.py's inputs, reference and measurement, bench/common's
run metadata, and the probes' own command line, interleaved timing and GEMM/CE operands.

The probes are research (kernels or settings that did not ship, or the measurements behind the
shipped ones); they may reach into kassay's private launchers. Run them from the repository
root: `PYTHONPATH=service python3 research/<probe>.py --out FILE`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from common import run_meta, save_json
from flce import SHAPES, make_inputs, measure, reference

__all__ = [
    "SHAPES",
    "ce_chunk",
    "grad_x_operands",
    "grads_operands",
    "make_inputs",
    "measure",
    "probe_parser",
    "reference",
    "run_meta",
    "save",
    "time_rounds",
]


def probe_parser(doc: str | None) -> argparse.ArgumentParser:
    """The flce probes' command line: --rounds (interleaved timing rounds) and --out (JSON)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    return ap


def time_rounds(fns: dict, rounds: int, key: str, rep: int = 100) -> dict:
    """{name: [ms per round]}: every fn timed once per round (do_bench, mean), interleaved, so
    the card's clock drift spreads over all of them; prints each round."""
    ms: dict = {}
    for r in range(rounds):
        for name, fn in fns.items():
            ms.setdefault(name, []).append(round(do_bench(fn, rep=rep), 4))
        print(key, "round", r, {k: m[-1] for k, m in ms.items()}, flush=True)
    return ms


def grad_x_operands(rows, h, v, seed, dl_scale):
    """(generator, dl [rows, v], w [v, h]) bf16, dl ~ N(0, dl_scale^2), w ~ N(0, 1/h); the
    generator continues for the caller's further inputs."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    dl = (torch.randn(rows, v, device="cuda", generator=g) * dl_scale).to(torch.bfloat16)
    w = (torch.randn(v, h, device="cuda", generator=g) * h**-0.5).to(torch.bfloat16)
    return g, dl, w


def grads_operands(rows, h, v, seed):
    """A chunk's gradient-GEMM operands: (dl [rows, v], w [v, h], x chunk [rows, h]) bf16 as in
    `grad_x_operands` (dl scale 1e-2), a float16 accumulator c0 [v, h] ~ N(0, 16) and the
    float32 scale 0.5 [1]."""
    g, dl, w = grad_x_operands(rows, h, v, seed=seed, dl_scale=1e-2)
    xc = torch.randn(rows, h, device="cuda", generator=g).to(torch.bfloat16)
    c0 = (torch.randn(v, h, device="cuda", generator=g) * 4).half()
    return dl, w, xc, c0, torch.full((1,), 0.5, device="cuda")


def ce_chunk(rows, v, n, seed=5):
    """One CE-kernel chunk: bf16 logits z0 [rows, v] (~N(0, 4)), targets (every 10th ignored),
    the mean-reduction row factor 1/n, three float32 row outputs and a work buffer like z0."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    z0 = (torch.randn(rows, v, device="cuda", generator=g) * 2).to(torch.bfloat16)
    t = torch.randint(0, v, (rows,), device="cuda", generator=g)
    t[::10] = -100
    scale = torch.full((1,), 1.0 / n, device="cuda")
    f32 = [torch.empty(rows, device="cuda") for _ in range(3)]
    return z0, t, scale, f32, torch.empty_like(z0)


def save(out: dict, path: Path | None) -> None:
    """The probe's result as JSON at `path` (nothing without --out)."""
    save_json(out, path)
