import torch

import kassay.testing as kt


def flce(x, weight, target, bias, params):  # float32 math, not torch's cross_entropy
    z = (x.float() @ weight.float().T) + (bias.float() if bias is not None else 0)
    valid = target != params.ignore_index
    t = torch.where(valid, target, 0)
    nll = (torch.logsumexp(z, dim=-1) - z.gather(1, t[:, None])[:, 0]) * valid
    return (nll.sum() / valid.sum().clamp(min=1)).to(x.dtype)  # all ignored: 0


def flce_scaled(x, weight, target, bias, params):  # a systematic 1% error
    return flce(x, weight, target, bias, params) * 1.01


def flce_half_lse(x, weight, target, bias, params):  # the lse in float16
    z = x.float() @ weight.float().T
    valid = target != params.ignore_index
    t = torch.where(valid, target, 0)
    lse = torch.logsumexp(z.half(), dim=-1).float()
    return ((lse - z.gather(1, t[:, None])[:, 0]) * valid).sum() / valid.sum().clamp(min=1)


def merge(outs, lses, *, lse_layout, accumulate):
    lse = lses.float() if lse_layout == "Th" else lses.float().transpose(1, 2)
    lse = torch.where(torch.isposinf(lse), torch.full_like(lse, -torch.inf), lse)
    total = torch.logsumexp(lse, dim=0)
    w = torch.exp(lse - torch.where(torch.isfinite(total), total, 0)).nan_to_num(0.0)
    out = (w[..., None] * outs.float()).sum(0).to(outs.dtype)
    return out, total if lse_layout == "Th" else total.transpose(0, 1).contiguous()


def merge_naive(outs, lses, *, lse_layout, accumulate):  # log(sum(exp)) without the max
    lse = lses.float() if lse_layout == "Th" else lses.float().transpose(1, 2)
    total = torch.log(torch.exp(lse).sum(0))
    out = (torch.exp(lse - total)[..., None] * outs.float()).sum(0).to(outs.dtype)
    return out, total if lse_layout == "Th" else total.transpose(0, 1).contiguous()


FLCE = dict(N=64, H=32, V=96, dtype="float32", ignore_fraction=0.25)
LSE = dict(T=64, Hh=4, D=32, K=[2, 4], dtype=["float32", "float16"])


def test_flce():
    kt.assert_kernel("flce", flce, **FLCE)


def test_merge():
    kt.assert_kernel("lse_merge", merge, **LSE)


def test_flce_scaled():
    kt.assert_kernel("flce", flce_scaled, **FLCE)


def test_flce_half_lse():
    kt.assert_kernel("flce", flce_half_lse, **FLCE)


def test_merge_naive():
    kt.assert_kernel("lse_merge", merge_naive, **LSE)
