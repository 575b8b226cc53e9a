"""Experimental Hopper (sm_90) Gluon kernel for the grad-W GEMM: C[M, N] += scale * A^T @ B.

What: the FLCE backward accumulates grad_W chunk by chunk, C += scale * dlogits_chunk^T @ x_chunk,
with A = dlogits chunk [K=rows, M=V] bfloat16, B = x chunk [K=rows, N=H] bfloat16, C the float16
scaled accumulator [M, N] (read, added to, written back in place) and scale a float32 scalar in
device memory. Accumulation is float32 in registers.

Why: the plain-Triton persistent TMA kernel (kassay.kernels.flce._launch_gemm_tn) stalls the
tensor cores in its read-modify-write epilogue (ncu on H200 at (M, N, K) = (256000, 2304, 960):
1.95 ms / 67% SM throughput vs cuBLAS addmm_ 1.74 ms / 76%). This kernel hides the epilogue:

- persistent grid (one CTA per SM), tiles in grid-stride order with a GROUP_M swizzle;
- gl.warp_specialize with three partitions:
    * producer (1 warp, few registers): TMA loads of the A tile [BLOCK_K, BLOCK_M] and the
      B tile [BLOCK_K, BLOCK_N] into a NUM_STAGES ring guarded by ready/empty mbarriers;
    * two consumer warpgroups in "ping-pong": the CTA's local tiles alternate between them
      (local tile i goes to warpgroup i % 2). Each issues async wgmma on its own fp32
      accumulator (BLOCK_M x BLOCK_N = 128 x 128 per warpgroup; A^T is fed as a permuted
      shared-memory view, which wgmma supports for 16-bit operands) and runs the epilogue of
      its tile while the other warpgroup's mainloop keeps the tensor cores busy. The ring
      order (all stages of local tile i, then all of tile i + 1) serialises the mainloops
      naturally, so no extra ordering barrier is needed.
- the C tile is prefetched by TMA into the consumer's own shared-memory buffer at the start of
  the tile, so the epilogue (C + scale * acc -> float16, TMA store from the same buffer) never
  waits on HBM.

Shapes of interest (M, N, K): (256000, 2304, 960) and (128256, 4096, 1792); tails in M, N and K
are handled by TMA zero-fill (loads) and clipping (stores). Rows must be 16-byte aligned.

Run:
    python research/gluon_gradw.py --compile-check          # offline, sm_90, no GPU (triton 3.6)
    PYTHONPATH=service timeout 150 python3 research/gluon_gradw.py --check --bench [--json OUT]  # H200
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# Tile / pipeline configuration. BLOCK_M x BLOCK_N is the tile of ONE consumer warpgroup.
# Shared memory: NUM_STAGES * (BK*BM + BK*BN) * 2 B + 2 * BM*BN * 2 B (+ barriers)
#   = 5 * 32 KiB + 64 KiB = 224 KiB (229656 B with barriers; the limit is 227 KiB = 232448 B).
# Override for experiments with GLUON_GRADW_CFG="BM,BN,BK,STAGES", e.g. "128,128,64,4" (block
# dims must be powers of two; BM=128 x BN=256 would need a 256-register accumulator).
BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES = (
    int(v) for v in os.environ.get("GLUON_GRADW_CFG", "128,128,64,5").split(",")
)
GROUP_M = 8
CONSUMER_WARPS = 4  # one warpgroup per consumer (num_warps of the default partition)
PRODUCER_REGS = 24
CONSUMER_REGS = 240  # requested for the worker consumer; the default one gets what is left
# 4 (consumer 0) + 4 (consumer 1) + 1 (producer) warps, rounded up to 3 warpgroups = 384 threads;
# 65536 / 384 = 170.6, so the kernel-wide register cap must be <= 168 for the launch to fit.
MAXNREG = 168


@gluon.jit
def _tile_coords(tile, num_pid_m, num_pid_n, GROUP: gl.constexpr):
    # GROUP_M swizzle: walk GROUP m-blocks down one n-column before moving right, so the
    # concurrently resident tiles share A (and all of B, which is small) in L2.
    group_size = GROUP * num_pid_n
    first_m = (tile // group_size) * GROUP
    rows = gl.minimum(num_pid_m - first_m, GROUP)
    r = tile % group_size
    return first_m + r % rows, r // rows


@gluon.jit
def _producer(
    a_desc,
    b_desc,
    a_bufs,
    b_bufs,
    ready,
    empty,
    M,
    N,
    K,
    BM: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    GROUP: gl.constexpr,
    STAGES: gl.constexpr,
    A_SPLIT: gl.constexpr,
):
    # The A tile [BK, BM] is loaded in A_SPLIT column parts [BK, BM / A_SPLIT] (one per
    # consumer warpgroup in the cooperative variant): stage s holds a_bufs[A_SPLIT * s + p]
    # for p < A_SPLIT, and b_bufs[s].
    # Ring bookkeeping: `pos` counts every (tile, k-step) load this CTA issues, in the order the
    # consumers read them; stage s = pos % STAGES, lap L = pos // STAGES.
    # empty[s]: the consumer arrives once (count=1) per position it releases, so its n-th
    # completion (n = 1, 2, ...) finishes phase n-1, parity (n-1) & 1, and is the release of
    # lap n-1. Filling lap L needs the release of lap L-1, i.e. completion n = L, parity
    # (L-1) & 1 = (L & 1) ^ 1. For L = 0 that is parity 1: a fresh mbarrier is in phase 0 and
    # a wait on parity 1 (the phase "before" 0) returns at once, so the first lap is free.
    # Example, STAGES=5, k_tiles=15 (K=960): local tile 0 (consumer 0) is pos 0..14, tile 1
    # (consumer 1) 15..29, tile 2 (consumer 0) 30..44. pos 0..4 pass at once (parity 1);
    # pos 5 (s=0, L=1) waits parity 0 = release of pos 0; pos 10 (s=0, L=2) waits parity 1 =
    # release of pos 5; pos 15 (s=0, L=3, first k-step of consumer 1) waits parity 0 = release
    # of pos 10 by consumer 0; pos 30 (s=0, L=6) waits parity 1 = release of pos 25 by
    # consumer 1. The barrier cannot run two phases ahead of a waiter: lap L+1 of a stage is
    # only filled (and so only released) after this producer's own wait for lap L.
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    num_pid_m, num_pid_n, num_tiles, k_tiles = _grid(M, N, K, BM, BN, BK)
    nbytes: gl.constexpr = A_SPLIT * a_desc.block_type.nbytes + b_desc.block_type.nbytes
    PART: gl.constexpr = BM // A_SPLIT
    pos = 0
    for tile in range(pid, num_tiles, nprog):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP)
        off_m = pid_m * BM
        off_n = pid_n * BN
        for kk in range(k_tiles):
            s = pos % STAGES
            lap = pos // STAGES
            mbarrier.wait(empty.index(s), (lap & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, nbytes)
            for p in gl.static_range(A_SPLIT):
                tma.async_copy_global_to_shared(
                    a_desc, [kk * BK, off_m + p * PART], bar, a_bufs.index(A_SPLIT * s + p)
                )
            tma.async_copy_global_to_shared(b_desc, [kk * BK, off_n], bar, b_bufs.index(s))
            pos += 1


@gluon.jit
def _grid(M, N, K, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr):
    """(m tiles, n tiles, tiles, k-steps) of the problem."""
    num_pid_m = gl.cdiv(M, BM)
    num_pid_n = gl.cdiv(N, BN)
    return num_pid_m, num_pid_n, num_pid_m * num_pid_n, gl.cdiv(K, BK)


@gluon.jit
def _prefetch_c(c_desc, c_buf, c_bar, off_m, off_n):
    # The previous tile's TMA store reads c_buf, so wait for that read (store_wait; Triton
    # follows it with a warpgroup barrier, so the issuing thread's wait covers everyone) before
    # the TMA load overwrites the buffer. The epilogue's fence orders the previous
    # ldmatrix/stmatrix accesses before this async-proxy write.
    tma.store_wait(0)
    mbarrier.expect(c_bar, c_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(c_desc, [off_m, off_n], c_bar, c_buf)


@gluon.jit
def _mainloop(a_bufs, b_bufs, ready, empty, acc, base, k_tiles, A_STRIDE: gl.constexpr,
              A_OFF: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    """k-steps at ring positions base .. base + k_tiles - 1 into acc; returns acc with the last
    wgmma still in flight (its stage not yet released: see `_finish_tile`).

    ready[s] phase p completes when the fill of lap p lands, so position pos waits parity
    (pos // STAGES) & 1. The A operand is a_bufs[A_STRIDE * s + A_OFF], [BK, rows] viewed
    transposed as A^T [rows, BK]."""
    for kk in range(k_tiles):
        pos = base + kk
        s = pos % STAGES
        mbarrier.wait(ready.index(s), (pos // STAGES) & 1)
        a_t = a_bufs.index(A_STRIDE * s + A_OFF).permute((1, 0))
        acc = warpgroup_mma(a_t, b_bufs.index(s), acc, use_acc=kk > 0, is_async=True)
        # Keep one wgmma in flight: after this wait the previous k-step's wgmma has finished
        # reading its stage, which can then be handed back to the producer.
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        mbarrier.arrive(empty.index((pos + STAGES - 1) % STAGES), pred=kk > 0)
    return acc


@gluon.jit
def _finish_tile(acc, empty, base, k_tiles, STAGES: gl.constexpr):
    """Wait for the tile's last wgmma and release its stage (if the tile had any k-step)."""
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.arrive(empty.index((base + k_tiles - 1) % STAGES), pred=k_tiles > 0)
    return acc


@gluon.jit
def _epilogue(c_desc, c_buf, c_bar, parity, acc, scale, off_m, off_n,
              ACC_LAYOUT: gl.constexpr):  # fmt: skip
    """C (prefetched into c_buf) + scale * acc, rounded to float16, stored back in place."""
    mbarrier.wait(c_bar, parity)
    c = c_buf.load(ACC_LAYOUT)
    out = c.to(gl.float32) + acc * scale
    c_buf.store(out.to(gl.float16))
    fence_async_shared()  # generic-proxy smem writes -> visible to the TMA store
    tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_buf)


@gluon.jit
def _consumer(
    c_desc,
    a_bufs,
    b_bufs,
    ready,
    empty,
    c_bufs,
    c_bars,
    order,
    scale_ptr,
    M,
    N,
    K,
    WG: gl.constexpr,
    BM: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    GROUP: gl.constexpr,
    STAGES: gl.constexpr,
):
    # wgmma accumulator layout: one warpgroup, m16 x n(BN) x k16 instructions.
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16]
    )
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    num_pid_m, num_pid_n, num_tiles, k_tiles = _grid(M, N, K, BM, BN, BK)
    scale = gl.load(scale_ptr)
    c_buf = c_bufs.index(WG)
    c_bar = c_bars.index(WG)

    # This warpgroup owns the CTA-local tiles i = WG, WG + 2, WG + 4, ... (global tile
    # pid + i * nprog); its j-th tile is local tile i = 2 j + WG, whose k-steps occupy ring
    # positions i * k_tiles .. i * k_tiles + k_tiles - 1 (the producer's order).
    # The other warpgroup consumes the positions in between; a stage is never refilled before
    # its single release (one arrive per position, count=1), so the two consumers cannot
    # confuse laps: position pos + STAGES is only loaded after pos was released.
    # c_bar: exactly one C load in flight per warpgroup, waited before the next one is issued,
    # so the j-th load completes phase j and is awaited with parity j & 1.
    n_local = gl.cdiv(num_tiles - pid, nprog)  # tiles of this CTA (grid <= num_tiles)
    for j in range((n_local + 1 - WG) // 2):
        tile = pid + (2 * j + WG) * nprog
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP)
        off_m = pid_m * BM
        off_n = pid_n * BN
        base = (2 * j + WG) * k_tiles
        _prefetch_c(c_desc, c_buf, c_bar, off_m, off_n)

        # Turn-taking: a parity wait only tells "this phase or the one before it", so a consumer
        # must never wait on a ring stage more than one lap ahead of its fills. Local tile i
        # starts its k-loop only after tile i - 1's consumer (the other warpgroup) has passed its
        # last ready-wait: then every stage holds at most the lap this tile waits for or the one
        # before. order[WG] gets one arrive per tile of the other warpgroup, and the two
        # alternate, so tile i waits the ((i - 1) // 2)-th completion: parity ((i - 1) // 2) & 1.
        # (Without this, warpgroup 1's first wait, lap k_tiles // STAGES on a fresh barrier,
        # passed at once whenever that lap was odd.)
        i_local = 2 * j + WG
        if i_local > 0:
            mbarrier.wait(order.index(WG), ((i_local - 1) // 2) & 1)
        acc = gl.zeros([BM, BN], gl.float32, acc_layout)
        acc = _mainloop(a_bufs, b_bufs, ready, empty, acc, base, k_tiles, 1, 0, STAGES)
        mbarrier.arrive(order.index(1 - WG))  # the other warpgroup's next tile may start
        acc = _finish_tile(acc, empty, base, k_tiles, STAGES)
        _epilogue(c_desc, c_buf, c_bar, j & 1, acc, scale, off_m, off_n, acc_layout)
    tma.store_wait(0)


@gluon.jit
def _gemm_tn_acc_ws_kernel(
    a_desc,
    b_desc,
    c_desc,
    scale_ptr,
    M,
    N,
    K,
    BM: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    GROUP: gl.constexpr,
    STAGES: gl.constexpr,
    P_REGS: gl.constexpr,
    C_REGS: gl.constexpr,
):
    a_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BK, BM], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BK, BN], b_desc.layout)
    c_bufs = gl.allocate_shared_memory(gl.float16, [2, BM, BN], c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    c_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    order = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)  # completed by the TMA transaction bytes
        mbarrier.init(empty.index(i), count=1)  # one arrive from the consuming warpgroup
    for i in gl.static_range(2):
        mbarrier.init(c_bars.index(i), count=1)
        mbarrier.init(order.index(i), count=1)
    fence_async_shared()

    # Argument tuples are spelled out: `*args` is not supported by the 3.6 frontend, and tuples
    # built with `+` passed their constexpr block sizes on as tensors.
    # fmt: off
    gl.warp_specialize(
        [
            (_consumer, (c_desc, a_bufs, b_bufs, ready, empty, c_bufs, c_bars, order, scale_ptr,
                         M, N, K, 0, BM, BN, BK, GROUP, STAGES)),  # default partition: wg 0
            (_consumer, (c_desc, a_bufs, b_bufs, ready, empty, c_bufs, c_bars, order, scale_ptr,
                         M, N, K, 1, BM, BN, BK, GROUP, STAGES)),  # worker: warpgroup 1
            (_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K,
                         BM, BN, BK, GROUP, STAGES, 1)),  # worker: 1 TMA warp
        ],
        [4, 1],
        [C_REGS, P_REGS],
    )
    # fmt: on


# ------------------------------------------------------------------------------------------------
# Variant "coop": the two consumer warpgroups share one 128 x 256 tile (64 rows each, so each
# wgmma is m64 n256: the operand reuse of the shipped Triton kernel's tile), a 1-warp TMA
# producer keeps the ring full through the epilogue, and each warpgroup prefetches its half of
# the C tile by TMA at the tile's start. The epilogue is not overlapped with MMAs (both
# warpgroups finish together) but no longer waits on HBM, and the next tile's stages are loaded
# meanwhile. Ring: both warpgroups consume every position, so each stage's empty barrier expects
# two arrivals; each warpgroup waits ready[s] only for laps whose previous lap it consumed
# itself, so a parity wait can never be two phases off.
COOP_BM, COOP_BN, COOP_BK, COOP_STAGES = 128, 256, 64, 3  # 3 x 48 KiB ring + 2 x 32 KiB for C


@gluon.jit
def _coop_consumer(c_desc, a_bufs, b_bufs, ready, empty, c_bufs, c_bars, scale_ptr, M, N, K,
                   WG: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                   GROUP: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    HALF: gl.constexpr = BM // 2
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16]
    )
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    num_pid_m, num_pid_n, num_tiles, k_tiles = _grid(M, N, K, BM, BN, BK)
    scale = gl.load(scale_ptr)
    c_buf = c_bufs.index(WG)
    c_bar = c_bars.index(WG)
    j = 0  # tiles done by this CTA: positions j * k_tiles ..., C load number j (parity j & 1)
    for tile in range(pid, num_tiles, nprog):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP)
        off_m = pid_m * BM + WG * HALF
        off_n = pid_n * BN
        base = j * k_tiles
        _prefetch_c(c_desc, c_buf, c_bar, off_m, off_n)
        acc = gl.zeros([HALF, BN], gl.float32, acc_layout)
        # A half WG of stage s: a_bufs[2 s + WG] ([BK, HALF], see `_producer` with A_SPLIT=2)
        acc = _mainloop(a_bufs, b_bufs, ready, empty, acc, base, k_tiles, 2, WG, STAGES)
        acc = _finish_tile(acc, empty, base, k_tiles, STAGES)
        _epilogue(c_desc, c_buf, c_bar, j & 1, acc, scale, off_m, off_n, acc_layout)
        j += 1  # noqa: SIM113 (no enumerate in Gluon)
    tma.store_wait(0)


@gluon.jit
def _gemm_tn_acc_coop_kernel(a_desc, b_desc, c_desc, scale_ptr, M, N, K, BM: gl.constexpr,
                             BN: gl.constexpr, BK: gl.constexpr, GROUP: gl.constexpr,
                             STAGES: gl.constexpr, P_REGS: gl.constexpr,
                             C_REGS: gl.constexpr):  # fmt: skip
    HALF: gl.constexpr = BM // 2
    a_bufs = gl.allocate_shared_memory(gl.bfloat16, [2 * STAGES, BK, HALF], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BK, BN], b_desc.layout)
    c_bufs = gl.allocate_shared_memory(gl.float16, [2, HALF, BN], c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    c_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # both warpgroups release every position
    for i in gl.static_range(2):
        mbarrier.init(c_bars.index(i), count=1)
    fence_async_shared()
    # fmt: off
    gl.warp_specialize(
        [
            (_coop_consumer, (c_desc, a_bufs, b_bufs, ready, empty, c_bufs, c_bars, scale_ptr,
                              M, N, K, 0, BM, BN, BK, GROUP, STAGES)),
            (_coop_consumer, (c_desc, a_bufs, b_bufs, ready, empty, c_bufs, c_bars, scale_ptr,
                              M, N, K, 1, BM, BN, BK, GROUP, STAGES)),
            (_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K,
                         BM, BN, BK, GROUP, STAGES, 2)),
        ],
        [4, 1],
        [C_REGS, P_REGS],
    )
    # fmt: on


def _spec(variant: str):
    """(kernel, A block, B block, C block, constexpr meta) of a variant ("ws" or "coop")."""
    if variant == "coop":
        half = COOP_BM // 2
        blocks = [COOP_BK, half], [COOP_BK, COOP_BN], [half, COOP_BN]
        tile = dict(BM=COOP_BM, BN=COOP_BN, BK=COOP_BK, STAGES=COOP_STAGES)
        kern = _gemm_tn_acc_coop_kernel
    else:
        blocks = [BLOCK_K, BLOCK_M], [BLOCK_K, BLOCK_N], [BLOCK_M, BLOCK_N]
        tile = dict(BM=BLOCK_M, BN=BLOCK_N, BK=BLOCK_K, STAGES=NUM_STAGES)
        kern = _gemm_tn_acc_ws_kernel
    meta = dict(tile, GROUP=GROUP_M, P_REGS=PRODUCER_REGS, C_REGS=CONSUMER_REGS)
    return (kern, *blocks, meta)


def _layouts(a_blk, b_blk, c_blk):
    return (
        gl.NVMMASharedLayout.get_default_for(a_blk, gl.bfloat16),
        gl.NVMMASharedLayout.get_default_for(b_blk, gl.bfloat16),
        gl.NVMMASharedLayout.get_default_for(c_blk, gl.float16),
    )


def _launch(variant: str, a, b, c, scale):
    """c += scale * a^T @ b in place; a [K, M] bf16, b [K, N] bf16, c [M, N] fp16, scale fp32 [1]."""
    import torch

    k_dim, m = a.shape
    n = b.shape[1]
    assert b.shape[0] == k_dim and tuple(c.shape) == (m, n)
    assert a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16 and c.dtype == torch.float16
    assert a.is_contiguous() and b.is_contiguous() and c.is_contiguous()
    if m == 0 or n == 0 or k_dim == 0:
        return c
    kern, a_blk, b_blk, c_blk, meta = _spec(variant)
    a_l, b_l, c_l = _layouts(a_blk, b_blk, c_blk)
    descs = (
        TensorDescriptor.from_tensor(a, a_blk, a_l),
        TensorDescriptor.from_tensor(b, b_blk, b_l),
        TensorDescriptor.from_tensor(c, c_blk, c_l),
    )
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    tiles = triton.cdiv(m, meta["BM"]) * triton.cdiv(n, meta["BN"])
    kern[(min(sms, tiles),)](
        *descs, scale, m, n, k_dim, **meta, num_warps=CONSUMER_WARPS, maxnreg=MAXNREG
    )
    return c


def gemm_tn_acc_gluon(a, b, c, scale):
    """Ping-pong variant (128 x 128 tile per consumer warpgroup); see `_launch`."""
    return _launch("ws", a, b, c, scale)


def gemm_tn_acc_gluon_coop(a, b, c, scale):
    """Cooperative variant (one 128 x 256 tile for both consumer warpgroups); see `_launch`."""
    return _launch("coop", a, b, c, scale)


# ------------------------------------------------------------------------------------------------
# Offline compile check (no GPU needed).


def compile_check() -> int:
    return _compile_check("ws") | _compile_check("coop")


def _compile_check(variant: str) -> int:
    import re
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    kern, a_blk, b_blk, c_blk, meta = _spec(variant)
    a_l, b_l, c_l = _layouts(a_blk, b_blk, c_blk)
    print(f"== variant {variant}")
    sig = {
        "a_desc": f"tensordesc<bf16[{a_blk[0]}, {a_blk[1]}],{a_l!r}>",
        "b_desc": f"tensordesc<bf16[{b_blk[0]}, {b_blk[1]}],{b_l!r}>",
        "c_desc": f"tensordesc<fp16[{c_blk[0]}, {c_blk[1]}],{c_l!r}>",
        "scale_ptr": "*fp32",
        "M": "i32",
        "N": "i32",
        "K": "i32",
    }
    sig.update({k: "constexpr" for k in meta})
    src = GluonASTSource(kern, sig, constexprs=meta)
    opts = {"num_warps": CONSUMER_WARPS, "maxnreg": MAXNREG}
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    md = k.metadata
    print(f"compiled for sm_90: name={md.name} num_warps={md.num_warps} shared={md.shared} B")
    ptx = k.asm["ptx"]
    regs = re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)
    print("setmaxnreg in PTX:", regs)
    print("wgmma instructions:", sorted(set(re.findall(r"wgmma\.mma_async\.[\w.]+", ptx))))
    nvbin = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as td:
        path = os.path.join(td, "k.cubin")
        with open(path, "wb") as f:
            f.write(k.asm["cubin"])
        res = subprocess.run(
            [os.path.join(nvbin, "cuobjdump"), "-res-usage", path],
            capture_output=True,
            text=True,
            check=False,
        )
        print(res.stdout.strip() or res.stderr.strip())
    if os.environ.get("GLUON_GRADW_DUMP"):
        out = os.environ["GLUON_GRADW_DUMP"]
        os.makedirs(out, exist_ok=True)
        for ext in ("ttgir", "llir", "ptx"):
            with open(os.path.join(out, f"{variant}.{ext}"), "w") as f:
                f.write(k.asm[ext])
    return 0


# ------------------------------------------------------------------------------------------------
# Device mode: correctness and timing on CUDA.

# the first two give each CTA at most one tile; the next two several (both warpgroups, ring
# wrap-around across tiles); then the target shapes
SHAPES_CHECK = [
    (1000, 320, 200),
    (776, 136, 72),
    (4096, 1024, 256),
    (16384, 2048, 320),
    (128256, 4096, 1792),
    (256000, 2304, 960),
]
SHAPES_BENCH = [(256000, 2304, 960), (128256, 4096, 1792)]
VARIANTS = {"ws": gemm_tn_acc_gluon, "coop": gemm_tn_acc_gluon_coop}


def _inputs(m, n, k, seed=0):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    a = (torch.randn(k, m, device="cuda", generator=g) * 0.5).to(torch.bfloat16)
    b = torch.randn(k, n, device="cuda", generator=g).to(torch.bfloat16)
    c = (torch.randn(m, n, device="cuda", generator=g) * 4).to(torch.float16)
    scale = torch.full((1,), 0.0625, device="cuda", dtype=torch.float32)
    return a, b, c, scale


def _check(results: dict) -> bool:
    import torch

    ok = True
    for m, n, k in SHAPES_CHECK:
        a, b, c0, scale = _inputs(m, n, k)
        ref = c0.double()
        ref.addmm_(a.double().t(), b.double(), alpha=float(scale.item()))
        ref = ref.half().double()  # the kernel's output is float16
        for name, fn in VARIANTS.items():
            c = c0.clone()
            fn(a, b, c, scale)
            torch.cuda.synchronize()
            err = ((c.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
            good = err < 1e-3 and bool(torch.isfinite(c).all())
            ok &= good
            results.setdefault("check", []).append(
                {"variant": name, "shape": [m, n, k], "rel_l2": err, "ok": good}
            )
            print(f"check {name} M={m} N={n} K={k}: rel-L2 {err:.3e} {'OK' if good else 'FAIL'}",
                  flush=True)  # fmt: skip
        del a, b, c, c0, ref
        torch.cuda.empty_cache()
    return ok


def _bench_shape(m, n, k, repo_launch) -> dict:
    import torch
    from triton.testing import do_bench

    a, b, c, scale = _inputs(m, n, k)
    c_bf = c.to(torch.bfloat16)
    s = float(scale.item())
    fns = {
        "gluon_ws": lambda: gemm_tn_acc_gluon(a, b, c, scale),
        "gluon_coop": lambda: gemm_tn_acc_gluon_coop(a, b, c, scale),
        "cublas_addmm_bf16": lambda: c_bf.addmm_(a.t(), b, alpha=s),
    }
    if repo_launch is not None:
        fns["triton_repo"] = lambda: repo_launch(a, b, c, scale, True)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(3):  # interleaved rounds
        for name, fn in fns.items():
            times[name].append(do_bench(fn, warmup=10, rep=60, return_mode="median"))
    flop = 2.0 * m * n * k
    row: dict = {"shape": [m, n, k]}
    for name, ts in times.items():
        ms = min(ts)
        row[name] = {"ms": [round(t, 4) for t in ts], "best_ms": round(ms, 4)}
        row[name]["tflops"] = round(flop / ms / 1e9, 1)
        print(f"M={m} N={n} K={k} {name:>18}: {ms:.4f} ms {flop / ms / 1e9:7.1f} TFLOP/s "
              f"(rounds {', '.join(f'{t:.4f}' for t in ts)})", flush=True)  # fmt: skip
    return row


def _bench(results: dict) -> None:
    import torch

    try:
        from kassay.kernels._flce_launch import _launch_gemm_tn as repo_launch
    except Exception as e:
        print(f"(repo kernel unavailable: {e!r}; set PYTHONPATH=service)")
        repo_launch = None
    for m, n, k in SHAPES_BENCH:
        results.setdefault("bench", []).append(_bench_shape(m, n, k, repo_launch))
        torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--compile-check", action="store_true", help="offline sm_90 compile")
    ap.add_argument("--check", action="store_true", help="correctness on CUDA")
    ap.add_argument("--bench", action="store_true", help="timing on CUDA")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args()
    if args.compile_check:
        return compile_check()
    if not (args.check or args.bench):
        ap.print_help()
        return 2
    import torch

    results: dict = {
        "date": datetime.date.today().isoformat(),
        "command": " ".join(sys.argv),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "config": {v: _spec(v)[4] for v in VARIANTS},
    }
    ok = True
    if args.check:
        ok = _check(results)
    if args.bench and ok:
        _bench(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
