"""GPU tests of kassay's fused linear cross-entropy (bf16 grid, autocast, large shapes, memory)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from flce_reference import II, check_against_reference, flce_kernel, random_case, rel_l2, run_grads

from kassay.kernels.flce import FlceConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _inputs(n, h, v, dtype, bias, ignore_frac, seed=0, wscale=1.0):
    return random_case(
        n, h, v, dtype, bias, ignore_frac, seed, wscale=wscale, gen_device="cuda", device="cuda"
    )


def _compare(n, h, v, dtype, bias, ignore_frac, ls, red, cap, zls, budget=None, factor=1.5):
    x, w, t, b = _inputs(n, h, v, dtype, bias, ignore_frac, wscale=3.0)
    go = torch.randn(n, device="cuda") if red == "none" else torch.tensor(1.0, device="cuda")
    floor = 2e-6 if dtype == torch.float32 else 1e-4
    check_against_reference(
        x, w, t, b, go, ls=ls, red=red, cap=cap, zls=zls, budget=budget, factor=factor,
        floor=floor,
    )  # fmt: skip


GRID = list(
    itertools.product(
        [False, True], ["mean", "sum", "none"], [0.0, 0.1], [0.3, 1.0], [None, 20.0], [0.0, 1e-3]
    )
)


@pytest.mark.parametrize("bias,red,ls,ign,cap,zls", GRID)
def test_bf16_grid(bias, red, ls, ign, cap, zls):
    _compare(300, 256, 4099, torch.bfloat16, bias, ign, ls, red, cap, zls)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("red", ["mean", "none"])
def test_many_chunks(dtype, red):
    # budget for 64 rows of logits: 8 chunks; grad_weight must not drift
    _compare(
        512,
        128,
        5003,
        dtype,
        True,
        0.1,
        0.1,
        red,
        30.0,
        1e-4,
        budget=64 * 5003 * (4 if dtype == torch.float32 else 2),
        factor=1.25,
    )


@pytest.mark.parametrize("red", ["mean", "none"])
def test_many_chunks_tma_path(red):
    # 16-byte aligned rows (H, V multiples of 8): the grad_weight GEMM takes the persistent TMA
    # kernel, and the last of 9 chunks runs in backward with the fused bfloat16 conversion
    assert FlceConfig().use_tma_gemm and FlceConfig().defer_last_gw
    _compare(
        520,
        256,
        8200,
        torch.bfloat16,
        True,
        0.1,
        0.1,
        red,
        30.0,
        1e-4,
        budget=64 * 8200 * 2,
        factor=1.25,
    )


@pytest.mark.parametrize("final,reduce", [(False, True), (False, False), (True, True)])
def test_gemm_tma_matches_plain_kernel(final, reduce):
    # K, M and N tails (200, 1000, 136 against blocks of 64, 128, 256); reduce: the accumulating
    # epilogue as a TMA reduce-add (the default) or load-add-store
    from kassay.kernels import _flce_launch as m

    g = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(200, 1000, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(200, 136, device="cuda", generator=g).to(torch.bfloat16)
    c = (torch.randn(1000, 136, device="cuda", generator=g) * 16).half()
    s = torch.tensor([0.25], device="cuda")
    fin = torch.tensor([0.5], device="cuda")
    ref = c.double() + 0.25 * a.double().t() @ b.double()
    ref = ref * 0.5 if final else ref
    outs = []
    for tma in (True, False):
        cfg = FlceConfig(use_tma_gemm=tma, gemm_tma_reduce=reduce)
        assert m._tma_ok(a, b, c, cfg=cfg) == tma
        cc = c.clone()
        o = cc.view(torch.bfloat16) if final else cc
        m._launch_gemm_tn(a, b, cc, s, True, out=o if final else None, fin=fin, cfg=cfg)
        outs.append(o)
        assert rel_l2(o, ref) < (4e-3 if final else 5e-4)
    assert rel_l2(outs[0], outs[1].double()) < (8e-3 if final else 1e-3)


@pytest.mark.parametrize(
    "rows,h,v",
    # schedules: grad_W all in the light programs' extra share (and M, N, K tails); both the
    # extra share and common tiles; no extra share (grad_x k-steps < grad_W k-steps)
    [(1000, 520, 8200), (2176, 2048, 8192), (4096, 1024, 2048)],
)
@pytest.mark.parametrize("accumulate", [False, True])
def test_grads_fused_kernel_matches_separate_kernels(rows, h, v, accumulate):
    # one kernel for a chunk's grad_x and grad_W: grad_W bit-identical to the TMA grad_W kernel
    # (same k order per tile), grad_x as accurate as cuBLAS's against float64
    from kassay.kernels import _flce_launch as m

    g = torch.Generator(device="cuda").manual_seed(rows)
    dl = (torch.randn(rows, v, device="cuda", generator=g) * 1e-2).to(torch.bfloat16)
    w = (torch.randn(v, h, device="cuda", generator=g) / math.sqrt(h)).to(torch.bfloat16)
    xc = torch.randn(rows, h, device="cuda", generator=g).to(torch.bfloat16)
    c0 = (torch.randn(v, h, device="cuda", generator=g) * 4).half()
    s = torch.tensor([0.5], device="cuda")
    gx = torch.full((rows, h), float("nan"), device="cuda", dtype=torch.bfloat16)
    c = c0.clone()
    m._launch_grads(dl, w, gx, xc, c, s, accumulate)
    c_ref = c0.clone()
    m._launch_gemm_tn(dl, xc, c_ref, s, accumulate)
    assert torch.equal(c, c_ref)
    gx64 = dl.double() @ w.double()
    assert rel_l2(gx, gx64) <= 1.05 * rel_l2(dl @ w, gx64) + 1e-6


@pytest.mark.parametrize("red,bias", [("mean", False), ("none", True)])
def test_grads_fused_path_in_flce(red, bias, monkeypatch):
    # chunks whose grad_x tiles overfill one wave of the SMs by a few: the first chunk's grad_x
    # and grad_W run as one kernel storing the accumulator, the second adding to it, the third
    # (deferred to backward) as before. Same loss and grad_W bits as the separate kernels.
    # reduction='none' runs the pass in backward with per-row grad_output (and a bias gradient).
    from kassay.kernels import _flce_autograd
    from kassay.kernels import _flce_launch as m

    sms = m._num_sms(torch.cuda.current_device())
    h, v = 2048, 8192
    rows = 128 * (sms // 8 + 1)  # 8 * (sms // 8 + 1) grad_x tiles: sms + 1 ... sms + 8
    n = 3 * rows
    x, w, t, b = _inputs(n, h, v, torch.bfloat16, bias, 0.1, wscale=3.0)
    go = torch.rand(n, device="cuda") + 0.5 if red == "none" else torch.tensor(1.0, device="cuda")
    budget = rows * v * 2
    assert FlceConfig().defer_last_gw and FlceConfig().grads_fused
    assert m.plan_rows(n, v, 2, budget) == rows
    calls = []
    launch = _flce_autograd._launch_grads

    def counted(*a, **kw):
        calls.append(kw["accumulate"])
        launch(*a, **kw)

    monkeypatch.setattr(_flce_autograd, "_launch_grads", counted)
    outs = []
    for fused in (True, False):
        cfg = FlceConfig(grads_fused=fused)
        outs.append(
            run_grads(
                lambda xx, ww, tt, bb, c=cfg: _fwd(xx, ww, tt, bb, red, budget, c), x, w, t, b, go
            )
        )
    monkeypatch.undo()
    assert calls == [False, True]
    (l1, _, gx1, gw1, gb1), (l2, _, gx2, gw2, gb2) = outs
    assert torch.equal(l1, l2)
    assert torch.equal(gw1, gw2)
    assert rel_l2(gx1, gx2.double()) < 1e-2
    if bias:
        assert torch.equal(gb1, gb2)
    check_against_reference(
        x, w, t, b, go, ls=0.0, red=red, cap=None, zls=0.0, budget=budget, factor=1.25,
        floor=1e-4,
    )  # fmt: skip


def _fwd(x, w, t, b, red, budget, config=None):
    """(loss, z_loss) of kassay's flce with the given reduction, memory budget and config."""
    return flce_kernel()(
        x, w, t, b, reduction=red, return_z_loss=True, memory_budget_bytes=budget, config=config
    )


@pytest.mark.parametrize("n,h,v", [(1, 64, 123), (37, 4097, 123), (64, 256, 50257)])
def test_odd_shapes(n, h, v):
    _compare(n, h, v, torch.bfloat16, True, 0.0, 0.0, "mean", None, 0.0)


@pytest.mark.parametrize("amp", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
def test_autocast(amp, bias):
    x, w, t, b = _inputs(256, 128, 3001, torch.float32, bias, 0.1)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    br = None if b is None else b.clone().requires_grad_()
    with torch.autocast("cuda", dtype=amp):
        loss = flce_kernel()(xr, wr, t, br, memory_budget_bytes=64 * 3001 * 2)
    loss.backward()
    assert xr.grad.dtype == torch.float32 and wr.grad.dtype == torch.float32
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
        assert rel_l2(k, r) <= 1.5 * rel_l2(e, r) + 1e-4
    assert abs(float(loss) - float(le)) <= 1e-2 * abs(float(le))


def test_all_ignored_no_nan():
    x, w, t, b = _inputs(64, 64, 1000, torch.bfloat16, True, 1.0)
    xr, wr, br = (a.clone().requires_grad_() for a in (x, w, b))
    loss = flce_kernel()(xr, wr, t, br, z_loss_scale=1e-3)
    loss.backward()
    assert float(loss) == 0.0
    for g in (xr.grad, wr.grad, br.grad):
        assert torch.isfinite(g).all() and float(g.abs().max()) == 0.0


def test_out_of_range_targets_raise_and_change_nothing():
    # the target check no longer syncs up front: kernels run first (clamped in bounds), the
    # error comes once they are queued; the caller's tensors and the device must be unharmed
    x, w, t, b = _inputs(300, 64, 1000, torch.bfloat16, True, 0.2, seed=4)
    xr, wr, br = (a.clone().requires_grad_() for a in (x, w, b))
    for bad in (1000, 1 << 40, -3):
        tb = t.clone()
        tb[257] = bad
        for red in ("mean", "none"):
            with pytest.raises(ValueError, match="outside"):
                flce_kernel()(xr, wr, tb, br, reduction=red, memory_budget_bytes=100 * 1000 * 2)
    torch.cuda.synchronize()  # no illegal access was queued
    assert xr.grad is None and wr.grad is None and br.grad is None
    assert (
        torch.equal(xr.detach(), x) and torch.equal(wr.detach(), w) and torch.equal(br.detach(), b)
    )
    go = torch.tensor(1.0, device="cuda")
    check_against_reference(x, w, t, b, go, ls=0.0, red="mean", cap=None, zls=0.0, floor=1e-4)


def test_captured_in_a_cuda_graph_matches_eager():
    """kassay's flce forward + backward captured in a CUDA graph and replayed gives eager's loss
    and gradients bit for bit. The target check used to wait on an event inside the call, which
    failed every capture (and, torch <= 2.11, left the failed capture's memory pool reserved:
    a CI grid's executor grew by GiBs); while a graph is captured the check is now left out."""
    x, w, t, b = _inputs(1000, 256, 4096, torch.bfloat16, True, 0.2, seed=5)
    xr, wr, br = (a.clone().requires_grad_() for a in (x, w, b))

    def step():
        for a in (xr, wr, br):
            a.grad = None
        loss = flce_kernel()(xr, wr, t, br, label_smoothing=0.1, memory_budget_bytes=1 << 20)
        loss.backward()
        return loss

    eager = step().detach().clone()
    eager_grads = [a.grad.clone() for a in (xr, wr, br)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    for a in (xr, wr, br):
        a.grad = None
    with torch.cuda.graph(graph):
        captured = flce_kernel()(xr, wr, t, br, label_smoothing=0.1, memory_budget_bytes=1 << 20)
        captured.backward()
    graph.replay()
    graph.replay()  # gradients are written, not accumulated, by the captured backward's buffers
    torch.cuda.synchronize()
    assert torch.equal(captured.detach(), eager)
    for got, want in zip((xr.grad, wr.grad, br.grad), eager_grads, strict=True):
        assert torch.equal(got, want)


def test_timing_captures_kassay_flce():
    """The engine's timing can capture kassay's flce (it used to fall back with "operation
    failed due to a previous error during capture" on every case)."""
    from kassay.contract.spec import TimingPolicy
    from kassay.validate.timing import time_call

    x, w, t, _ = _inputs(512, 256, 4096, torch.bfloat16, False, 0.1, seed=6)
    xr, wr = (a.clone().requires_grad_() for a in (x, w))

    def call():
        flce_kernel()(xr, wr, t).backward()

    timing = time_call(call, torch.device("cuda"), TimingPolicy(warmup=1, min_reps=5))
    assert timing.mode == "graph" or "capture" not in (timing.graph_fallback or ""), timing


def _ref64_gw(x, w, t, chunk=1024):
    xd, wd = x.double(), w.double()
    valid = t != II
    nv = valid.sum().clamp_min(1).double()
    gw = torch.zeros_like(wd)
    for r0 in range(0, x.shape[0], chunk):
        z = xd[r0 : r0 + chunk] @ wd.t()
        tt = t[r0 : r0 + chunk]
        p = torch.softmax(z, 1)
        p[torch.arange(len(tt), device=x.device), tt.clamp_min(0)] -= 1
        p *= ((tt != II).double() / nv)[:, None]
        gw += p.t() @ xd[r0 : r0 + chunk]
        del z, p
    return gw


def _fwd_bwd_peak(x, w, t):
    """kassay forward + backward at the default budget: (x leaf, w leaf, peak extra GiB).
    One untimed call first, so that one-off allocations (cuBLAS workspace) are not counted."""
    wr = w.clone().requires_grad_()
    xr = x.clone().requires_grad_()
    flce_kernel()(xr, wr, t).backward()
    xr.grad = wr.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    flce_kernel()(xr, wr, t).backward()
    torch.cuda.synchronize()
    return xr, wr, (torch.cuda.max_memory_allocated() - before) / 2**30


def test_large_drift_and_memory():
    n, h, v = 8192, 4096, 128256
    x, w, t, _ = _inputs(n, h, v, torch.bfloat16, False, 0.1)
    gw64 = _ref64_gw(x, w, t)
    we = w.clone().requires_grad_()
    F.cross_entropy(F.linear(x, we).float(), t).backward()
    e_eager = rel_l2(we.grad, gw64)
    del we
    torch.cuda.empty_cache()
    _, wr, peak = _fwd_bwd_peak(x, w, t)
    e_k = rel_l2(wr.grad, gw64)
    print(f"grad_weight rel-L2 kassay {e_k:.3e} eager {e_eager:.3e}; peak extra {peak:.3f} GiB")
    assert e_k <= 1.25 * e_eager
    # model: grads (V·H + N·H)·2 bytes + the default logits budget + small row buffers
    assert peak <= 1.5


def test_second_target_shape_memory_at_default_budget():
    # N=8192, H=2304, V=256000: 9 chunks of 960 rows; the target's peak extra is 1.6 GiB
    n, h, v = 8192, 2304, 256000
    x, w, t, _ = _inputs(n, h, v, torch.bfloat16, False, 0.1)
    xr, wr, peak = _fwd_bwd_peak(x, w, t)
    print(f"peak extra {peak:.4f} GiB")
    assert torch.isfinite(xr.grad).all() and torch.isfinite(wr.grad).all()
    assert peak <= 1.6
