"""Triton kernels for the attention-state merge (softmax log-sum-exp correction).

Only ``@triton.jit`` code and constexpr tuning live here; the launchers that check inputs,
allocate and launch are in :mod:`kassay.kernels.lse_merge`.

Every LSE is a natural logarithm. A state's weight is ``exp(lse_k - m) / sum_j exp(lse_j - m)``
with ``m`` the row's largest LSE, so no exponent is ever taken of an unshifted LSE and ``|lse|``
up to float32's range is safe. A row is addressed by (batch ``b``, sequence position ``s``, head
``h``); the kernels receive the strides of every input along those three axes, which is all the
layouts ("hT" = [..., Hh, S], "Th" = [..., S, Hh]) and non-contiguous views differ by. The head
dimension ``D`` must be contiguous (stride 1).

Grid: one axis. Program ``pid`` takes batch entry ``pid // n_tiles`` and, inside it, a tile of
``BLOCK_T`` consecutive tokens x ``BLOCK_H`` consecutive heads (``BLOCK_R = BLOCK_T * BLOCK_H``
rows of ``D``). Tiles walk the heads of a token block first, so programs that run together cover
one contiguous stretch of the outs. With the LSE contiguous along S ("hT") the launcher picks
``BLOCK_T = 8``: each head's LSEs in a tile are one whole 32-byte sector. Row indices stay in
int32 (the launcher checks S and Hh fit); everything that multiplies a stride is int64.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Elements (rows x padded D) one program handles per state, and warps per program, by default.
# Chosen from the H200 sweeps recorded in research/NOTES-lse_merge.md.
DEFAULT_BLOCK_ELEMS = 2048
DEFAULT_NUM_WARPS = 4
# Skip loading a state's out row whose weight is zero (empty state): saves bandwidth on empty
# rows and keeps garbage (NaN) in an empty state's out from leaking into the result.
DEFAULT_SKIP_EMPTY_LOADS = True
# Tokens per tile when the LSE is contiguous along S: 8 x 4 bytes = one 32-byte sector.
DEFAULT_TILE_TOKENS_CONTIGUOUS_S = 8


@triton.jit
def _load_lse(ptrs, rmask, POSINF_IS_EMPTY: tl.constexpr):
    lse = tl.load(ptrs, mask=rmask, other=float("-inf")).to(tl.float32)
    if POSINF_IS_EMPTY:
        lse = tl.where(lse == float("inf"), float("-inf"), lse)
    return lse


@triton.jit
def _tile_rows(S, HH, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr):
    """(batch, s, h, row mask) of this program's tile; b, s, h as int64."""
    pid = tl.program_id(0)
    n_hb = tl.cdiv(HH, BLOCK_H)
    n_tiles = tl.cdiv(S, BLOCK_T) * n_hb
    b = pid // n_tiles
    tile = pid - b * n_tiles
    tb = tile // n_hb
    hb = tile - tb * n_hb
    r = tl.arange(0, BLOCK_R)
    s = tb * BLOCK_T + r // BLOCK_H
    h = hb * BLOCK_H + r % BLOCK_H
    rmask = (s < S) & (h < HH)
    return b.to(tl.int64), s.to(tl.int64), h.to(tl.int64), rmask


@triton.jit
def _element_mask(rmask, d, D, EVEN_D: tl.constexpr):
    """[BLOCK_R, BLOCK_D] mask of a tile's elements. With D a power of two there is no column
    mask: the mask stays constant along D, so loads stay 16 bytes wide."""
    if EVEN_D:  # noqa: SIM108 (a constexpr branch; only the taken one is compiled)
        full = rmask[:, None]
    else:
        full = rmask[:, None] & (d < D)[None, :]
    return full


@triton.jit
def _lse_out_rows(b, s, h, S, HH, LSE_OUT_HT: tl.constexpr):
    """Offsets of rows (b, s, h) in a contiguous result LSE, [B, Hh, S] or [B, S, Hh]."""
    if LSE_OUT_HT:  # noqa: SIM108 (a constexpr branch)
        z_rows = (b * HH + h) * S + s
    else:
        z_rows = (b * S + s) * HH + h
    return z_rows


@triton.jit
def _merge_states_kernel(
    out_ptr,  # [B, S, Hh, D] result, out dtype, contiguous
    lse_out_ptr,  # [B, Hh, S] (LSE_OUT_HT) or [B, S, Hh] result, float32, contiguous
    outs_ptr,  # [K, B, S, Hh, D] states, any strides but D contiguous
    lses_ptr,  # [K, B, (S, Hh) in either order] float32, any strides
    S,
    HH,
    D,
    s_ik,
    s_ib,
    s_is,
    s_ih,  # outs strides (k, b, s, h)
    s_lk,
    s_lb,
    s_ls,
    s_lh,  # lses strides (k, b, s, h)
    K: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EVEN_D: tl.constexpr,
    LSE_OUT_HT: tl.constexpr,
    POSINF_IS_EMPTY: tl.constexpr,
    ACC_IN_OUT_DTYPE: tl.constexpr,
    SKIP_EMPTY_LOADS: tl.constexpr,
):
    b, s, h, rmask = _tile_rows(S, HH, BLOCK_T, BLOCK_H, BLOCK_R)
    d = tl.arange(0, BLOCK_D)
    full = _element_mask(rmask, d, D, EVEN_D)

    lse_rows = lses_ptr + b * s_lb + s * s_ls + h * s_lh
    in_rows = outs_ptr + b * s_ib + s * s_is + h * s_ih
    s_lk64 = tl.cast(s_lk, tl.int64)  # tl.cast: the arg may be specialised to a constexpr 1
    s_ik64 = tl.cast(s_ik, tl.int64)

    # Pass 1: the row maximum over the K states (empty states are -inf).
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    for k in tl.static_range(K):
        m = tl.maximum(m, _load_lse(lse_rows + k * s_lk64, rmask, POSINF_IS_EMPTY))
    m_safe = tl.where(tl.abs(m) == float("inf"), 0.0, m)

    # Pass 2: the shifted sum (each term in [0, 1], the largest exactly 1).
    ssum = tl.zeros([BLOCK_R], tl.float32)
    for k in tl.static_range(K):
        ssum += tl.exp(_load_lse(lse_rows + k * s_lk64, rmask, POSINF_IS_EMPTY) - m_safe)
    # All states empty -> sum 0 -> lse -inf and every weight 0 (never 0/0). NaN propagates; a
    # +inf that is not read as empty gives lse +inf and a NaN out, as the float64 formula does.
    inv = tl.where(ssum == 0.0, 0.0, 1.0 / ssum)
    lse = tl.where(ssum == 0.0, float("-inf"), m_safe + tl.log(ssum))
    # Stored now, not after pass 3: frees its registers while the outs are loaded.
    z_rows = _lse_out_rows(b, s, h, S, HH, LSE_OUT_HT)
    tl.store(lse_out_ptr + z_rows, lse, mask=rmask)

    # Pass 3: the weighted sum of the outs, accumulated in float32.
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    for k in tl.static_range(K):
        w = tl.exp(_load_lse(lse_rows + k * s_lk64, rmask, POSINF_IS_EMPTY) - m_safe) * inv
        ptrs = in_rows[:, None] + k * s_ik64 + d[None, :]
        if SKIP_EMPTY_LOADS:
            o = tl.load(
                ptrs, mask=full & (w > 0.0)[:, None], other=0.0, eviction_policy="evict_first"
            )
            acc += w[:, None] * o.to(tl.float32)
        else:
            o = tl.load(ptrs, mask=full, other=0.0, eviction_policy="evict_first")
            acc += tl.where((w > 0.0)[:, None], w[:, None] * o.to(tl.float32), 0.0)
        if ACC_IN_OUT_DTYPE:
            acc = acc.to(out_ptr.dtype.element_ty).to(tl.float32)

    o_rows = ((b * S + s) * HH + h) * D
    tl.store(out_ptr + o_rows[:, None] + d[None, :], acc.to(out_ptr.dtype.element_ty), mask=full)


@triton.jit
def _pair_weights(a_lse_ptrs, b_lse_ptrs, rmask, POSINF_IS_EMPTY: tl.constexpr):
    """Weights (wa, wb) of two states and their merged lse, per row ([BLOCK_R] each)."""
    a = _load_lse(a_lse_ptrs, rmask, POSINF_IS_EMPTY)
    c = _load_lse(b_lse_ptrs, rmask, POSINF_IS_EMPTY)
    m = tl.maximum(a, c)
    m_safe = tl.where(tl.abs(m) == float("inf"), 0.0, m)
    ea = tl.exp(a - m_safe)
    ec = tl.exp(c - m_safe)
    ssum = ea + ec
    inv = tl.where(ssum == 0.0, 0.0, 1.0 / ssum)
    lse = tl.where(ssum == 0.0, float("-inf"), m_safe + tl.log(ssum))
    return ea * inv, ec * inv, lse


@triton.jit
def _pair_sum(a_ptrs, b_ptrs, wa, wb, full, SKIP_EMPTY_LOADS: tl.constexpr):
    """wa * A + wb * B in float32 ([BLOCK_R, BLOCK_D]); a state of weight 0 contributes 0."""
    if SKIP_EMPTY_LOADS:
        x = tl.load(a_ptrs, mask=full & (wa > 0.0)[:, None], other=0.0)
        y = tl.load(
            b_ptrs, mask=full & (wb > 0.0)[:, None], other=0.0, eviction_policy="evict_first"
        )
        res = wa[:, None] * x.to(tl.float32) + wb[:, None] * y.to(tl.float32)
    else:
        x = tl.load(a_ptrs, mask=full, other=0.0)
        y = tl.load(b_ptrs, mask=full, other=0.0, eviction_policy="evict_first")
        res = tl.where((wa > 0.0)[:, None], wa[:, None] * x.to(tl.float32), 0.0)
        res += tl.where((wb > 0.0)[:, None], wb[:, None] * y.to(tl.float32), 0.0)
    return res


@triton.jit
def _merge_pair_kernel(
    out_ptr,  # [B, S, Hh, D] result, out dtype, contiguous
    lse_out_ptr,  # [B, Hh, S] (LSE_OUT_HT) or [B, S, Hh] result, float32, contiguous
    outs_ptr,  # [2, B, S, Hh, D] states, any strides but D contiguous
    lses_ptr,  # [2, B, (S, Hh) in either order] float32, any strides
    S,
    HH,
    D,
    s_ik,
    s_ib,
    s_is,
    s_ih,  # outs strides (k, b, s, h)
    s_lk,
    s_lb,
    s_ls,
    s_lh,  # lses strides (k, b, s, h)
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EVEN_D: tl.constexpr,
    LSE_OUT_HT: tl.constexpr,
    POSINF_IS_EMPTY: tl.constexpr,
    SKIP_EMPTY_LOADS: tl.constexpr,
):
    """`_merge_states_kernel` at K = 2, same arguments less K: the two states' addresses are
    one set plus a stride, and the arithmetic that of the in-place step. Needs fewer registers
    per thread than the K-way kernel (sm_90, "hT": 32 against 45; the LSE is stored before the
    outs are loaded, which frees its registers), so more programs fit on an SM and more loads
    are in flight (research/NOTES-lse_merge.md, v5)."""
    b, s, h, rmask = _tile_rows(S, HH, BLOCK_T, BLOCK_H, BLOCK_R)
    d = tl.arange(0, BLOCK_D)
    full = _element_mask(rmask, d, D, EVEN_D)
    z_rows = _lse_out_rows(b, s, h, S, HH, LSE_OUT_HT)
    a_lse = lses_ptr + b * s_lb + s * s_ls + h * s_lh
    b_lse = lses_ptr + tl.cast(s_lk, tl.int64) + b * s_lb + s * s_ls + h * s_lh
    wa, wb, lse = _pair_weights(a_lse, b_lse, rmask, POSINF_IS_EMPTY)
    tl.store(lse_out_ptr + z_rows, lse, mask=rmask)
    rows = b * s_ib + s * s_is + h * s_ih
    a_ptrs = outs_ptr + rows[:, None] + d[None, :]
    b_ptrs = outs_ptr + tl.cast(s_ik, tl.int64) + rows[:, None] + d[None, :]
    res = _pair_sum(a_ptrs, b_ptrs, wa, wb, full, SKIP_EMPTY_LOADS)
    o_rows = ((b * S + s) * HH + h) * D
    tl.store(out_ptr + o_rows[:, None] + d[None, :], res.to(out_ptr.dtype.element_ty), mask=full)


@triton.jit
def _merge_state_inplace_kernel(
    out_ptr,  # [B, S, Hh, D] accumulator, read and written (out dtype)
    lse_ptr,  # accumulator lse, float32, read and written
    acc_ptr,  # [B, S, Hh, D] float32 accumulator (read instead of out) when HAS_ACC
    step_ptr,  # [B, S_STEP, Hh, D] new partial out
    step_lse_ptr,  # new partial lse, float32
    S_STEP,
    S_OFF,  # first accumulator position updated (S // 2 for a second-half update, else 0)
    HH,
    D,
    s_ob,
    s_os,
    s_oh,  # out strides (b, s, h)
    s_lb,
    s_ls,
    s_lh,  # lse strides
    s_ab,
    s_as,
    s_ah,  # acc strides
    s_pb,
    s_ps,
    s_ph,  # step out strides
    s_qb,
    s_qs,
    s_qh,  # step lse strides
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EVEN_D: tl.constexpr,
    POSINF_IS_EMPTY: tl.constexpr,
    HAS_ACC: tl.constexpr,
    SKIP_EMPTY_LOADS: tl.constexpr,
):
    b, s, h, rmask = _tile_rows(S_STEP, HH, BLOCK_T, BLOCK_H, BLOCK_R)
    sa = s + S_OFF  # position in the accumulator
    d = tl.arange(0, BLOCK_D)
    full = _element_mask(rmask, d, D, EVEN_D)
    lse_ptrs = lse_ptr + b * s_lb + sa * s_ls + h * s_lh
    q_ptrs = step_lse_ptr + b * s_qb + s * s_qs + h * s_qh
    wa, wb, lse = _pair_weights(lse_ptrs, q_ptrs, rmask, POSINF_IS_EMPTY)
    o_ptrs = out_ptr + (b * s_ob + sa * s_os + h * s_oh)[:, None] + d[None, :]
    p_ptrs = step_ptr + (b * s_pb + s * s_ps + h * s_ph)[:, None] + d[None, :]
    if HAS_ACC:
        prev_ptrs = acc_ptr + (b * s_ab + sa * s_as + h * s_ah)[:, None] + d[None, :]
    else:
        prev_ptrs = o_ptrs  # one set of addresses for the read and the write: fewer registers
    res = _pair_sum(prev_ptrs, p_ptrs, wa, wb, full, SKIP_EMPTY_LOADS)
    if HAS_ACC:
        tl.store(prev_ptrs, res, mask=full)
    tl.store(o_ptrs, res.to(out_ptr.dtype.element_ty), mask=full)
    tl.store(lse_ptrs, lse, mask=rmask)
