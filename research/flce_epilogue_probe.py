"""Probe: what the grad_W kernel's per-tile epilogue costs (NOTES-flce.md v8). Not used by kassay.

At the second shape's 960-row chunks the grad_W GEMM (C[V, H] += dl^T @ x, K = 960: 15 k-steps
of 64 per 128 x 256 tile) takes ~2.0 ms against ~1.7 for the chunk's other two GEMMs (same
FLOPs, cuBLAS); at 1792 rows (28 k-steps) the gap is smaller. This times a copy of the shipped
TMA kernel's loop with its epilogue varied, on the same operands:

  none      no output: the tile's max goes to a [tiles] sink (keeps the mainloop alive)
  store2    C = tile, two TMA stores of 128 x 128 (the first chunk's epilogue)
  reduce1   C += tile, one TMA reduce-add of 128 x 256
  reduce2   C += tile, two TMA reduce-adds of 128 x 128 (shipped)
  reduce4   C += tile, four TMA reduce-adds of 128 x 64
  reduce2_pfK  reduce2, the C tile's lines prefetched into L2 (prefetch.global.L2::evict_last)
            after k-step K's loads of the same tile are issued, so the reduce-add's read of C
            from DRAM overlaps the mainloop instead of following it (NOTES v9)

(`flce_xform_probe.py` runs the same kernel with XFORM: the A tile computed from logits.)

against the shipped launcher and cuBLAS's logits (x @ W^T) and grad_x (dl @ W) GEMMs of the same
chunk. If "none" is as slow as "reduce2", the gap is the mainloop's per-tile start and drain, not
the epilogue's stores. Second run: `_gradw_deferred_kernel` keeps each finished tile in registers
(float16) and issues its shared-memory store and TMA reduce-add inside the next tile's k-loop,
after an MMA is issued (while the tensor cores work); variants in DEFERRED. --clocks S: each of
CLOCKED run back-to-back for S seconds with the SM clock and board power sampled per window
(does the accumulator traffic cost time through the power limit?).

    PYTHONPATH=service python3 research/flce_epilogue_probe.py --out FILE
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_common import grads_operands, probe_parser, run_meta, save, time_rounds

from kassay.kernels import _flce_launch as kl
from kassay.kernels._flce_kernels import LOG2E, _tile_grid, _tile_mn

CHUNKS = [(960, 2304, 256000), (1792, 4096, 128256)]  # rows (K), H (N), V (M)
BM, BN, BK, GROUP_M, WARPS, STAGES = 128, 256, 64, 8, 8, 3
# (MODE, PARTS, k-step after which the C tile is prefetched into L2; -1: none)
MODES = {
    "none": (0, 1, -1),
    "store2": (1, 2, -1),
    "reduce1": (2, 1, -1),
    "reduce2": (2, 2, -1),
    "reduce4": (2, 4, -1),
    "reduce2_pf0": (2, 2, 0),
    "reduce2_pf4": (2, 2, 4),
}
# deferred epilogue (`_gradw_deferred_kernel`): (AT, FLATTEN, SPREAD); k_tiles >= 2 assumed
DEFERRED = {
    "deferred_at0": (0, False, False),
    "deferred_at1": (1, False, False),
    "deferred_at2": (2, False, False),
    "deferred_at1_spread": (1, False, True),
    "deferred_at2_spread": (2, False, True),
    "deferred_at1_flat": (1, True, False),
}


@triton.jit
def _store_parts(c_desc, out, om, on, MODE: tl.constexpr, PARTS: tl.constexpr, BN: tl.constexpr):
    """out [BM, BN // PARTS * PARTS] to C at (om, on) in PARTS column blocks (1, 2 or 4)."""
    if PARTS == 1:
        if MODE == 1:
            c_desc.store([om, on], out.to(c_desc.dtype))
        else:
            c_desc.atomic_add([om, on], out.to(c_desc.dtype))
    else:
        h0, h1 = tl.split(
            tl.permute(tl.reshape(out, (out.shape[0], 2, out.shape[1] // 2)), (0, 2, 1))
        )
        _store_parts(c_desc, h0, om, on, MODE, PARTS // 2, BN // 2)
        _store_parts(c_desc, h1, om, on + BN // 2, MODE, PARTS // 2, BN // 2)


@triton.jit
def _gradw_epilogue_kernel(
    a_desc,  # dl [K, M], block [BK, BM]
    b_desc,  # x [K, N], block [BK, BN]
    c_desc,  # C [M, N] float16, block [BM, BN // PARTS]
    sink_ptr,  # float32 [tiles] (MODE 0)
    scale_ptr,
    c_ptr,  # C's data (PF_AT >= 0)
    stride_cm,
    lse2_ptr,  # [K] float32 lse * log2e of each row (XFORM)
    g_ptr,  # [K] float32 row factor, 0 for ignored rows (XFORM)
    tgt_ptr,  # [K] int32 targets (XFORM)
    M,
    N,
    K,
    MODE: tl.constexpr,  # 0 none, 1 store, 2 reduce-add
    PARTS: tl.constexpr,
    PF_AT: tl.constexpr,  # k-step after which C's tile is prefetched into L2; -1: never
    XFORM: tl.constexpr,  # A holds logits: its tiles become dlogits in registers (_dl_tile)
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr,
):
    start_pid = tl.program_id(0)
    num_pid_m, num_in_group, num_tiles, k_tiles = _tile_grid(M, N, K, BM, BN, BK, GROUP_M)
    scale = tl.load(scale_ptr)
    tile_id_c = start_pid - NUM_SMS
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = _tile_mn(tile_id, num_pid_m, num_in_group, GROUP_M)
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([ki * BK, pid_m * BM])
            b = b_desc.load([ki * BK, pid_n * BN])
            if XFORM:
                rows = ki * BK + tl.arange(0, BK)
                rm = rows < K
                a = _dl_tile(
                    a, tl.load(lse2_ptr + rows, mask=rm, other=0.0),
                    tl.load(g_ptr + rows, mask=rm, other=0.0),
                    tl.load(tgt_ptr + rows, mask=rm, other=-1), pid_m * BM + tl.arange(0, BM),
                )  # fmt: skip
            acc = tl.dot(a.T, b, acc)
            if PF_AT >= 0:  # noqa: SIM102 (compile-time branch; the inner one is not)
                if ki == tl.minimum(PF_AT, k_tiles - 1):
                    _prefetch_l2(c_ptr, stride_cm, pid_m * BM, pid_n * BN, M, N, BM, BN)
        tile_id_c += NUM_SMS
        pm, pn = _tile_mn(tile_id_c, num_pid_m, num_in_group, GROUP_M)
        out = acc * scale
        if MODE == 0:
            tl.store(sink_ptr + tile_id_c, tl.max(tl.max(out, axis=1), axis=0))
        else:
            _store_parts(c_desc, out, pm * BM, pn * BN, MODE, PARTS, BN)


@triton.jit
def _dl_tile(z, lse2, g, tgt, cols):
    """g * (softmax - onehot) of a logits tile z [R, C] (R rows, absolute columns cols [C]),
    per-row lse * log2e, factor g and target [R]; in z's dtype (mean reduction, no options)."""
    p = tl.exp2(z.to(tl.float32) * LOG2E - lse2[:, None]) * g[:, None]
    p = tl.where(cols[None, :] == tgt[:, None], p - g[:, None], p)
    return p.to(z.dtype)


@triton.jit
def _prefetch_l2(c_ptr, stride_cm, om, on, M, N, BM: tl.constexpr, BN: tl.constexpr):
    """Prefetch C[om:om+BM, on:on+BN] (2-byte elements) into L2, one 128-byte line per lane."""
    rows = om + tl.arange(0, BM)[:, None]
    cols = on + tl.arange(0, BN // 64)[None, :] * 64
    inb = (rows < M) & (cols < N)
    ptrs = c_ptr + tl.where(inb, rows.to(tl.int64) * stride_cm + cols, 0)
    tl.inline_asm_elementwise(
        "prefetch.global.L2::evict_last [$1];\n mov.u32 $0, 0;", "=r,l", [ptrs],
        dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def _gradw_deferred_kernel(
    a_desc,  # dl [K, M], block [BK, BM]
    b_desc,  # x [K, N], block [BK, BN]
    c_desc,  # C [M, N] float16, block [BM, BN // 2]
    scale_ptr,
    M,
    N,
    K,
    AT: tl.constexpr,  # k-step of the next tile after whose MMA issue the store goes out
    FLATTEN: tl.constexpr,
    SPREAD: tl.constexpr,  # the second half one k-step later
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr,
):
    """C += scale * A^T B with each tile's epilogue (shared-memory store + TMA reduce-add)
    deferred into the next tile's k-loop, after the MMA of k-step AT is issued, so it runs while
    the tensor cores work; the tile waits in registers as float16 (64 per thread)."""
    start_pid = tl.program_id(0)
    num_pid_m, num_in_group, num_tiles, k_tiles = _tile_grid(M, N, K, BM, BN, BK, GROUP_M)
    scale = tl.load(scale_ptr)
    prev = tl.zeros([BM, BN], dtype=c_desc.dtype)
    om_p = 0
    on_p = 0
    has_prev = False
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=FLATTEN):
        pid_m, pid_n = _tile_mn(tile_id, num_pid_m, num_in_group, GROUP_M)
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([ki * BK, pid_m * BM])
            b = b_desc.load([ki * BK, pid_n * BN])
            acc = tl.dot(a.T, b, acc)
            if SPREAD:
                p0, p1 = tl.split(tl.permute(tl.reshape(prev, (BM, 2, BN // 2)), (0, 2, 1)))
                if (ki == tl.minimum(AT, k_tiles - 2)) & has_prev:
                    c_desc.atomic_add([om_p, on_p], p0)
                if (ki == tl.minimum(AT + 1, k_tiles - 1)) & has_prev:
                    c_desc.atomic_add([om_p, on_p + BN // 2], p1)
            else:
                if (ki == tl.minimum(AT, k_tiles - 1)) & has_prev:
                    _store_parts(c_desc, prev, om_p, on_p, 2, 2, BN)
        prev = (acc * scale).to(c_desc.dtype)
        om_p = pid_m * BM
        on_p = pid_n * BN
        has_prev = True
    if has_prev:
        _store_parts(c_desc, prev, om_p, on_p, 2, 2, BN)


def _launch(kernel, dl, xc, c, parts, *args, **constexprs):
    """kernel over dl [K, M], x [K, N] and C [M, N] in blocks of BN // parts columns; args go
    between C's descriptor and M, N, K."""
    from triton.tools.tensor_descriptor import TensorDescriptor as TD

    k, m = dl.shape
    n = xc.shape[1]
    sms = kl._num_sms(dl.device.index or 0)
    return kernel[(sms,)](
        TD.from_tensor(dl, [BK, BM]), TD.from_tensor(xc, [BK, BN]),
        TD.from_tensor(c, [BM, BN // parts]), *args, m, n, k,
        BM=BM, BN=BN, BK=BK, GROUP_M=GROUP_M, NUM_SMS=sms, num_warps=WARPS, num_stages=STAGES,
        **constexprs,
    )  # fmt: skip


def launch_deferred(dl, xc, c, scale, at, flatten, spread):
    _launch(_gradw_deferred_kernel, dl, xc, c, 2, scale, AT=at, FLATTEN=flatten, SPREAD=spread)


def launch(dl, xc, c, sink, scale, mode, parts, pf_at, rowv=None):
    """rowv: (lse2, g, tgt) of dl's rows when dl holds logits (XFORM), else None."""
    return _launch(
        _gradw_epilogue_kernel, dl, xc, c, parts, sink, scale, c, c.stride(0),
        *(rowv or (scale, scale, scale)), MODE=mode, PARTS=parts, PF_AT=pf_at,
        XFORM=rowv is not None,
    )  # fmt: skip


CLOCKED = ["epi_none", "epi_store2", "epi_reduce2", "cublas_logits"]


def clocked(fns: dict, seconds: float) -> dict:
    """{name: {ms, sm_mhz, watts, samples}}: each of CLOCKED run back-to-back for 1 + `seconds`
    s while nvidia-smi samples the SM clock and board power every 100 ms in the background
    (medians over the samples after the first second; ms = mean per call over the whole run),
    with a pause between runs so each starts from a similar state."""
    res = {}
    for name in CLOCKED:
        fn = fns[name]
        smi = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
             "-lms", "100"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        calls = 0
        s.record()
        t_end = time.perf_counter() + 1.0 + seconds
        while time.perf_counter() < t_end:
            for _ in range(20):
                fn()
            calls += 20
            torch.cuda.synchronize()
        e.record()
        e.synchronize()
        smi.terminate()
        lines = smi.communicate()[0].strip().splitlines()
        samples = []
        for line in lines[int(len(lines) / (1.0 + seconds)) :]:
            try:
                samples.append([float(v) for v in line.split(",")])
            except ValueError:
                continue
        res[name] = {
            "ms": round(s.elapsed_time(e) / calls, 4),
            "sm_mhz": statistics.median(x[0] for x in samples) if samples else None,
            "watts": statistics.median(x[1] for x in samples) if samples else None,
            "samples": len(samples),
        }
        print("clocked", name, res[name], flush=True)
        time.sleep(3)
    return res


def main() -> int:
    ap = probe_parser(__doc__)
    ap.add_argument("--clocks", type=float, default=0.0, help="seconds per clocked run (0: off)")
    ap.add_argument("--no-deferred", action="store_true")
    args = ap.parse_args()
    if args.no_deferred:
        DEFERRED.clear()
    out: dict = run_meta()
    for rows, h, v in CHUNKS:
        dl, w, xc, c0, scale = grads_operands(rows, h, v, seed=7)
        sink = torch.empty(triton.cdiv(v, BM) * triton.cdiv(h, BN), device="cuda")
        key = f"{rows}x{h}x{v}"
        res: dict = {"max_abs_diff_vs_shipped": {}}
        c_ref = c0.clone()
        kl._launch_gemm_tn(dl, xc, c_ref, scale, True)
        for name, (mode, parts, pf_at) in MODES.items():
            if mode != 2:
                continue
            c = c0.clone()
            k = launch(dl, xc, c, sink, scale, mode, parts, pf_at)
            res["max_abs_diff_vs_shipped"][name] = float((c.float() - c_ref.float()).abs().max())
            if pf_at >= 0:  # the prefetch survived compilation
                res.setdefault("ptx_prefetch", {})[name] = "prefetch.global.L2" in k.asm["ptx"]
        for name, d in DEFERRED.items():
            c = c0.clone()
            launch_deferred(dl, xc, c, scale, *d)
            res["max_abs_diff_vs_shipped"][name] = float((c.float() - c_ref.float()).abs().max())
        print(key, res, flush=True)
        c = c0.clone()
        c_ref = None
        gx = torch.empty(rows, h, device="cuda", dtype=torch.bfloat16)
        z = torch.empty(rows, v, device="cuda", dtype=torch.bfloat16)
        fns = {
            f"epi_{name}": (lambda mp=mp: launch(dl, xc, c, sink, scale, *mp))  # noqa: B023
            for name, mp in MODES.items()
        }
        fns.update(
            {
                name: (lambda d=d: launch_deferred(dl, xc, c, scale, *d))  # noqa: B023
                for name, d in DEFERRED.items()
            }
        )
        fns["shipped_grad_W"] = lambda: kl._launch_gemm_tn(dl, xc, c, scale, True)  # noqa: B023
        fns["cublas_logits"] = lambda: torch.mm(xc, w.t(), out=z)  # noqa: B023
        fns["cublas_grad_x"] = lambda: torch.mm(dl, w, out=gx)  # noqa: B023
        res["ms"] = time_rounds(fns, args.rounds, key)
        if args.clocks > 0:
            res["clocked"] = clocked(fns, args.clocks)
        out[key] = res
        dl = w = xc = c0 = c = gx = z = None
        torch.cuda.empty_cache()
    save(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
