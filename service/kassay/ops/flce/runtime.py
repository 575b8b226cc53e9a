"""flce runtime: seeded inputs and the float64 reference (see `kassay.ops.flce` for the op)."""

from __future__ import annotations

import math
from typing import Any

import torch

from kassay.ops.base import CONDITIONING, SCALE_NOISE
from kassay.ops.flce import REF_CHUNK_BYTES, FlceParams
from kassay.ops.runtime import Tensors, generator

# Planted argmax hits (return_token_accuracy): the share of non-ignored rows whose target is set
# to the row's argmax, and how many times its worst-case rounding error a logit gap must exceed
# to decide a row. LOGIT_ROUNDOFF: unit roundoff u of the compute dtype, float32 counted as
# TF32's (a correct GPU impl may run its float32 matmuls on TF32 tensor cores).
PLANT_FRACTION = 0.5
TIE_MARGIN = 4.0
LOGIT_ROUNDOFF = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-11}


def make_inputs(params: FlceParams, regime: str, seed: int, device: torch.device) -> Tensors:
    """x [N, H], weight [V, H], bias [V] (when params.bias) in params.dtype; target [N]
    int64; grad_output: [] float32 (1.0) for mean/sum, [N] float32 for reduction none;
    ce_weight [V] float32 in [0.5, 3) when params.ce_weight (mean 1.75, so an impl that divides
    the mean by the row count instead of the sum of the targets' weights is off by ~1.75x).
    With params.return_token_accuracy the targets carry planted argmax hits (`plant_hits`);
    without it every input is what it was before that option existed, seed for seed."""
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
    if p.return_token_accuracy:
        plant_hits(inputs, p, seed)
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


def plant_hits(inputs: Tensors, params: FlceParams, seed: int) -> None:
    """Set about PLANT_FRACTION of the non-ignored targets to their row's argmax, in place, so
    that token_accuracy is far from 0 (random targets hit 1/V of the rows) and from 1.

    The logits are the reference's: float64 from the dtype-rounded x [N, H], weight [V, H] and
    bias [V], bias added, then softcapped (zc = c·tanh(z/c)). A row's hit or miss must not hang
    on rounding, so each gap that decides one is checked against the worst-case error an impl's
    logits carry in the compute dtype (the autocast dtype under AMP), u = LOGIT_ROUNDOFF, in
    units of u per column j:
        e_j = |z_j| + [float32: 2·|x|·|w_j|/sqrt(H)]   (the logit's rounding; TF32's operands)
        softcapped: e_j <- (1 - t_j^2)·(e_j + |z_j|) + 3·|zc_j|   (z/c, tanh, ·c roundings)
    A gap decides the row when it exceeds TIE_MARGIN·u·max_j e_j: twice the most that two
    columns' errors can move it (bfloat16, max |z| ~ 4.5, no softcap: 0.07).
    - Planted rows (target := argmax, the first maximal column) are drawn, seeded, among the
      non-ignored rows whose top-2 gap decides; where fewer rows qualify (bfloat16 with a
      softcap, whose tanh squeezes the top logits together: ~0.2 of the rows at V=3000), all
      are. A softcap that saturates the top logits (large_logits) leaves no row to plant.
    - Any other non-ignored row whose target's gap to the row maximum does not decide (a random
      hit, or a near miss a rounding could turn into a tie) gets the row's argmin: a sure miss.
    The other inputs (x, W, bias, ce_weight, grad_output, which rows are ignored) are unchanged.
    """
    p = params
    target = inputs["target"]
    valid = target != p.ignore_index
    n_valid = int(valid.sum())
    if n_valid == 0 or p.V < 2:  # nothing to plant; with one class every row is a hit
        return
    dev = target.device
    compute = p.autocast if p.autocast != "none" else p.dtype
    u = LOGIT_ROUNDOFF[compute]
    x64, w64 = inputs["x"].double(), inputs["weight"].double()
    b64 = inputs["bias"].double() if "bias" in inputs else None
    w_norm = w64.norm(dim=1) * (2 / math.sqrt(p.H)) if compute == "float32" else None
    rows = max(1, min(p.N, REF_CHUNK_BYTES // (3 * 8 * p.V)))
    top = torch.empty(p.N, dtype=torch.long, device=dev)
    low = torch.empty_like(top)
    top_gap = torch.empty(p.N, dtype=torch.float64, device=dev)  # max - runner-up
    tgt_gap = torch.empty_like(top_gap)  # max - target's logit
    low_gap = torch.empty_like(top_gap)  # max - min
    tol = torch.empty_like(top_gap)
    safe = torch.where(valid, target, torch.zeros_like(target))
    for s in range(0, p.N, rows):
        e = min(p.N, s + rows)
        z = x64[s:e] @ w64.T
        if b64 is not None:
            z += b64
        err = z.abs()
        if w_norm is not None:
            err.addr_(x64[s:e].norm(dim=1), w_norm)
        if p.softcap is not None:
            t = torch.tanh(z / p.softcap)
            err += z.abs()
            err *= 1 - t * t
            z = t.mul_(p.softcap)
            err.add_(z.abs(), alpha=3.0)
        tol[s:e] = TIE_MARGIN * u * err.amax(dim=1)
        top2 = z.topk(2, dim=1).values
        top[s:e] = z.argmax(dim=1)
        low[s:e] = z.argmin(dim=1)
        top_gap[s:e] = top2[:, 0] - top2[:, 1]
        tgt_gap[s:e] = top2[:, 0] - z.gather(1, safe[s:e, None])[:, 0]
        low_gap[s:e] = top2[:, 0] - z.amin(dim=1)
        del z, err
    eligible = valid & (top_gap > tol)
    order = torch.randperm(p.N, generator=generator(seed, dev, 8), device=dev)
    picks = order[eligible[order]][: round(PLANT_FRACTION * n_valid)]
    planted = torch.zeros_like(valid)
    planted[picks] = True
    undecided = valid & ~planted & (tgt_gap <= tol) & (low_gap > tol)
    target[planted] = top[planted]
    target[undecided] = low[undecided]


#: half the spacing of 16-bit floats relative to the value: the largest relative rounding error
#: of a logit written in that dtype (round to nearest)
_HALF_ULP = {"bfloat16": 2.0**-8, "float16": 2.0**-11}


def reference(
    inputs: Tensors,
    params: FlceParams,
    logits_dtype: torch.dtype | None = None,
    noise: dict[str, float] | None = None,
) -> Tensors:
    """Float64 loss and gradients, rows processed in chunks so memory stays bounded.

    logits_dtype: round the logits z = x @ W^T + b to this dtype (once, bias in, as eager's addmm
    and kassay's cuBLAS step write them into a 16-bit buffer) before the softcap and everything
    after, which stay float64: the truth for an impl whose only rounding that matters is its
    16-bit logits (`FlceOp.precision_reference`). None: the exact reference.

    With ce_weight c: row CE = (1-eps)·c[y]·(lse - z_y) + (eps/V)·Σ_j c_j·(lse - z_j) (torch's
    weighted cross_entropy), mean over Σ c[y] of the non-ignored rows; z-loss unweighted.
    With use_token_scaling: each row's loss (z-loss included) and gradient times p_y, held
    constant. token_accuracy: argmax (first maximal column) == target over non-ignored rows.

    noise: when given, filled with the rounding noise of the scalar loss (mean and sum, 16-bit
    compute dtypes): the standard deviation of the loss when every logit carries its own
    independent round-to-nearest error of the compute dtype, sigma^2 = sum_nv (dL/dz_nv z_nv)^2
    h^2 / 3 (h: half the relative spacing; errors uniform in +-h|z|), in the loss's units.
    Correct impls round the logits differently (once or twice, bias in or after, fp32 or
    16-bit adds), so their loss errors are partly independent draws of this size: a single
    draw of the baseline's is no limit for them (`kassay.validate.verdicts.effective_floor`).
    For reduction none it is filled instead with the noise of the gradients' fitted scale,
    under SCALE_NOISE + the output's name: an impl may round each row's grad_output to the
    compute dtype (Liger does), one relative error d_i per row, shared by the row's whole
    gradient. The fit out = (1 + s) ref then moves by s = sum_i d_i w_i / sum_i w_i, w_i the
    row's share of <ref, ref> (|grad_x_i|^2; |dz_i|^2 |x_i|^2 for grad_weight and |dz_i|^2 for
    grad_bias, cross-row terms left out), so sd(s) = h / sqrt(3) sqrt(sum w^2) / sum w: errors
    coherent along a row, which the bias check's independent-element noise does not cover."""
    p = params
    compute = p.autocast if p.autocast != "none" else p.dtype
    half16 = _HALF_ULP.get(compute) if noise is not None else None
    # the scalar loss's noise (mean, sum) or the gradients' scale noise (none): one or the other
    half_ulp = half16 if p.reduction != "none" else None
    scale_ulp = half16 if p.reduction == "none" else None
    x, w, target = inputs["x"], inputs["weight"], inputs["target"]
    bias = inputs.get("bias")
    cw = inputs["ce_weight"].double() if p.ce_weight else None
    go = inputs["grad_output"].double()
    dev = x.device
    noise_sq = torch.zeros((), dtype=torch.float64, device=dev)  # one host read, at the end
    # reduction none: per-row weights of the gradients' scale noise, sums of w and w^2 for
    # grad_input, grad_weight, grad_bias (see the docstring); one host read, at the end
    scale_w = torch.zeros(3, 2, dtype=torch.float64, device=dev) if scale_ulp else None
    w64 = w.double()
    b64 = bias.double() if bias is not None else None
    valid = target != p.ignore_index
    n_valid = int(valid.sum())
    eps = p.label_smoothing
    # the CE part's mean divisor: rows, or the sum of the non-ignored targets' class weights
    ce_div = float(n_valid)
    if cw is not None:
        ce_div = float(cw[torch.where(valid, target, 0)][valid].sum()) if n_valid else 0.0
    # the conditioning's bounds need a fourth [rows, V] buffer
    cond = _Conditioning(p, x, w64, cw, dev) if noise is not None else None
    rows = max(1, min(p.N, REF_CHUNK_BYTES // ((3 if cond is None else 4) * 8 * p.V)))

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
        if logits_dtype is not None:
            z = z.to(logits_dtype).double()
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
        coef = g * ((1 - eps) * c_y + (eps / p.V) * c_sum) + gz * 2 * p.z_loss_scale * lse
        if cond is not None:
            cond.chunk(s, e, prob, t if p.softcap is not None else None, lse, coef, gz, go)
        dz = prob
        dz *= coef[:, None]
        if cw is None:
            dz -= (g * eps / p.V)[:, None]
        else:
            dz.addr_(g * (eps / p.V), cw, alpha=-1)  # in place: no fourth buffer
        dz.scatter_add_(1, safe_t[:, None], (-(1 - eps) * c_y * g)[:, None])
        if p.softcap is not None:
            dz *= 1 - t * t
        grad_x[s:e] = dz @ w64
        if cond is not None:
            sc_y = (1 - t * t).gather(1, safe_t[:, None])[:, 0] if p.softcap is not None else one
            cond.grad_input(s, grad_x[s:e], safe_t, (1 - eps) * c_y * g * sc_y, g * eps / p.V)
        grad_w += dz.T @ xc
        if grad_b is not None:
            grad_b += dz.sum(dim=0)
        if scale_w is not None:
            # cross-row terms of grad_weight's and grad_bias's fit are left out: rows' logit
            # gradients are nearly orthogonal (different targets, spread softmax)
            dz2 = dz.square().sum(dim=1)
            for k, wk in enumerate(
                (grad_x[s:e].square().sum(dim=1), dz2 * xc.square().sum(dim=1), dz2)
            ):
                scale_w[k, 0] += wk.sum()
                scale_w[k, 1] += wk.square().sum()
        if half_ulp is not None:
            # dz is done with: sum (dz * z_pre)^2 in place, z_pre being the logits before the
            # softcap (cap * atanh(t); where t rounds to +-1 the derivative in dz is 0)
            if p.softcap is not None:
                torch.atanh(t, out=z)
                z.mul_(p.softcap)
            dz.mul_(z).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
            noise_sq += dz.square_().sum()
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
    if half_ulp is not None and noise is not None:
        scale = float(go.reshape(-1)[0]) if go.numel() else 0.0  # dz carries grad_output
        if scale != 0.0:
            noise["loss"] = math.sqrt(float(noise_sq) / 3.0) * half_ulp / abs(scale)
    if scale_w is not None and scale_ulp is not None and noise is not None:
        names = ("grad_input", "grad_weight", "grad_bias")[: 3 if grad_b is not None else 2]
        for name, (sw, sw2) in zip(names, scale_w.tolist(), strict=False):
            if sw > 0:
                noise[SCALE_NOISE + name] = scale_ulp / math.sqrt(3.0) * math.sqrt(sw2) / sw
    if p.return_z_loss:
        out["z_loss"] = reduce(row_z)
    if cond is not None and noise is not None:
        noise.update(cond.result(out, grad_x, grad_w, grad_b))
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


#: the unit roundoff of the float32 lse every sound design keeps
_U32 = 2.0**-24


class _Conditioning:
    """What a sound design loses to the lse's magnitude (Op.reference_noise, CONDITIONING).

    A softmax formed as exp(z - lse), the row's lse rounded to float32 (FlashAttention's
    backward; a loss written lse - z_y), scales the row's probabilities by 1 - d_n with
    |d_n| <= a_n = u |lse_n|: at |z| ~ 1e3 that is 6e-5, while exp(z - max) / sum and eager's
    log_softmax lose a few u. To first order every output moves along d(output)/d(lse_n), and
    with k_n = d(row loss)/d(lse_n) (the factor `coef` of the softmax in d(loss)/dz, grad_output
    and the reduction in it) and P = p * (1 - t^2) (the softcap's derivative):
    - grad_input row n: d_n k_n (P_n @ W), bounded by a_n |k_n P_n @ W|, where
      k_n P_n @ W = grad_input_n + the target's and the smoothing's terms (no extra GEMM);
    - grad_weight, grad_bias: sums over rows of independent d_n: per element two standard
      deviations, 2 sqrt(sum_n (a_n k_n P_nj)^2 / 3 x_nh^2) (max_abs bounded with the row's
      largest x^2);
    - loss: 2 sqrt(sum_n (a_n k_n)^2 / 3) (reduction none: a_n |k_n| per row), the z-loss
      likewise with its own factor.
    Accumulated chunk by chunk; `result` gives the (max_abs, rel_l2) per output."""

    def __init__(
        self,
        p: FlceParams,
        x: torch.Tensor,
        w64: torch.Tensor,
        cw: torch.Tensor | None,
        dev: torch.device,
    ) -> None:
        self.p, self.x, self.w64 = p, x, w64
        f64: dict[str, Any] = {"dtype": torch.float64, "device": dev}
        self.cw_w = (cw @ w64 if cw is not None else w64.sum(dim=0)) if p.label_smoothing else None
        self.gx_max = torch.zeros((), **f64)
        self.gx_sq = torch.zeros((), **f64)
        self.gw_vec = torch.zeros(p.V, **f64)  # sum_n A_n P^2 max_h x^2
        self.gw_sq = torch.zeros((), **f64)
        self.gb_vec = torch.zeros(p.V, **f64)  # sum_n A_n P^2
        self.loss_rows = torch.zeros(p.N, **f64)  # a_n k_n / grad_output (none) per row
        self.z_rows = torch.zeros(p.N, **f64)
        self._a = torch.zeros(p.N, **f64)  # a_n per row, for grad_input's bound

    def chunk(
        self,
        s: int,
        e: int,
        prob: torch.Tensor,
        t: torch.Tensor | None,
        lse: torch.Tensor,
        coef: torch.Tensor,
        gz: torch.Tensor,
        go: torch.Tensor,
    ) -> None:
        a = _U32 * lse.abs()
        self._a[s:e] = a
        scale = go.reshape(-1)[s:e] if go.numel() > 1 else go.reshape(-1)[0]
        safe_go = torch.where(scale != 0, scale, torch.ones_like(scale))
        self.loss_rows[s:e] = a * coef / safe_go
        self.z_rows[s:e] = a * gz * 2 * self.p.z_loss_scale * lse / safe_go
        p2 = prob * (1 - t * t) if t is not None else prob.clone()
        p2.square_()
        big_a = (a * coef).square_() / 3.0
        xc = self.x[s:e].double()
        x2 = xc.square()
        self.gb_vec += p2.T @ big_a
        self.gw_vec += p2.T @ (big_a * x2.amax(dim=1))
        self.gw_sq += 4.0 * (big_a * p2.sum(dim=1) * x2.sum(dim=1)).sum()
        del p2

    def grad_input(
        self,
        s: int,
        gx: torch.Tensor,
        safe_t: torch.Tensor,
        target_w: torch.Tensor,
        smooth_w: torch.Tensor,
    ) -> None:
        """gx [rows, H]: the grad_input of the chunk from row s (float64); k P @ W = gx +
        target_w W_y + smooth_w (c @ W)."""
        kpw = gx + target_w[:, None] * self.w64[safe_t]
        if self.cw_w is not None:
            kpw = kpw + smooth_w[:, None] * self.cw_w[None, :]
        b = self._a[s : s + gx.shape[0], None] * kpw.abs()
        self.gx_max = torch.maximum(self.gx_max, b.max())
        self.gx_sq += b.square().sum()

    def result(
        self,
        out: Tensors,
        grad_x: torch.Tensor,
        grad_w: torch.Tensor,
        grad_b: torch.Tensor | None,
    ) -> dict[str, float]:
        def pair(name: str, emax: torch.Tensor, esq: torch.Tensor, ref: torch.Tensor) -> None:
            norm = float(ref.norm())
            res[CONDITIONING + "abs:" + name] = float(emax)
            res[CONDITIONING + "rel:" + name] = float(esq.sqrt()) / norm if norm > 0 else 0.0

        res: dict[str, float] = {}
        for name, rows in (("loss", self.loss_rows), ("z_loss", self.z_rows)):
            if name not in out:
                continue
            if self.p.reduction == "none":
                r = rows.abs()
                pair(name, r.max() if r.numel() else r.sum(), r.square().sum(), out[name])
            else:
                sd2 = 4.0 * rows.square().sum() / 3.0
                pair(name, sd2.sqrt(), sd2, out[name])
        pair("grad_input", self.gx_max, self.gx_sq, grad_x)
        gw_max = 2.0 * self.gw_vec.max().sqrt() if self.gw_vec.numel() else self.gw_sq
        pair("grad_weight", gw_max, self.gw_sq, grad_w)
        if grad_b is not None:
            eb = 4.0 * self.gb_vec
            pair("grad_bias", eb.max().sqrt(), eb.sum(), grad_b)
        return res
