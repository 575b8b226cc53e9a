"""K-way merge of partial attention states (softmax log-sum-exp correction) in one Triton
kernel: one program per block of (position, head) rows.

    lse = log(sum_k exp(lse_k)),   out = sum_k exp(lse_k - lse) * out_k   (natural log)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: rows per program: few programs keep the CPU interpreter quick, and a GPU busy at any T*Hh
BLOCK_ROWS = 64


@triton.jit
def _lse_at(lses_ptr, k, t, h, lse_sk, lse_st, lse_sh, rows_ok):
    """State k's lse of each row: an empty state (-inf, or +inf as FlashAttention-2 marks
    it) as -inf, which weighs nothing."""
    x = tl.load(lses_ptr + k * lse_sk + t * lse_st + h * lse_sh, mask=rows_ok, other=0.0)
    return tl.where(x == float("inf"), -float("inf"), x)


@triton.jit
def _merge_kernel(
    outs_ptr,  # [K, T, Hh, D], contiguous
    lses_ptr,  # [K, Hh, T] or [K, T, Hh] float32
    out_ptr,  # [T, Hh, D]
    lse_ptr,  # like one state of lses
    K,
    T,
    Hh,
    D,
    lse_sk,
    lse_st,
    lse_sh,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # t * Hh + h
    rows_ok = rows < T * Hh
    t = rows // Hh
    h = rows % Hh
    d = tl.arange(0, BLOCK_D)
    mask = rows_ok[:, None] & (d < D)[None, :]
    # The largest lse of a row keeps exp() in range; a row empty in every state stays empty.
    m = tl.full([BLOCK_R], -float("inf"), tl.float32)
    for k in range(K):
        m = tl.maximum(m, _lse_at(lses_ptr, k, t, h, lse_sk, lse_st, lse_sh, rows_ok))
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    total = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    for k in range(K):
        w = tl.exp(_lse_at(lses_ptr, k, t, h, lse_sk, lse_st, lse_sh, rows_ok) - m_safe)
        x = tl.load(outs_ptr + (k * T * Hh + rows)[:, None] * D + d[None, :], mask=mask, other=0.0)
        acc += w[:, None] * x.to(tl.float32)
        total += w
    scale = tl.where(total > 0.0, 1.0 / total, 0.0)
    out = (acc * scale[:, None]).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows[:, None] * D + d[None, :], out, mask=mask)
    tl.store(lse_ptr + t * lse_st + h * lse_sh, m_safe + tl.log(total), mask=rows_ok)


def merge_states(
    outs: torch.Tensor, lses: torch.Tensor, *, lse_layout: str = "hT"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge K partial states.

    outs: [K, T, Hh, D] (any float dtype); lses: [K, Hh, T] ("hT") or [K, T, Hh] ("Th"),
    float32, natural log (an empty state: -inf or +inf). Returns out [T, Hh, D] in the dtype
    of outs and lse in the layout of one state, float32.
    """
    K, T, Hh, D = outs.shape
    outs = outs.contiguous()
    lses = lses.contiguous().float()
    out = torch.empty((T, Hh, D), dtype=outs.dtype, device=outs.device)
    lse = torch.empty(lses.shape[1:], dtype=torch.float32, device=outs.device)
    if lse_layout == "hT":
        sk, sh, st = lses.stride()
    else:
        sk, st, sh = lses.stride()
    grid = (triton.cdiv(T * Hh, BLOCK_ROWS),)
    _merge_kernel[grid](
        outs,
        lses,
        out,
        lse,
        K,
        T,
        Hh,
        D,
        sk,
        st,
        sh,
        BLOCK_R=BLOCK_ROWS,
        BLOCK_D=triton.next_power_of_2(D),
    )
    return out, lse
