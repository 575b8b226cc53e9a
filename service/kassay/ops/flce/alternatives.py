"""Correct flce impls written differently from torch: the fairness corpus.

Every design here is one a reviewer accepts; none may fail a verdict. They differ from eager
PyTorch where sound kernels differ from it:

- `alt_max_sum`: logits in the compute dtype as eager's addmm writes them, an explicit backward
  with the softmax as exp(z - max) / sum.
- `alt_exp_lse`: the same with FlashAttention's exp(z - lse) in the backward (the lse read back
  from the forward): it loses about log2|z| bits at large logits in float32.
- `alt_log_softmax`: autograd through log_softmax and a hand-written smoothed NLL.
- `alt_fp32_logits`: 16-bit operands upcast before the matmul, so logits, softmax and the
  gradient GEMMs stay float32 (a float32-accumulating kernel that never writes 16-bit logits):
  more exact than eager in bfloat16/float16 and under AMP.
- `alt_float64`: the whole op in float64, gradients rounded once to the parameters' dtype.
- `alt_chunked`: rows in 8 chunks (Liger's shape): logits per chunk in the compute dtype,
  gradients computed chunk by chunk, grad_weight accumulated in float32 across chunks.
- `alt_chunked_kahan`: float32 logits per chunk, exp(z - lse), grad_weight and grad_bias
  accumulated across chunks with Kahan compensation.

All share one row-wise math (`_rows_forward`, `_dlogits`) that implements every option of the
op (softcap, z-loss, label smoothing, class weights, token scaling, token accuracy, reductions).
Registered with kind "alternative": offered only where mutants are (`kassay selftest`, tests).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from kassay.ops.flce import FlceParams
from kassay.ops.flce import harness as flce_harness
from kassay.ops.flce.baseline import _mean_divisor, _safe_div
from kassay.ops.registry import Impl, register

CHUNKS = 8


class _Design:
    """How one alternative computes: logits dtype ("compute": the compute dtype as eager;
    "float32"; "float64"), the backward's softmax formula ("max_sum" | "exp_lse"), row chunks
    and Kahan-compensated accumulation across them."""

    def __init__(self, logits: str, formula: str, chunks: int = 1, kahan: bool = False) -> None:
        self.logits, self.formula, self.chunks, self.kahan = logits, formula, chunks, kahan

    def work_dtype(self) -> torch.dtype:
        return torch.float64 if self.logits == "float64" else torch.float32

    def logits_of(
        self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, p: FlceParams
    ) -> torch.Tensor:
        """z [rows, V] in the work dtype, from x [rows, H], w [V, H], b [V]."""
        if self.logits == "compute":
            cd = p.compute_dtype
            xc, wc = x.to(cd), w.to(cd)
            z = torch.addmm(b.to(cd), xc, wc.T) if b is not None else xc @ wc.T
            return z.float()
        wd = self.work_dtype()
        z = x.to(wd) @ w.to(wd).T
        return z + b.to(wd) if b is not None else z

    def gemm_dtype(self, p: FlceParams) -> torch.dtype:
        """dtype of the gradient GEMMs' operands (eager rounds dlogits to the compute dtype)."""
        return p.compute_dtype if self.logits == "compute" else self.work_dtype()


def _rows_forward(
    zpre: torch.Tensor,
    target: torch.Tensor,
    valid: torch.Tensor,
    cw: torch.Tensor | None,
    p: FlceParams,
) -> dict[str, torch.Tensor]:
    """Per-row CE, z-loss, token scale and argmax hits of logits zpre [rows, V] (work dtype)."""
    z = p.softcap * torch.tanh(zpre / p.softcap) if p.softcap is not None else zpre
    m = z.amax(dim=1)
    lse = m + torch.log(torch.exp(z - m[:, None]).sum(dim=1))
    safe = torch.where(valid, target, torch.zeros_like(target))
    z_y = z.gather(1, safe[:, None])[:, 0]
    eps = p.label_smoothing
    if cw is None:
        c_y = torch.ones_like(lse)
        smooth = lse - z.mean(dim=1)
    else:
        c = cw.to(z.dtype)
        c_y = c[safe]
        smooth = (c.sum() * lse - z @ c) / p.V
    ce = (1 - eps) * c_y * (lse - z_y) + eps * smooth
    zl = p.z_loss_scale * lse * lse
    ts = torch.exp(z_y - lse) if p.use_token_scaling else torch.ones_like(lse)
    vf = valid.to(z.dtype)
    return {
        "z": z,
        "lse": lse,
        "m": m,
        "ce": ce * ts * vf,
        "zl": zl * ts * vf,
        "ts": ts,
        "c_y": c_y,
        "hits": ((z.argmax(dim=1) == target) & valid).float(),
    }


def _dlogits(
    zpre: torch.Tensor,
    f: dict[str, torch.Tensor],
    target: torch.Tensor,
    valid: torch.Tensor,
    cw: torch.Tensor | None,
    g_ce: torch.Tensor,
    g_zl: torch.Tensor,
    p: FlceParams,
    formula: str,
) -> torch.Tensor:
    """d(loss)/d(zpre) [rows, V] given the upstream gradients of the rows' CE and z-loss (the
    token scale held constant, as the op defines it)."""
    z, lse = f["z"], f["lse"]
    if formula == "exp_lse":
        prob = torch.exp(z - lse[:, None])
    else:
        e = torch.exp(z - f["m"][:, None])
        prob = e / e.sum(dim=1, keepdim=True)
    eps = p.label_smoothing
    vf = valid.to(z.dtype) * f["ts"]
    g = g_ce * vf
    gz = g_zl * vf
    c_sum = float(p.V) if cw is None else cw.to(z.dtype).sum()
    c_y = f["c_y"]
    dz = (
        prob
        * (g * ((1 - eps) * c_y + (eps / p.V) * c_sum) + gz * 2 * p.z_loss_scale * lse)[:, None]
    )
    if cw is None:
        dz = dz - (g * eps / p.V)[:, None]
    else:
        dz = dz - (g * eps / p.V)[:, None] * cw.to(z.dtype)[None, :]
    safe = torch.where(valid, target, torch.zeros_like(target))
    dz = dz.scatter_add(1, safe[:, None], (-(1 - eps) * c_y * g)[:, None])
    if p.softcap is not None:
        t = z / p.softcap
        dz = dz * (1 - t * t)
    return dz


class _Kahan:
    """A float32 (or work-dtype) running sum with Kahan compensation, or a plain one."""

    def __init__(self, like: torch.Tensor, kahan: bool) -> None:
        self.s = torch.zeros_like(like)
        self.c = torch.zeros_like(like) if kahan else None

    def add(self, v: torch.Tensor) -> None:
        if self.c is None:
            self.s += v
            return
        y = v - self.c
        t = self.s + y
        self.c = (t - self.s) - y
        self.s = t


class _FlceFn(torch.autograd.Function):
    """Forward: per-row CE and z-loss without keeping logits; backward: recompute them chunk by
    chunk and form every gradient with the design's formula and accumulation."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        w: torch.Tensor,
        b: torch.Tensor | None,
        target: torch.Tensor,
        cw: torch.Tensor | None,
        p: FlceParams,
        design: _Design,
    ) -> tuple[torch.Tensor, ...]:
        valid = target != p.ignore_index
        n = x.shape[0]
        step = max(1, math.ceil(n / design.chunks))
        parts: dict[str, list[torch.Tensor]] = {"ce": [], "zl": [], "hits": []}
        for s in range(0, n, step):
            e = min(n, s + step)
            with torch.no_grad():
                f = _rows_forward(design.logits_of(x[s:e], w, b, p), target[s:e], valid[s:e], cw, p)
            for k in parts:
                parts[k].append(f[k])
        ce, zl, hits = (torch.cat(parts[k]) for k in ("ce", "zl", "hits"))
        ctx.save_for_backward(x, w, b, target, cw)
        ctx.p, ctx.design = p, design
        ctx.mark_non_differentiable(hits)
        return ce, zl, hits

    @staticmethod
    def backward(ctx: Any, g_ce: torch.Tensor, g_zl: torch.Tensor, _g_hits: Any) -> Any:
        x, w, b, target, cw = ctx.saved_tensors
        p: FlceParams = ctx.p
        design: _Design = ctx.design
        valid = target != p.ignore_index
        n = x.shape[0]
        step = max(1, math.ceil(n / design.chunks))
        wd = design.work_dtype()
        gd = design.gemm_dtype(p)
        gx = torch.empty(x.shape, dtype=wd, device=x.device)
        gw = _Kahan(torch.zeros(w.shape, dtype=wd, device=w.device), design.kahan)
        gb = _Kahan(torch.zeros(w.shape[0], dtype=wd, device=w.device), design.kahan)
        g_ce = g_ce.to(wd)
        g_zl = g_zl.to(wd)
        for s in range(0, n, step):
            e = min(n, s + step)
            zpre = design.logits_of(x[s:e], w, b, p)
            f = _rows_forward(zpre, target[s:e], valid[s:e], cw, p)
            dz = _dlogits(
                zpre, f, target[s:e], valid[s:e], cw, g_ce[s:e], g_zl[s:e], p, design.formula
            )
            dzg = dz.to(gd)
            gx[s:e] = (dzg @ w.to(gd)).to(wd)
            gw.add((dzg.T @ x[s:e].to(gd)).to(wd))
            gb.add(dz.sum(dim=0))
        return (
            gx.to(x.dtype),
            gw.s.to(w.dtype),
            gb.s.to(b.dtype) if b is not None else None,
            None,
            None,
            None,
            None,
        )


def _reduce(
    ce: torch.Tensor,
    zl: torch.Tensor,
    hits: torch.Tensor,
    target: torch.Tensor,
    valid: torch.Tensor,
    ce_weight: torch.Tensor | None,
    p: FlceParams,
) -> Any:
    """Rows' CE [N], z-loss [N] and argmax hits [N] reduced as the op defines (mean: CE over
    the non-ignored rows or their classes' weights, z-loss over the rows, 0/0 = 0); the loss_fn
    result the harness takes."""
    if p.reduction == "none":
        loss, z_loss, acc = ce + zl, zl, hits
    else:
        n_valid = valid.sum().float()
        acc = _safe_div(hits.sum(), n_valid)
        if p.reduction == "sum":
            loss, z_loss = ce.sum() + zl.sum(), zl.sum()
        else:
            cw = ce_weight.float() if ce_weight is not None else None
            z_loss = _safe_div(zl.sum(), n_valid)
            loss = _safe_div(ce.sum(), _mean_divisor(target, valid, cw)) + z_loss
    loss, z_loss = loss.float(), z_loss.float()
    if p.return_token_accuracy:
        return loss, z_loss, acc
    return (loss, z_loss) if p.return_z_loss else loss


def _loss_fn(design: _Design) -> Any:
    def loss_fn(
        x: torch.Tensor,
        w: torch.Tensor,
        target: torch.Tensor,
        b: torch.Tensor | None,
        p: FlceParams,
        ce_weight: torch.Tensor | None = None,
    ) -> Any:
        # the design decides every dtype: autocast's own casts are not wanted inside
        with torch.autocast(x.device.type, enabled=False):
            ce, zl, hits = _FlceFn.apply(x, w, b, target, ce_weight, p, design)
            return _reduce(ce, zl, hits, target, target != p.ignore_index, ce_weight, p)

    return loss_fn


def _log_softmax_loss(
    x: torch.Tensor,
    w: torch.Tensor,
    target: torch.Tensor,
    b: torch.Tensor | None,
    p: FlceParams,
    ce_weight: torch.Tensor | None = None,
) -> Any:
    """Autograd through log_softmax: CE = -(1 - eps) c_y logp_y - (eps / V) sum_j c_j logp_j."""
    z = F.linear(x, w, b).float()
    if p.softcap is not None:
        z = p.softcap * torch.tanh(z / p.softcap)
    logp = F.log_softmax(z, dim=-1)
    valid = target != p.ignore_index
    safe = torch.where(valid, target, torch.zeros_like(target))
    eps = p.label_smoothing
    c = ce_weight.float() if ce_weight is not None else torch.ones(p.V, device=z.device)
    c_y = c[safe]
    ce = -(1 - eps) * c_y * logp.gather(1, safe[:, None])[:, 0] - (eps / p.V) * (logp @ c)
    lse = torch.logsumexp(z, dim=-1)
    zl = p.z_loss_scale * lse * lse
    if p.use_token_scaling:
        ts = logp.gather(1, safe[:, None])[:, 0].exp().detach()
        ce, zl = ce * ts, zl * ts
    vf = valid.float()
    hits = ((z.detach().argmax(dim=-1) == target) & valid).float()
    return _reduce(ce * vf, zl * vf, hits, target, valid, ce_weight, p)


DESIGNS: dict[str, tuple[_Design, str]] = {
    "alt_max_sum": (_Design("compute", "max_sum"), "eager logits, exp(z - max) / sum backward"),
    "alt_exp_lse": (_Design("compute", "exp_lse"), "eager logits, exp(z - lse) backward"),
    "alt_fp32_logits": (
        _Design("float32", "max_sum"),
        "operands upcast: float32 logits and gradient GEMMs",
    ),
    "alt_float64": (_Design("float64", "max_sum"), "the whole op in float64"),
    "alt_chunked": (
        _Design("compute", "max_sum", chunks=CHUNKS),
        f"{CHUNKS} row chunks, float32 grad_weight accumulation",
    ),
    "alt_chunked_kahan": (
        _Design("float32", "exp_lse", chunks=CHUNKS, kahan=True),
        f"{CHUNKS} row chunks of float32 logits, exp(z - lse), Kahan-summed grad_weight",
    ),
}

for _name, (_design, _desc) in DESIGNS.items():
    register(
        Impl(
            "flce",
            _name,
            flce_harness.as_run(_loss_fn(_design)),
            f"correct alternative: {_desc}",
            kind="alternative",
        ),
        replace=True,
    )

register(
    Impl(
        "flce",
        "alt_log_softmax",
        flce_harness.as_run(_log_softmax_loss),
        "correct alternative: autograd through log_softmax and a smoothed NLL",
        kind="alternative",
    ),
    replace=True,
)
