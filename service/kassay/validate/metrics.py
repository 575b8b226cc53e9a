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
    flat = ref.reshape(-1)
    # max |rounding|, max |ref|, sum rounding^2, sum ref^2: accumulated on the device, read once
    acc = torch.zeros(4, dtype=torch.float64, device=flat.device)
    for s in range(0, flat.numel(), _CHUNK):
        r = flat[s : s + _CHUNK]
        r = torch.where(torch.isfinite(r), r, 0.0)
        d = (r.to(dtype).double() - r).abs()
        d = torch.where(torch.isfinite(d), d, 0.0)
        top = torch.stack([d.max(), r.abs().max()])
        acc[:2] = torch.maximum(acc[:2], top)
        acc[2:] += torch.stack([torch.dot(d, d), torch.dot(r, r)])
    max_abs, peak, d2, r2 = acc.tolist()
    eps = torch.finfo(dtype).eps
    one_ulp = eps * 2.0 ** math.floor(math.log2(peak)) if peak > 0 else 0.0
    rel = (d2**0.5 / r2**0.5) if r2 > 0 else 0.0
    return max(max_abs, one_ulp), max(rel, eps / max(flat.numel(), 1) ** 0.5)


def compare(
    out: torch.Tensor, ref: torch.Tensor, *, atol: float, rtol: float, n_worst: int = 5
) -> RawMetrics:
    """Metrics of `out` (any float dtype) against `ref` (float64, same shape).

    Every chunk's sums, counts and maxima accumulate on the tensors' device and are read once at
    the end: reading them per chunk made the host wait for the device ~20 times a chunk, and a
    CI grid's comparisons took ~3.9 s of its repeated run on the H200 (#15)."""
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(
            f"shape {tuple(out.shape)} differs from the reference's {tuple(ref.shape)}"
        )
    m = RawMetrics()
    o_flat = out.detach().reshape(-1)
    r_flat = ref.detach().reshape(-1).to(out.device)
    n = o_flat.numel()
    f64, dev = torch.float64, r_flat.device
    # First pass: the norm of the reference, whose rms sets the max_rel floor.
    r2 = torch.zeros((), dtype=f64, device=dev)
    for s in range(0, n, _CHUNK):
        r = r_flat[s : s + _CHUNK]
        rf = torch.where(torch.isfinite(r), r, 0.0)
        r2 += torch.dot(rf, rf)
    rel_floor = torch.clamp(1e-3 * torch.sqrt(r2 / max(n, 1)), min=1e-300)
    # sums: |out - ref|^2, <out - ref, ref> and <ref, ref> over both-finite elements (the bias
    # fit); maxima: abs, rel, ulp; counts: as named in _COUNTS
    sums = torch.zeros(3, dtype=f64, device=dev)
    maxima = torch.zeros(3, dtype=f64, device=dev)
    counts = torch.zeros(len(_COUNTS), dtype=torch.int64, device=dev)
    cand: list[torch.Tensor] = []  # per chunk: (score, flat index, out, ref) of its worst
    ulp_ok = out.dtype in _INT_VIEW
    for s in range(0, n, _CHUNK):
        o = o_flat[s : s + _CHUNK]
        r = r_flat[s : s + _CHUNK]
        o64 = o.double()
        o_nan, o_inf, r_nan, r_inf = o64.isnan(), o64.isinf(), r.isnan(), r.isinf()
        o_fin, r_fin = ~(o_nan | o_inf), ~(r_nan | r_inf)
        both = o_fin & r_fin
        # equal infinities and NaN against NaN are no mismatch
        mismatch = ~(both | (o_inf & r_inf & (o64 == r)) | (o_nan & r_nan))
        diff = torch.where(both, o64 - r, 0.0)
        d = diff.abs()
        r_both = torch.where(both, r, 0.0)
        r_abs = r_both.abs()
        # where out is not finite and ref is, d is 0 but mismatch marks the element bad
        bad = (d > atol + rtol * r_abs) | mismatch
        counts += torch.stack(
            [
                o_nan.sum(),
                o_inf.sum(),
                r_nan.sum(),
                r_inf.sum(),
                mismatch.sum(),
                (~o_fin & r_fin).sum(),
                (o_fin & r_inf).sum(),
                both.sum(),
                bad.sum(),
                (both & (o64 != 0)).sum(),
                (r_fin & (r != 0)).sum(),
            ]
        )
        sums += torch.stack(
            [torch.dot(diff, diff), torch.dot(diff, r_both), torch.dot(r_both, r_both)]
        )
        if ulp_ok:
            ulp = (ordered_int(torch.where(both, o, 0.0)) - ordered_int(r_both.to(out.dtype))).abs()
            top_ulp = ulp.max().double()
        else:
            top_ulp = torch.zeros((), dtype=f64, device=dev)
        maxima = torch.maximum(
            maxima, torch.stack([d.max(), (d / torch.maximum(r_abs, rel_floor)).max(), top_ulp])
        )
        # worst candidates: non-finite mismatches rank first
        score = torch.where(mismatch, float("inf"), d)
        k = min(n_worst, score.numel())
        vals, idx = torch.topk(score, k)
        cand.append(torch.stack([vals, (idx + s).double(), o64[idx], r[idx]]))
    # one read of everything (all zeros for an empty tensor)
    (d2, er, ref_sq), (m.max_abs, m.max_rel, m.max_ulp), got, ref_norm2 = (
        sums.tolist(),
        maxima.tolist(),
        counts.tolist(),
        float(r2),
    )
    (
        m.nan,
        m.inf,
        m.ref_nan,
        m.ref_inf,
        m.mismatched_nonfinite,
        m.nonfinite_where_finite,
        m.finite_where_inf,
        m.n_finite,
        m.n_bad,
        o_nonzero,
        r_nonzero,
    ) = got
    m.rel_l2 = (d2**0.5 / ref_norm2**0.5) if ref_norm2 > 0 else (0.0 if d2 == 0 else float("inf"))
    m.bias = er / ref_sq if ref_sq > 0 else 0.0
    m.all_zero = n > 0 and not o_nonzero and m.nan == 0 and m.inf == 0
    m.ref_all_zero = not r_nonzero
    worst = sorted(
        (c for c in (torch.cat(cand, dim=1).T.tolist() if cand else []) if c[0] > 0),
        key=lambda c: -c[0],
    )
    shape = list(out.shape)
    for v, flat_i, ov, rv in worst[:n_worst]:
        m.worst.append((_unravel(int(flat_i), shape), ov, rv, v))
    return m


#: the counts compare accumulates per chunk, in order
_COUNTS = (
    "nan",
    "inf",
    "ref_nan",
    "ref_inf",
    "mismatched_nonfinite",
    "nonfinite_where_finite",
    "finite_where_inf",
    "n_finite",
    "n_bad",
    "out_nonzero",
    "ref_nonzero",
)


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
