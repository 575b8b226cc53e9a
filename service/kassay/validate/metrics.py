"""Error metrics of one output against its float64 reference.

Every figure is computed in float64 in chunks of the flattened tensors, so a [V, H] gradient of
half a billion elements needs no full-size float64 copy beyond the reference itself.

- max_abs: max |out - ref| over elements where both are finite.
- max_rel: max |out - ref| / max(|ref|, floor) with floor = 1e-3 * rms(ref): relative error
  that near-zero references cannot blow up.
- rel_l2: ||out - ref|| / ||ref|| (finite elements; 0 when both are all zero).
- max_ulp: largest distance, in units in the last place of the output dtype, between out and
  ref rounded to that dtype.
- nan / inf: counts in the output; ref_nan / ref_inf: counts in the reference. Equal infinities
  (out and ref both +inf or both -inf) count as exact.
- worst: the few elements with the largest |out - ref| (or non-finite mismatches first).
- bias: s of the least-squares fit out ~ (1 + s) * ref over elements where both are finite,
  s = <out - ref, ref> / <ref, ref>: a systematic scale, which random rounding errors leave
  near 0 (their s shrinks like rel_l2 / sqrt(n_finite)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

_CHUNK = 1 << 24  # elements per chunk (128 MiB of float64)
_INT_VIEW = {
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.float64: torch.int64,
}


@dataclass
class RawMetrics:
    max_abs: float = 0.0
    max_rel: float = 0.0
    rel_l2: float = 0.0
    max_ulp: float = 0.0
    nan: int = 0
    inf: int = 0
    ref_nan: int = 0
    ref_inf: int = 0
    mismatched_nonfinite: int = 0  # out non-finite where ref is finite, or differing infinities
    nonfinite_where_finite: int = 0  # of which: out NaN/Inf, ref finite
    finite_where_inf: int = 0  # of which: out finite, ref +-inf
    n_bad: int = 0
    all_zero: bool = False
    ref_all_zero: bool = False
    bias: float = 0.0
    n_finite: int = 0  # elements where both out and ref are finite
    worst: list[tuple[list[int], float, float, float]] = field(default_factory=list)


def ordered_int(t: torch.Tensor) -> torch.Tensor:
    """Map floats to int64 whose order and spacing follow the floats' (one step = one ULP):
    IEEE floats are sign-magnitude, so negative values become minus their magnitude bits."""
    bits = t.contiguous().view(_INT_VIEW[t.dtype]).to(torch.int64)  # sign-extended
    mag = bits & ((1 << (t.element_size() * 8 - 1)) - 1)
    return torch.where(bits < 0, -mag, mag)


def rounding_error(ref: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    """The tolerance's rounding floor: (max_abs, rel_l2) error that storing the reference in
    `dtype` costs, never less than one ULP at the largest magnitude (for max_abs) and
    eps / sqrt(numel) (for rel_l2). The realized rounding of a few elements can be zero by luck;
    that of many elements is a stable estimate, so the bounds only matter for small outputs
    such as a scalar loss."""
    max_abs = 0.0
    d2 = 0.0
    r2 = 0.0
    peak = 0.0
    flat = ref.reshape(-1)
    for s in range(0, flat.numel(), _CHUNK):
        r = flat[s : s + _CHUNK]
        fin = torch.isfinite(r)
        r = torch.where(fin, r, torch.zeros_like(r))
        d = (r.to(dtype).double() - r).abs()
        d = torch.where(torch.isfinite(d), d, torch.zeros_like(d))
        if d.numel():
            max_abs = max(max_abs, float(d.max()))
            peak = max(peak, float(r.abs().max()))
        d2 += float((d * d).sum())
        r2 += float((r * r).sum())
    eps = torch.finfo(dtype).eps
    one_ulp = eps * 2.0 ** math.floor(math.log2(peak)) if peak > 0 else 0.0
    rel = (d2**0.5 / r2**0.5) if r2 > 0 else 0.0
    return max(max_abs, one_ulp), max(rel, eps / max(flat.numel(), 1) ** 0.5)


def compare(
    out: torch.Tensor, ref: torch.Tensor, *, atol: float, rtol: float, n_worst: int = 5
) -> RawMetrics:
    """Metrics of `out` (any float dtype) against `ref` (float64, same shape)."""
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(
            f"shape {tuple(out.shape)} differs from the reference's {tuple(ref.shape)}"
        )
    m = RawMetrics()
    o_flat = out.detach().reshape(-1)
    r_flat = ref.detach().reshape(-1).to(out.device)
    n = o_flat.numel()
    # First pass: norms and the rms of the reference (the max_rel floor).
    r2 = 0.0
    for s in range(0, n, _CHUNK):
        r = r_flat[s : s + _CHUNK]
        rf = torch.where(torch.isfinite(r), r, torch.zeros_like(r))
        r2 += float((rf * rf).sum())
    rms = (r2 / max(n, 1)) ** 0.5
    rel_floor = max(1e-3 * rms, 1e-300)
    d2 = 0.0
    er = 0.0  # <out - ref, ref> and <ref, ref> over both-finite elements: the bias fit
    ref_sq = 0.0
    any_nonzero = False
    ref_nonzero = False
    cand: list[tuple[float, int, float, float]] = []
    ulp_ok = out.dtype in _INT_VIEW
    for s in range(0, n, _CHUNK):
        o = o_flat[s : s + _CHUNK]
        r = r_flat[s : s + _CHUNK]
        o64 = o.double()
        o_fin, r_fin = torch.isfinite(o64), torch.isfinite(r)
        m.nan += int(torch.isnan(o64).sum())
        m.inf += int(torch.isinf(o64).sum())
        m.ref_nan += int(torch.isnan(r).sum())
        m.ref_inf += int(torch.isinf(r).sum())
        same_inf = torch.isinf(o64) & torch.isinf(r) & (o64 == r)
        both_nan = torch.isnan(o64) & torch.isnan(r)
        mismatch = ~(o_fin & r_fin) & ~same_inf & ~both_nan
        m.mismatched_nonfinite += int(mismatch.sum())
        m.nonfinite_where_finite += int((~o_fin & r_fin).sum())
        m.finite_where_inf += int((o_fin & torch.isinf(r)).sum())
        both = o_fin & r_fin
        any_nonzero = any_nonzero or bool((o64[both] != 0).any())
        ref_nonzero = ref_nonzero or bool((r[r_fin] != 0).any())
        d = torch.where(both, (o64 - r).abs(), torch.zeros_like(r))
        if d.numel():
            m.max_abs = max(m.max_abs, float(d.max()))
            rel = d / torch.clamp(r.abs(), min=rel_floor)
            m.max_rel = max(m.max_rel, float(rel.max()))
        d2 += float((d * d).sum())
        r_both = torch.where(both, r, torch.zeros_like(r))
        er += float((torch.where(both, o64 - r, torch.zeros_like(r)) * r_both).sum())
        ref_sq += float((r_both * r_both).sum())
        m.n_finite += int(both.sum())
        bad = (d > atol + rtol * torch.where(r_fin, r.abs(), torch.zeros_like(r))) | mismatch
        m.n_bad += int(bad.sum())
        if ulp_ok and both.any():
            rr = torch.where(both, r, torch.zeros_like(r)).to(out.dtype)
            oo = torch.where(both, o, torch.zeros_like(o))
            ulp = (ordered_int(oo) - ordered_int(rr)).abs()
            m.max_ulp = max(m.max_ulp, float(ulp.max()))
        # worst candidates: non-finite mismatches rank first
        score = torch.where(mismatch, torch.full_like(d, float("inf")), d)
        k = min(n_worst, score.numel())
        if k:
            vals, idx = torch.topk(score, k)
            for v, i in zip(vals.tolist(), idx.tolist(), strict=True):
                if v > 0:
                    cand.append((v, s + i, float(o64[i]), float(r[i])))
    m.rel_l2 = (d2**0.5 / r2**0.5) if r2 > 0 else (0.0 if d2 == 0 else float("inf"))
    m.bias = er / ref_sq if ref_sq > 0 else 0.0
    m.all_zero = n > 0 and not any_nonzero and m.nan == 0 and m.inf == 0
    m.ref_all_zero = not ref_nonzero
    cand.sort(key=lambda c: -c[0])
    shape = list(out.shape)
    for v, flat_i, ov, rv in cand[:n_worst]:
        m.worst.append((_unravel(flat_i, shape), ov, rv, v))
    return m


def _unravel(i: int, shape: list[int]) -> list[int]:
    idx = []
    for dim in reversed(shape):
        idx.append(i % dim if dim else 0)
        i //= dim if dim else 1
    return list(reversed(idx))


# torch.testing's default tolerances per dtype (rtol, atol).
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1.3e-6, 1e-5),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
}
