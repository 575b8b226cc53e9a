"""GPU tests of kassay flce's vocabulary-panel schedule: bf16 grid, options, AMP, and the
low-memory end at the first target shape (peak memory and error against float64)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from flce_reference import (
    II,
    check_against_reference,
    check_options,
    flce_kernel,
    random_case,
    rel_l2,
)

from kassay.kernels import FlceConfig, plan_call

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

VOCAB = FlceConfig(schedule="vocab")


def _inputs(n, h, v, dtype, bias, ign, seed=0, wscale=3.0, weights=False):
    return random_case(
        n, h, v, dtype, bias, ign, seed, wscale=wscale, gen_device="cuda", device="cuda",
        class_weights=weights,
    )  # fmt: skip


GRID = list(
    itertools.product(
        [False, True], ["mean", "sum", "none"], [0.0, 0.1], [0.3, 1.0], [None, 20.0], [0.0, 1e-3]
    )
)


@pytest.mark.parametrize("bias,red,ls,ign,cap,zls", GRID)
def test_bf16_grid(bias, red, ls, ign, cap, zls):
    # 300 rows, 4099 columns in panels of 512: 2N = 600 tail rows, eight panels before them
    n, v = 300, 4099
    x, w, t, b = _inputs(n, 256, v, torch.bfloat16, bias, ign)
    go = torch.randn(n, device="cuda") if red == "none" else torch.tensor(1.0, device="cuda")
    check_against_reference(
        x, w, t, b, go, ls=ls, red=red, cap=cap, zls=zls, budget=n * 512 * 2, factor=1.25,
        floor=1e-4, config=VOCAB,
    )  # fmt: skip


def test_kept_logits_match_recomputed_ones_bf16():
    # the grid's shape keeps 1280 columns' logits from the forward (`plan_kept`): the same
    # gradients as with every panel recomputed (bf16 logits GEMMs of other widths: a few
    # roundings apart), and a second backward (retain_graph) recomputes to the same gradients
    from kassay.kernels._flce_vocab import plan_kept

    n, h, v = 300, 256, 4099
    assert plan_kept(n, h, v, torch.bfloat16, torch.bfloat16, True, VOCAB) is not None
    x, w, t, b = _inputs(n, h, v, torch.bfloat16, True, 0.2)
    kw = dict(label_smoothing=0.1, softcap=20.0, z_loss_scale=1e-3, memory_budget_bytes=n * 512 * 2)
    runs = []
    for cfg in (VOCAB, FlceConfig(schedule="vocab", vocab_keep_logits=False)):
        xr, wr, br = (a.clone().requires_grad_() for a in (x, w, b))
        loss = flce_kernel()(xr, wr, t, br, config=cfg, **kw)
        loss.backward(retain_graph=True)
        first = [a.grad.clone() for a in (xr, wr, br)]
        xr.grad = wr.grad = br.grad = None
        loss.backward()
        for a, c in zip(first, (xr.grad, wr.grad, br.grad), strict=True):
            assert rel_l2(c, a) <= 4e-3
        runs.append(first)
    for a, c in zip(*runs, strict=True):
        assert rel_l2(a, c) <= 4e-3


@pytest.mark.parametrize("red", ["mean", "sum", "none"])
@pytest.mark.parametrize("ts", [False, True])
def test_bf16_options(red, ts):
    n, v = 256, 3001
    x, w, t, b, cw = _inputs(n, 128, v, torch.bfloat16, True, 0.2, weights=True)
    go = torch.randn(n, device="cuda") if red == "none" else torch.tensor(1.0, device="cuda")
    check_options(
        x, w, t, b, go, cw=cw, ls=0.1, red=red, cap=20.0, zls=1e-3, ts=ts,
        budget=n * 256 * 2, factor=1.25, floor=1e-4, config=VOCAB,
    )  # fmt: skip


@pytest.mark.parametrize("amp", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
def test_autocast(amp, bias):
    x, w, t, b = _inputs(256, 128, 3001, torch.float32, bias, 0.1, wscale=1.0)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    br = None if b is None else b.clone().requires_grad_()
    with torch.autocast("cuda", dtype=amp):
        loss = flce_kernel()(xr, wr, t, br, memory_budget_bytes=256 * 256 * 2, config=VOCAB)
    loss.backward()
    assert xr.grad.dtype == wr.grad.dtype == torch.float32
    assert br is None or br.grad.dtype == torch.float32
    xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
    be = None if b is None else b.clone().requires_grad_()
    with torch.autocast("cuda", dtype=amp):
        le = F.cross_entropy(F.linear(xe, we, be).float(), t)
    le.backward()
    d = torch.float64
    xd, wd = x.to(d).requires_grad_(), w.to(d).requires_grad_()
    bd = None if b is None else b.to(d).requires_grad_()
    F.cross_entropy(F.linear(xd, wd, bd), t).backward()
    for k, e, r in ((xr.grad, xe.grad, xd.grad), (wr.grad, we.grad, wd.grad)):
        assert rel_l2(k, r) <= 1.1 * rel_l2(e, r) + 1e-4
    assert abs(float(loss) - float(le)) <= 1e-2 * abs(float(le))


def _ref64(x, w, t, chunk=1024):
    """float64 grad_x and grad_w of the mean CE, chunked over rows."""
    xd, wd = x.double(), w.double()
    nv = (t != II).sum().clamp_min(1).double()
    gx = torch.empty_like(xd)
    gw = torch.zeros_like(wd)
    for r0 in range(0, x.shape[0], chunk):
        z = xd[r0 : r0 + chunk] @ wd.t()
        tt = t[r0 : r0 + chunk]
        p = torch.softmax(z, 1)
        p[torch.arange(len(tt), device=x.device), tt.clamp_min(0)] -= 1
        p *= ((tt != II).double() / nv)[:, None]
        gx[r0 : r0 + chunk] = p @ wd
        gw += p.t() @ xd[r0 : r0 + chunk]
        del z, p
    return gx, gw


def test_low_memory_end_at_the_first_target_shape():
    # a 2 MiB budget: the gradients and ~2 MiB beyond them (the backward's wide panels live in
    # grad_W's unwritten rows and grad_x's buffer), grad_W written once (no drift)
    n, h, v = 8192, 4096, 128256
    x, w, t, _ = _inputs(n, h, v, torch.bfloat16, False, 0.1, wscale=1.0)
    budget = 2 * 2**20
    assert plan_call(x, w, memory_budget_bytes=budget).schedule == "vocab"
    gx64, gw64 = _ref64(x, w, t)
    xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
    F.cross_entropy(F.linear(xe, we).float(), t).backward()
    ex, ew = rel_l2(xe.grad, gx64), rel_l2(we.grad, gw64)
    del xe, we
    torch.cuda.empty_cache()
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    flce_kernel()(xr, wr, t, memory_budget_bytes=budget).backward()
    xr.grad = wr.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    flce_kernel()(xr, wr, t, memory_budget_bytes=budget).backward()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - before) / 2**30
    kx, kw = rel_l2(xr.grad, gx64), rel_l2(wr.grad, gw64)
    print(
        f"peak extra {peak:.4f} GiB; grad_x {kx:.3e} (eager {ex:.3e}), grad_W {kw:.3e} ({ew:.3e})"
    )
    grads = (v * h + n * h) * 2 / 2**30
    assert peak <= grads + 3.5 / 1024  # the 2 MiB panel and [N] vectors
    assert kx <= 1.1 * ex and kw <= 1.1 * ew
