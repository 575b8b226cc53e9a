"""Triton kernels for the attention-state merge (softmax log-sum-exp correction).

Only ``@triton.jit`` code and constexpr tuning live here; the launchers that check inputs,
allocate and launch are in :mod:`kassay.kernels.lse_merge`.

Every LSE is a natural logarithm. A state's weight is ``exp(lse_k - m) / sum_j exp(lse_j - m)``
with ``m`` the row's largest finite LSE, so no exponent is ever taken of an unshifted LSE and
``|lse|`` up to float32's range is safe. A row is addressed by (batch ``b``, sequence position
``s``, head ``h``); the kernels receive the strides of every tensor along those three axes, which
is all the layouts ("hT" = [..., Hh, S], "Th" = [..., S, Hh]) and non-contiguous views differ by.
The head dimension ``D`` must be contiguous (stride 1).

Grid: axis 0 walks blocks of ``BLOCK_R`` rows of one batch entry (row = s * Hh + h, or
h * S + s with ``HEAD_MAJOR``), axis 1 the batch entries. Row indices stay in int32 (the launcher checks ``S * Hh`` fits); everything that
multiplies a stride is int64.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Elements (rows x padded D) one program handles per state, and warps per program, by default.
# Chosen from the H200 sweep recorded in bench/NOTES-lse_merge.md.
DEFAULT_BLOCK_ELEMS = 4096
DEFAULT_NUM_WARPS = 4
# Skip loading a state's out row whose weight is zero (empty state): saves bandwidth on empty
# rows and keeps garbage (NaN) in an empty state's out from leaking into the result.
DEFAULT_SKIP_EMPTY_LOADS = True
# Row order inside a batch entry: False = (s, h) row-major like the outs, True = head-major.
DEFAULT_HEAD_MAJOR = False


@triton.jit
def _load_lse(ptrs, rmask, POSINF_IS_EMPTY: tl.constexpr):
    lse = tl.load(ptrs, mask=rmask, other=float("-inf")).to(tl.float32)
    if POSINF_IS_EMPTY:
        lse = tl.where(lse == float("inf"), float("-inf"), lse)
    return lse


@triton.jit
def _merge_states_kernel(
    out_ptr,  # [B, S, Hh, D] result, out dtype
    lse_out_ptr,  # result lse, float32, addressed by (b, s, h) strides
    outs_ptr,  # [K, B, S, Hh, D] states
    lses_ptr,  # [K, B, (S, Hh) in either order] float32
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
    s_ob,
    s_os,
    s_oh,  # out strides (b, s, h)
    s_zb,
    s_zs,
    s_zh,  # lse_out strides (b, s, h)
    K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EVEN_D: tl.constexpr,
    POSINF_IS_EMPTY: tl.constexpr,
    ACC_IN_OUT_DTYPE: tl.constexpr,
    SKIP_EMPTY_LOADS: tl.constexpr,
    HEAD_MAJOR: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < S * HH
    if HEAD_MAJOR:  # row = h * S + s: a block walks consecutive tokens of one head
        h = (rows // S).to(tl.int64)
        s = (rows % S).to(tl.int64)
    else:  # row = s * Hh + h: a block walks the heads of consecutive tokens
        s = (rows // HH).to(tl.int64)
        h = (rows % HH).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    if EVEN_D:  # noqa: SIM108 (a constexpr branch; only the taken one is compiled)
        # No column mask: keeps the mask constant along D so loads stay 16 bytes wide.
        full = rmask[:, None]
    else:
        full = rmask[:, None] & (d < D)[None, :]

    lse_rows = lses_ptr + pid_b * s_lb + s * s_ls + h * s_lh
    in_rows = outs_ptr + pid_b * s_ib + s * s_is + h * s_ih
    s_lk64 = tl.cast(s_lk, tl.int64)  # tl.cast: the arg may be specialised to a constexpr 1
    s_ik64 = tl.cast(s_ik, tl.int64)

    # Pass 1: the row maximum over the K states (empty states are -inf).
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    for k in tl.static_range(K):
        m = tl.maximum(m, _load_lse(lse_rows + k * s_lk64, rmask, POSINF_IS_EMPTY))
    m_safe = tl.where(tl.abs(m) == float("inf"), 0.0, m)

    # Pass 2: the shifted sum (each term in (0, 1], the largest exactly 1).
    ssum = tl.zeros([BLOCK_R], tl.float32)
    for k in tl.static_range(K):
        ssum += tl.exp(_load_lse(lse_rows + k * s_lk64, rmask, POSINF_IS_EMPTY) - m_safe)
    # All states empty -> sum 0 -> lse -inf and every weight 0 (never 0/0). NaN propagates; a
    # +inf that is not read as empty gives lse +inf and a NaN out, as the float64 formula does.
    inv = tl.where(ssum == 0.0, 0.0, 1.0 / ssum)
    lse = tl.where(ssum == 0.0, float("-inf"), m_safe + tl.log(ssum))

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

    o_ptrs = out_ptr + (pid_b * s_ob + s * s_os + h * s_oh)[:, None] + d[None, :]
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=full)
    tl.store(lse_out_ptr + pid_b * s_zb + s * s_zs + h * s_zh, lse, mask=rmask)


@triton.jit
def _merge_state_inplace_kernel(
    out_ptr,  # [B, S, Hh, D] accumulator, read and written (out dtype)
    lse_ptr,  # accumulator lse, float32, read and written
    acc_ptr,  # [B, S, Hh, D] float32 accumulator (read instead of out) when HAS_ACC
    step_ptr,  # [B, S, Hh, D] new partial out
    step_lse_ptr,  # new partial lse, float32
    S,
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
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EVEN_D: tl.constexpr,
    POSINF_IS_EMPTY: tl.constexpr,
    HAS_ACC: tl.constexpr,
    SKIP_EMPTY_LOADS: tl.constexpr,
    HEAD_MAJOR: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < S * HH
    if HEAD_MAJOR:  # row = h * S + s: a block walks consecutive tokens of one head
        h = (rows // S).to(tl.int64)
        s = (rows % S).to(tl.int64)
    else:  # row = s * Hh + h: a block walks the heads of consecutive tokens
        s = (rows // HH).to(tl.int64)
        h = (rows % HH).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    if EVEN_D:  # noqa: SIM108 (a constexpr branch; only the taken one is compiled)
        # No column mask: keeps the mask constant along D so loads stay 16 bytes wide.
        full = rmask[:, None]
    else:
        full = rmask[:, None] & (d < D)[None, :]

    lse_ptrs = lse_ptr + pid_b * s_lb + s * s_ls + h * s_lh
    a = _load_lse(lse_ptrs, rmask, POSINF_IS_EMPTY)
    b = _load_lse(step_lse_ptr + pid_b * s_qb + s * s_qs + h * s_qh, rmask, POSINF_IS_EMPTY)
    m = tl.maximum(a, b)
    m_safe = tl.where(tl.abs(m) == float("inf"), 0.0, m)
    ea = tl.exp(a - m_safe)
    eb = tl.exp(b - m_safe)
    ssum = ea + eb
    inv = tl.where(ssum == 0.0, 0.0, 1.0 / ssum)
    wa = ea * inv
    wb = eb * inv
    lse = tl.where(ssum == 0.0, float("-inf"), m_safe + tl.log(ssum))

    o_ptrs = out_ptr + (pid_b * s_ob + s * s_os + h * s_oh)[:, None] + d[None, :]
    p_ptrs = step_ptr + (pid_b * s_pb + s * s_ps + h * s_ph)[:, None] + d[None, :]
    if HAS_ACC:
        prev_ptrs = acc_ptr + (pid_b * s_ab + s * s_as + h * s_ah)[:, None] + d[None, :]
    else:
        prev_ptrs = o_ptrs
    if SKIP_EMPTY_LOADS:
        x = tl.load(prev_ptrs, mask=full & (wa > 0.0)[:, None], other=0.0)
        y = tl.load(
            p_ptrs, mask=full & (wb > 0.0)[:, None], other=0.0, eviction_policy="evict_first"
        )
        res = wa[:, None] * x.to(tl.float32) + wb[:, None] * y.to(tl.float32)
    else:
        x = tl.load(prev_ptrs, mask=full, other=0.0)
        y = tl.load(p_ptrs, mask=full, other=0.0, eviction_policy="evict_first")
        res = tl.where((wa > 0.0)[:, None], wa[:, None] * x.to(tl.float32), 0.0)
        res += tl.where((wb > 0.0)[:, None], wb[:, None] * y.to(tl.float32), 0.0)

    if HAS_ACC:
        tl.store(prev_ptrs, res, mask=full)
    tl.store(o_ptrs, res.to(out_ptr.dtype.element_ty), mask=full)
    tl.store(lse_ptrs, lse, mask=rmask)
