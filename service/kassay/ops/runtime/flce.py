"""flce runtime: seeded inputs and the float64 reference (see `kassay.ops.flce` for the op)."""

from __future__ import annotations

import math

import torch

from kassay.ops.flce import REF_CHUNK_BYTES, FlceParams
from kassay.ops.runtime.base import Tensors, generator


def make_inputs(params: FlceParams, regime: str, seed: int, device: torch.device) -> Tensors:
    """x [N, H], weight [V, H], bias [V] (when params.bias) in params.dtype; target [N]
    int64; grad_output: [] float32 (1.0) for mean/sum, [N] float32 for reduction none;
    ce_weight [V] float32 in [0.5, 3) when params.ce_weight (mean 1.75, so an impl that divides
    the mean by the row count instead of the sum of the targets' weights is off by ~1.75x)."""
    p = params
    dt = p.torch_dtype
    x = torch.randn(p.N, p.H, generator=generator(seed, device, 1), device=device)
    w_scale = 1.0 / math.sqrt(p.H)
    if regime == "large_logits":
        # |logits| reach ~1e3: std ~330 so the largest of N*V draws is near 3-4 sigma.
        w_scale *= 330.0
    w = torch.randn(p.V, p.H, generator=generator(seed, device, 2), device=device) * w_scale
    inputs: Tensors = {"x": x.to(dt), "weight": w.to(dt)}
    if p.bias:
        b = torch.randn(p.V, generator=generator(seed, device, 3), device=device) * 0.5
        inputs["bias"] = b.to(dt)
    target = torch.randint(0, p.V, (p.N,), generator=generator(seed, device, 4), device=device)
    if regime == "all_ignored":
        target.fill_(p.ignore_index)
    elif p.ignore_fraction > 0:
        n_ign = round(p.ignore_fraction * p.N)
        perm = torch.randperm(p.N, generator=generator(seed, device, 5), device=device)
        target[perm[:n_ign]] = p.ignore_index
    inputs["target"] = target
    if p.ce_weight:
        u = torch.rand(p.V, generator=generator(seed, device, 7), device=device)
        inputs["ce_weight"] = u.mul_(2.5).add_(0.5)
    if p.reduction == "none":
        inputs["grad_output"] = torch.rand(
            p.N, generator=generator(seed, device, 6), device=device
        ).add_(0.5)
    else:
        inputs["grad_output"] = torch.ones((), device=device)
    return inputs


def reference(inputs: Tensors, params: FlceParams) -> Tensors:
    """Float64 loss and gradients, rows processed in chunks so memory stays bounded.

    With ce_weight c: row CE = (1-eps)·c[y]·(lse - z_y) + (eps/V)·Σ_j c_j·(lse - z_j) (torch's
    weighted cross_entropy), mean over Σ c[y] of the non-ignored rows; z-loss unweighted.
    With use_token_scaling: each row's loss (z-loss included) and gradient times p_y, held
    constant. token_accuracy: argmax (first maximal column) == target over non-ignored rows."""
    p = params
    x, w, target = inputs["x"], inputs["weight"], inputs["target"]
    bias = inputs.get("bias")
    cw = inputs["ce_weight"].double() if p.ce_weight else None
    go = inputs["grad_output"].double()
    dev = x.device
    w64 = w.double()
    b64 = bias.double() if bias is not None else None
    valid = target != p.ignore_index
    n_valid = int(valid.sum())
    eps = p.label_smoothing
    # the CE part's mean divisor: rows, or the sum of the non-ignored targets' class weights
    ce_div = float(n_valid)
    if cw is not None:
        ce_div = float(cw[torch.where(valid, target, 0)][valid].sum()) if n_valid else 0.0
    rows = max(1, min(p.N, REF_CHUNK_BYTES // (3 * 8 * p.V)))

    row_loss = torch.zeros(p.N, dtype=torch.float64, device=dev)
    row_z = torch.zeros(p.N, dtype=torch.float64, device=dev)
    grad_x = torch.empty(p.N, p.H, dtype=torch.float64, device=dev)
    grad_w = torch.zeros(p.V, p.H, dtype=torch.float64, device=dev)
    grad_b = torch.zeros(p.V, dtype=torch.float64, device=dev) if bias is not None else None
    hits = torch.zeros(p.N, dtype=torch.float64, device=dev)
    row_ce = torch.zeros(p.N, dtype=torch.float64, device=dev)
    if p.reduction == "mean":
        row_scale = (
            torch.full((p.N,), 1.0 / n_valid if n_valid else 0.0, dtype=torch.float64, device=dev)
            * go
        )
        ce_scale = torch.full(
            (p.N,), 1.0 / ce_div if ce_div != 0 else 0.0, dtype=torch.float64, device=dev
        )
        ce_scale = ce_scale * go
    elif p.reduction == "sum":
        row_scale = torch.ones(p.N, dtype=torch.float64, device=dev) * go
        ce_scale = row_scale
    else:
        row_scale = go.expand(p.N).clone()
        ce_scale = row_scale

    for s in range(0, p.N, rows):
        e = min(p.N, s + rows)
        xc = x[s:e].double()
        z = xc @ w64.T
        if b64 is not None:
            z += b64
        if p.softcap is not None:
            t = torch.tanh(z / p.softcap)
            z = p.softcap * t
        lse = torch.logsumexp(z, dim=1)
        tc = target[s:e]
        vc = valid[s:e]
        safe_t = torch.where(vc, tc, torch.zeros_like(tc))
        z_y = z.gather(1, safe_t[:, None])[:, 0]
        zl = p.z_loss_scale * lse * lse
        prob = torch.softmax(z, dim=1)
        hits[s:e] = ((z.argmax(dim=1) == tc) & vc).double()
        one = torch.ones_like(lse)
        ts = prob.gather(1, safe_t[:, None])[:, 0] if p.use_token_scaling else one
        if cw is None:
            c_y, c_sum = one, float(p.V)
            ce = (1 - eps) * (lse - z_y) + eps * (lse - z.mean(dim=1))
        else:
            c_y, c_sum = cw[safe_t], float(cw.sum())
            ce = (1 - eps) * c_y * (lse - z_y) + (eps / p.V) * (c_sum * lse - z @ cw)
        ce, zl = ce * ts, zl * ts
        row_loss[s:e] = torch.where(vc, ce + zl, torch.zeros_like(ce))
        row_ce[s:e] = torch.where(vc, ce, torch.zeros_like(ce))
        row_z[s:e] = torch.where(vc, zl, torch.zeros_like(zl))
        # d(row loss)/dz, the CE part scaled by g (ce_scale), the z-loss part by gz (row_scale):
        # g·[((1-eps) c_y + (eps/V) Σc) softmax - (eps/V) c - (1-eps) c_y onehot] + gz·2 s lse softmax
        # (unweighted: c = 1), times the token scale ts; three [rows, V] buffers: z, prob, dz
        g = ce_scale[s:e] * vc.double() * ts
        gz = row_scale[s:e] * vc.double() * ts
        dz = prob
        dz *= (g * ((1 - eps) * c_y + (eps / p.V) * c_sum) + gz * 2 * p.z_loss_scale * lse)[:, None]
        if cw is None:
            dz -= (g * eps / p.V)[:, None]
        else:
            dz.addr_(g * (eps / p.V), cw, alpha=-1)  # in place: no fourth buffer
        dz.scatter_add_(1, safe_t[:, None], (-(1 - eps) * c_y * g)[:, None])
        if p.softcap is not None:
            dz *= 1 - t * t
        grad_x[s:e] = dz @ w64
        grad_w += dz.T @ xc
        if grad_b is not None:
            grad_b += dz.sum(dim=0)
        del z, prob, dz

    def reduce(v: torch.Tensor) -> torch.Tensor:
        if p.reduction == "none":
            return v
        total = v.sum()
        if p.reduction == "mean":
            return total / n_valid if n_valid else torch.zeros((), dtype=v.dtype, device=dev)
        return total

    if cw is not None and p.reduction == "mean":
        ce_mean = (
            row_ce.sum() / ce_div
            if ce_div != 0
            else torch.zeros((), dtype=torch.float64, device=dev)
        )
        loss = ce_mean + reduce(row_z)
    else:
        loss = reduce(row_loss)
    out: Tensors = {"loss": loss}
    if p.return_z_loss:
        out["z_loss"] = reduce(row_z)
    if p.return_token_accuracy:
        if p.reduction == "none":
            out["token_accuracy"] = hits
        else:  # a fraction for mean and sum alike (Liger's definition), 0 when all ignored
            out["token_accuracy"] = hits.sum() / max(n_valid, 1)
    out["grad_input"] = grad_x
    out["grad_weight"] = grad_w
    if grad_b is not None:
        out["grad_bias"] = grad_b
    return out
