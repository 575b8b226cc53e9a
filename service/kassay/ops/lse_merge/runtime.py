"""lse_merge runtime: seeded inputs, the float64 reference and the lse layout helpers (see
`kassay.ops.lse_merge` for the op)."""

from __future__ import annotations

import math

import torch

from kassay.ops.base import CONDITIONING
from kassay.ops.lse_merge import LseMergeParams
from kassay.ops.runtime import Tensors, generator


def lse_to_th(lse: torch.Tensor, layout: str) -> torch.Tensor:
    """View lse [..., Hh, T] ("hT") or [..., T, Hh] ("Th") as [..., T, Hh]."""
    return lse.transpose(-1, -2) if layout == "hT" else lse


def th_to_layout(lse_th: torch.Tensor, layout: str) -> torch.Tensor:
    return lse_th.transpose(-1, -2).contiguous() if layout == "hT" else lse_th.contiguous()


def merge_float64(outs: torch.Tensor, lses_th: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 K-way merge with the max/log-sum form. outs [K, T, Hh, D], lses_th [K, T, Hh]
    (natural log; +inf and -inf both mean an empty state). Returns out [T, Hh, D] float64 and
    lse [T, Hh] float64 (-inf where every state is empty)."""
    lse = lses_th.double()
    lse = torch.where(torch.isposinf(lse), torch.full_like(lse, -torch.inf), lse)
    m = lse.max(dim=0).values
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp(lse - m_safe)  # exp(-inf) = 0: empty states weigh nothing
    s = w.sum(dim=0)
    lse_out = m_safe + torch.log(s)  # s = 0 -> -inf
    coef = torch.where(s > 0, w / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(w))
    out = (coef[..., None] * outs.double()).sum(dim=0)
    return out, lse_out


def make_inputs(params: LseMergeParams, regime: str, seed: int, device: torch.device) -> Tensors:
    """outs [K, T, Hh, D] in params.dtype; lses float32 [K, Hh, T] ("hT") or [K, T, Hh]."""
    p = params
    outs = torch.randn(p.K, p.T, p.Hh, p.D, generator=generator(seed, device, 1), device=device)
    lse = torch.randn(p.K, p.T, p.Hh, generator=generator(seed, device, 2), device=device)
    if regime == "huge":
        # A shared per-row magnitude up to 1e4 (either sign) plus a spread of a few units,
        # so states stay comparable: exp of any unshifted lse overflows even in float64.
        mag = torch.rand(p.T, p.Hh, generator=generator(seed, device, 3), device=device)
        sign = (
            torch.randint(0, 2, (p.T, p.Hh), generator=generator(seed, device, 4), device=device)
            * 2
            - 1
        )
        lse = lse * 3.0 + (sign * (1e3 + 9e3 * mag))[None]
    else:
        lse = lse * 2.0 + 3.0
    if regime in ("empty_rows", "fa2_inf"):
        mark = torch.inf if regime == "fa2_inf" else -torch.inf
        u = torch.rand(p.T, p.Hh, generator=generator(seed, device, 5), device=device)
        which = torch.randint(
            0, p.K, (p.T, p.Hh), generator=generator(seed, device, 6), device=device
        )
        one_empty = u < 0.2  # ~20% of rows: one state empty
        all_empty = u > 0.9  # ~10% of rows: every state empty
        k_idx = torch.arange(p.K, device=device)[:, None, None]
        empty = (one_empty[None] & (k_idx == which[None])) | all_empty[None]
        lse = torch.where(empty, torch.full_like(lse, mark), lse)
    lse = lse.float()
    lses = lse.transpose(-1, -2).contiguous() if p.lse_layout == "hT" else lse.contiguous()
    return {"outs": outs.to(p.torch_dtype), "lses": lses}


def reference(inputs: Tensors, params: LseMergeParams) -> Tensors:
    p = params
    outs, lses_th = inputs["outs"], lse_to_th(inputs["lses"], p.lse_layout)
    if p.mode == "step_second_half":
        # The first half is never touched by the updates: it stays state 0 exactly as given
        # (an empty row there keeps its stored out and its -inf/+inf mark).
        h = p.T // 2
        out = outs[0].double().clone()
        lse = lses_th[0].double().clone()
        o2, l2 = merge_float64(outs[:, h:], lses_th[:, h:])
        out[h:] = o2
        lse[h:] = l2
    else:
        out, lse = merge_float64(outs, lses_th)
    return {"out": out, "lse": th_to_layout(lse, p.lse_layout)}


#: the unit roundoff of the float32 lse every sound design keeps
_U32 = 2.0**-24


def conditioning(inputs: Tensors, params: LseMergeParams, ref: Tensors) -> dict[str, float]:
    """What a sound float32 design may lose on `out` to the lse's magnitude (Op.reference_noise,
    CONDITIONING): a weight formed as exp(lse_i - lse) with the merged lse rounded to float32
    (once per step in the step modes: K - 1 roundings that add in variance) is off by a factor
    1 + d, |d| ~ u |lse|, shared by the row; the subtraction lse_i - lse rounds once more, by
    u |lse_i - lse|. Per element of out, e = u (sqrt(K) |lse| sum_i c_i |out_i| +
    sum_i c_i |lse_i - lse| |out_i|), c_i the exact weights; in the huge regime (|lse| ~ 1e4)
    that is ~1e-3 relative, while exp(lse_i - max) / sum loses a few u. max_abs: max e;
    rel_l2: |e| / |out|."""
    p = params
    outs = inputs["outs"].double()
    lse = lse_to_th(inputs["lses"], p.lse_layout).double()
    lse = torch.where(torch.isposinf(lse), torch.full_like(lse, -torch.inf), lse)
    total = lse_to_th(ref["lse"], p.lse_layout)
    h = p.T // 2 if p.mode == "step_second_half" else 0
    outs, lse, total = outs[:, h:], lse[:, h:], total[h:]
    live = torch.isfinite(total)
    tot = torch.where(live, total, torch.zeros_like(total))
    c = torch.where(live[None], torch.exp(lse - tot[None]), torch.zeros_like(lse))  # [K, T, Hh]
    gap = torch.where(c > 0, (lse - tot[None]).abs(), torch.zeros_like(lse))
    mag = (c[..., None] * outs.abs()).sum(dim=0)  # [T, Hh, D]
    spread = (c * gap)[..., None].mul(outs.abs()).sum(dim=0)
    e = _U32 * (math.sqrt(p.K) * tot.abs()[..., None] * mag + spread)
    ref_out = ref["out"][h:]
    fin = torch.isfinite(ref_out)
    e = torch.where(fin & live[..., None], e, torch.zeros_like(e))
    norm = float(torch.where(fin, ref_out, torch.zeros_like(ref_out)).norm())
    return {
        CONDITIONING + "abs:out": float(e.max()) if e.numel() else 0.0,
        CONDITIONING + "rel:out": float(e.norm()) / norm if norm > 0 else 0.0,
    }
