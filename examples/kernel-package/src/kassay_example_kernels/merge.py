"""K-way merge of partial attention states (softmax log-sum-exp correction) in one Triton
kernel: one program per (position, head) row.

    lse = log(sum_k exp(lse_k)),   out = sum_k exp(lse_k - lse) * out_k   (natural log)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # t * Hh + h
    t = row // Hh
    h = row % Hh
    d = tl.arange(0, BLOCK_D)
    mask = d < D
    # The largest lse of the row keeps exp() in range; a row empty in every state stays empty.
    m = -float("inf")
    for k in range(K):
        m = tl.maximum(m, tl.load(lses_ptr + k * lse_sk + t * lse_st + h * lse_sh))
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    total = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for k in range(K):
        w = tl.exp(tl.load(lses_ptr + k * lse_sk + t * lse_st + h * lse_sh) - m_safe)
        x = tl.load(outs_ptr + ((k * T + t) * Hh + h) * D + d, mask=mask, other=0.0)
        acc += w * x.to(tl.float32)
        total += w
    scale = tl.where(total > 0.0, 1.0 / total, 0.0)
    tl.store(out_ptr + (t * Hh + h) * D + d, (acc * scale).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(lse_ptr + t * lse_st + h * lse_sh, m_safe + tl.log(total))


def merge_states(
    outs: torch.Tensor, lses: torch.Tensor, *, lse_layout: str = "hT"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge K partial states.

    outs: [K, T, Hh, D] (any float dtype); lses: [K, Hh, T] ("hT") or [K, T, Hh] ("Th"),
    float32, natural log. Returns out [T, Hh, D] in the dtype of outs and lse in the layout of
    one state, float32.
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
    _merge_kernel[(T * Hh,)](
        outs, lses, out, lse, K, T, Hh, D, sk, st, sh, BLOCK_D=triton.next_power_of_2(D)
    )
    return out, lse
