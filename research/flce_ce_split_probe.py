"""Probe (not shipped): a cross-entropy kernel that reads the logits once, against the shipped
two-pass `_ce_rows_kernel`, on one chunk of each target shape (1792 x 128256 and 960 x 256000,
bf16, every 10th row ignored), interleaved over rounds.

Design: the G programs of a group split a row into G segments of SEG columns; each keeps its
segment in registers, publishes its (max, sum of exp) and (sum of logits) partials as 64-bit
words in a zeroed scratch buffer, polls the group's words until all are written, and writes its
dlogits from registers. The next row's segment is loaded before the exchange. Every config is
checked against the shipped kernel (max abs difference of dlogits, loss, lse; registers and
spills of the compiled kernel).

Outcome on the H200 (results/flce-ce-split-probe-h200-2026-12-03.json): correct, but slower
than the shipped kernel at every config (best 0.557 ms against 0.301 at 1792 x 128256, 0.634
against 0.372 at 960 x 256000): the per-row chain (load, two block reductions, the exchange
through L2, the gradient) is latency-bound at ~5 us per row and program, while the bandwidth
floor of its single read and write is ~2 us. See NOTES-flce.md v9.

    PYTHONPATH=service python3 research/flce_ce_split_probe.py --out FILE
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_common import ce_chunk, probe_parser, run_meta, save, time_rounds

from kassay.kernels import _flce_launch as kl
from kassay.kernels._flce_kernels import LOG2E, _tanh

CHUNKS = [(1792, 128256, 8192), (960, 256000, 8192)]  # rows, V, rows of the whole batch
# (SEG columns per program, num_warps, programs per SM)
SPLIT_CONFIGS = [(16384, 32, 1), (32768, 32, 1), (8192, 16, 2), (16384, 16, 2), (8192, 8, 4)]


@triton.jit
def _ce_split_kernel(
    z_ptr,  # [n_rows, V] logits chunk, 16-bit or float32; overwritten by dlogits
    stride_z,
    tgt_ptr,  # [n_rows] int64
    loss_ptr,  # [n_rows] float32 (as _ce_rows_kernel)
    zloss_ptr,  # [n_rows] float32
    lse_ptr,  # [n_rows] float32
    scale_ptr,  # float32 row factor of the gradient, scalar (stride 0) or per row
    stride_scale,
    part_ptr,  # [n_rows, G, 2] int64, zero on entry: each segment's partials (see below)
    V,
    ignore_index,
    label_smoothing,
    z_loss_scale,
    softcap,
    n_rows,
    n_groups,  # grid size / G: the row stride of every group
    G: tl.constexpr,  # programs per row (a group); G * SEG >= V > (G - 1) * SEG
    G_POW2: tl.constexpr,  # next power of two of G
    SEG: tl.constexpr,  # columns each program holds in registers
    HAS_SOFTCAP: tl.constexpr,
    HAS_LS: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
):
    # Same outputs as _ce_rows_kernel with one read of the logits instead of two: the G programs
    # of a group split a row into G segments, each keeps its segment in registers while the
    # group exchanges partials through global memory, then writes its dlogits from registers.
    # The next row's segment is loaded before the exchange, so it is in flight while the program
    # waits. The exchange needs no fence (a release would also wait for that load and for the
    # previous row's stores): each partial travels as one 64-bit word, (max, sum of exp) and
    # (sum of logits, 1) as float32 bit pairs, never 0 once written (sum of exp >= 1 for a
    # finite max, and a -inf max has nonzero bits), and readers poll the words until all are
    # nonzero. A group's programs wait on each other, so they must be resident together: the
    # launcher sizes the grid to what the SMs hold at once, and a group is consecutive program
    # ids (dispatched in order, a group never waits on programs that only start after it ends).
    # G = 1 (nothing to wait for) is what the Triton interpreter runs: it executes programs one
    # after another.
    pid = tl.program_id(0)
    grp = pid // G
    rank = pid % G
    cols = rank * SEG + tl.arange(0, SEG)
    inb = cols < V
    gi = tl.arange(0, G_POW2)
    gmask = gi < G
    # (masks as cols < a column limit that is 0 past the last row)
    zn = tl.load(z_ptr + tl.cast(grp, tl.int64) * stride_z + cols, mask=cols < _lim(grp, n_rows, V))
    for r in range(grp, n_rows, n_groups):
        row = tl.cast(r, tl.int64)
        z_row = z_ptr + row * stride_z
        zc = zn.to(tl.float32)
        rn = r + n_groups
        zn = tl.load(
            z_ptr + tl.cast(rn, tl.int64) * stride_z + cols, mask=cols < _lim(rn, n_rows, V)
        )
        tgt = tl.load(tgt_ptr + row)
        valid = tgt != ignore_index
        tgt_safe = tl.where(valid & (tgt >= 0) & (tgt < V), tgt, 0).to(tl.int32)
        owns_t = (tgt_safe >= rank * SEG) & (tgt_safe < rank * SEG + SEG)

        if HAS_SOFTCAP:
            zc = softcap * _tanh(zc / softcap)
        zm = tl.where(inb, zc, float("-inf"))
        m = tl.max(zm, axis=0)
        m_safe = tl.where(m == float("-inf"), 0.0, m)  # a segment of -inf logits has no mass
        s = tl.sum(tl.exp2((zm - m_safe) * LOG2E), axis=0)
        part = part_ptr + (row * G + rank) * 2
        tl.store(part, _f32_pair(m, s))
        if HAS_LS:
            one = tl.full([], 1.0, tl.float32)
            tl.store(part + 1, _f32_pair(tl.sum(tl.where(inb, zc, 0.0), axis=0), one))

        pg = part_ptr + (row * G + gi) * 2
        w = _poll_words(pg, gmask)
        mg = (w >> 32).to(tl.int32).to(tl.float32, bitcast=True)
        sg = w.to(tl.int32).to(tl.float32, bitcast=True)
        mx = tl.max(tl.where(gmask, mg, float("-inf")), axis=0)
        mx_safe = tl.where(mx == float("-inf"), 0.0, mx)
        sg = tl.where(gmask, sg * tl.exp2((mg - mx_safe) * LOG2E), 0.0)
        lse = mx + tl.log(tl.sum(sg, axis=0))
        eps_v = label_smoothing / V
        loss = lse
        if HAS_LS:
            zsum = (_poll_words(pg + 1, gmask) >> 32).to(tl.int32).to(tl.float32, bitcast=True)
            loss -= eps_v * tl.sum(tl.where(gmask, zsum, 0.0), axis=0)

        # the program holding the target column writes the row's outputs
        z_t = tl.sum(tl.where(cols == tgt_safe, zc, 0.0), axis=0)
        loss -= (1.0 - label_smoothing) * z_t
        zl = z_loss_scale * lse * lse
        tl.store(loss_ptr + row, tl.where(valid, loss + zl, 0.0), mask=owns_t)
        tl.store(zloss_ptr + row, tl.where(valid, zl, 0.0), mask=owns_t)
        tl.store(lse_ptr + row, lse, mask=owns_t)

        if COMPUTE_GRAD:
            g = tl.load(scale_ptr + row * stride_scale).to(tl.float32)
            g = tl.where(valid, g, 0.0)
            cg = (1.0 + 2.0 * z_loss_scale * lse) * g
            d = tl.exp2(zc * LOG2E - lse * LOG2E) * cg - eps_v * g
            d = tl.where(cols == tgt_safe, d - (1.0 - label_smoothing) * g, d)
            if HAS_SOFTCAP:
                th = zc / softcap
                d = d * (1.0 - th * th)
            tl.store(z_row + cols, d.to(z_ptr.dtype.element_ty), mask=inb)


@triton.jit
def _lim(r, n_rows, V):
    """Columns of row r to load: V, or 0 past the last row."""
    return tl.where(r < n_rows, V, 0)


@triton.jit
def _f32_pair(hi, lo):
    """Two float32 scalars as the bits of one int64 word (hi in the upper half)."""
    h = hi.to(tl.uint32, bitcast=True).to(tl.int64)
    return (h << 32) | lo.to(tl.uint32, bitcast=True).to(tl.int64)


@triton.jit
def _poll_words(ptrs, mask):
    """Load the int64 words at ptrs (where mask) until none is 0; volatile: every poll reads
    memory again."""
    w = tl.load(ptrs, mask=mask, other=1, volatile=True)
    while tl.min(tl.where(w != 0, 1, 0), axis=0) == 0:
        w = tl.load(ptrs, mask=mask, other=1, volatile=True)
    return w


def launch_split(z, t, f32, scale, V, config):
    """The split kernel on chunk z [rows, V] (dlogits written over it), mean-reduction factor
    `scale`, no options; returns the compiled kernel (registers, spills)."""
    seg, num_warps, per_sm = config
    g = -(-V // seg)
    n = z.shape[0]
    part = torch.zeros((n, g, 2), dtype=torch.int64, device=z.device)
    sms = torch.cuda.get_device_properties(z.device).multi_processor_count
    # as many groups as the SMs hold at once (a group's programs wait on each other)
    n_groups = max(1, min(n, per_sm * sms // g))
    return _ce_split_kernel[(n_groups * g,)](
        z, z.stride(0), t, *f32, scale, 0, part, V, -100, 0.0, 0.0, 1.0, n, n_groups,
        G=g, G_POW2=triton.next_power_of_2(g), SEG=seg, HAS_SOFTCAP=False, HAS_LS=False,
        COMPUTE_GRAD=True, num_warps=num_warps,
    )  # fmt: skip


def main() -> int:
    args = probe_parser(__doc__).parse_args()
    out: dict = run_meta()
    for rows, v, n in CHUNKS:
        z0, t, scale, f32, z = ce_chunk(rows, v, n)

        def shipped(z=z, t=t, scale=scale, f32=f32, v=v):
            kl._launch_ce(
                z, t, *f32, scale, False, V=v, ignore_index=-100, label_smoothing=0.0,
                z_loss_scale=0.0, softcap=None, compute_grad=True,
            )  # fmt: skip

        variants = {"shipped": shipped}
        for c in SPLIT_CONFIGS:
            variants["split_{}_{}_{}".format(*c)] = lambda c=c, z=z, t=t, f32=f32, v=v, s=scale: (
                launch_split(z, t, f32, s, v, c)
            )
        key = f"{rows}x{v}"
        res: dict = {"ms": {}, "max_abs_diff_vs_shipped": {}, "kernel": {}}
        z.copy_(z0)
        shipped()
        ref = (z.clone(), [a.clone() for a in f32])
        for name, fn in variants.items():
            if name == "shipped":
                continue
            z.copy_(z0)
            k = fn()
            res["kernel"][name] = {"regs": k.n_regs, "spills": k.n_spills}
            d = {"dlogits": float((z.float() - ref[0].float()).abs().max())}
            for i, nm in enumerate(("loss", "zloss", "lse")):
                d[nm] = float((f32[i] - ref[1][i]).abs().max())
            res["max_abs_diff_vs_shipped"][name] = d
            print(key, name, d, res["kernel"][name], flush=True)
        res["ms"] = time_rounds(variants, args.rounds, key)
        out[key] = res
        z0 = z = ref = None
        torch.cuda.empty_cache()
    save(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
