"""CPU tests of kassay's fused linear cross-entropy under the Triton interpreter.

float32 and float16 only (the interpreter computes tl.dot on bfloat16 wrongly); tiny sizes.
Each output is compared with a float64 torch-autograd reference under a baseline policy:
rel-L2(kassay) <= factor * rel-L2(torch eager, same dtype) + a rounding floor.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from flce_reference import II, check_against_reference, flce_kernel, random_case, rel_l2, run_grads

from kassay.kernels.flce import FlceConfig, FusedLinearCrossEntropyLoss

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
    reason="needs TRITON_INTERPRET=1 (set by tests/conftest.py on hosts without a GPU)",
)

DEV = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


def _inputs(n, h, v, dtype, bias, ignore_frac, seed):
    return random_case(
        n, h, v, dtype, bias, ignore_frac, seed, wscale=2, gen_device="cpu", device=DEV
    )


def _compare(n, h, v, dtype, bias, ign, ls, red, cap, zls, budget=None, factor=1.5, seed=0):
    x, w, t, b = _inputs(n, h, v, dtype, bias, ign, seed)
    g = torch.Generator().manual_seed(seed + 1)
    go = (torch.randn(n, generator=g) if red == "none" else torch.tensor(1.0)).to(DEV)
    check_against_reference(
        x, w, t, b, go, ls=ls, red=red, cap=cap, zls=zls, budget=budget, factor=factor,
        floor=4 * torch.finfo(dtype).eps,
    )  # fmt: skip


# (bias, label_smoothing, ignore_fraction, softcap, z_loss_scale)
OPTIONS = [
    (False, 0.0, 0.0, None, 0.0),
    (True, 0.1, 0.3, None, 0.0),
    (False, 0.0, 0.3, 5.0, 0.0),
    (True, 0.0, 0.0, None, 1e-2),
    (True, 0.2, 0.5, 3.0, 1e-3),
    (False, 0.1, 1.0, None, 1e-3),  # every target ignored
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("red", ["mean", "sum", "none"])
@pytest.mark.parametrize("bias,ls,ign,cap,zls", OPTIONS)
def test_grid(dtype, red, bias, ls, ign, cap, zls):
    _compare(24, 16, 123, dtype, bias, ign, ls, red, cap, zls)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("red", ["mean", "none"])
def test_many_chunks_no_drift(dtype, red):
    # a budget of 8 logits rows: 6 chunks, grad_weight accumulated over all of them
    v = 77
    budget = 8 * v * (4 if dtype == torch.float32 else 2)
    _compare(48, 32, v, dtype, True, 0.2, 0.1, red, 10.0, 1e-3, budget=budget, factor=1.25)


@pytest.mark.parametrize("n,h,v", [(1, 16, 123), (5, 65, 123), (9, 16, 257)])
def test_odd_shapes(n, h, v):
    _compare(n, h, v, torch.float32, True, 0.0, 0.1, "mean", None, 0.0)


def test_reduction_none_per_row_grad_output():
    # a Liger bug scaled every row's gradient by grad_output[0]
    x, w, t, _ = _inputs(16, 16, 50, torch.float32, False, 0.0, 3)
    xr = x.clone().requires_grad_()
    loss = flce_kernel()(xr, w, t, reduction="none")
    go = torch.zeros(16, device=DEV)
    go[5] = 1.0
    loss.backward(go)
    assert float(xr.grad[torch.arange(16) != 5].abs().max()) == 0.0
    assert float(xr.grad[5].abs().max()) > 0.0


def test_all_ignored_mean_is_zero():
    x, w, t, b = _inputs(8, 16, 40, torch.float32, True, 1.0, 4)
    xr, wr, br = (a.clone().requires_grad_() for a in (x, w, b))
    loss, zl = flce_kernel()(
        xr, wr, t, br, z_loss_scale=1e-3, label_smoothing=0.1, return_z_loss=True
    )
    loss.backward()
    assert float(loss.detach()) == 0.0 and float(zl) == 0.0
    for g in (xr.grad, wr.grad, br.grad):
        assert torch.isfinite(g).all() and float(g.abs().max()) == 0.0


def test_autocast_fp32_params_fp16():
    x, w, t, b = _inputs(20, 16, 60, torch.float32, True, 0.1, 5)
    for bias in (None, b):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        br = None if bias is None else bias.clone().requires_grad_()
        with torch.autocast(DEV, dtype=torch.float16):
            loss = flce_kernel()(xr, wr, t, br)
        loss.backward()
        assert xr.grad.dtype == wr.grad.dtype == torch.float32
        assert br is None or br.grad.dtype == torch.float32
        ref = F.cross_entropy(
            F.linear(x.double(), w.double(), None if bias is None else bias.double()), t
        )
        assert abs(float(loss) - float(ref)) < 1e-2 * abs(float(ref))


def test_module_matches_function():
    x, w, t, b = _inputs(10, 16, 33, torch.float32, True, 0.2, 6)
    mod = FusedLinearCrossEntropyLoss(label_smoothing=0.1, z_loss_scale=1e-3, softcap=4.0)
    a = mod(x, w, t, b)
    c = flce_kernel()(x, w, t, b, label_smoothing=0.1, z_loss_scale=1e-3, softcap=4.0)
    assert torch.equal(a, c)


def test_no_grad_forward_only():
    x, w, t, _ = _inputs(10, 16, 33, torch.float32, False, 0.0, 7)
    with torch.no_grad():
        loss = flce_kernel()(x.requires_grad_(), w, t)
    ref = F.cross_entropy(F.linear(x.double(), w.double()), t)
    assert abs(float(loss) - float(ref)) < 1e-5


def test_gemm_and_finalize_kernels():
    from kassay.kernels import _flce_launch as m

    g = torch.Generator().manual_seed(8)
    # M = 317: 10 blocks of 32 under the interpreter, so the last GROUP_M (4) group is partial
    a = torch.randn(37, 317, generator=g).half().to(DEV)
    bb = torch.randn(37, 45, generator=g).half().to(DEV)
    c = torch.randn(317, 45, generator=g).float().to(DEV)
    c0 = c.clone()
    s = torch.tensor([0.5], device=DEV)
    m._launch_gemm_tn(a, bb, c, s, accumulate=True)
    ref = c0.double() + 0.5 * a.double().t() @ bb.double()
    assert rel_l2(c, ref) < 1e-6
    # in-place float16 -> bfloat16 conversion with a factor
    acc = (torch.randn(1000, generator=g) * 100).half().to(DEV)
    want = (acc.float() * 0.25).to(torch.bfloat16)
    out = acc.view(torch.bfloat16)
    m._launch_finalize(acc, out, torch.tensor([0.25], device=DEV))
    # within one bfloat16 ulp (the interpreter's float32 -> bfloat16 cast truncates)
    assert float(((out.float() - want.float()).abs() / want.float().abs()).max()) <= 2.0**-7


def test_gemm_final_writes_finished_gradient():
    # the last chunk's GEMM (FINAL): out = (c + s * a^T b) * fin, out aliasing c's storage
    from kassay.kernels import _flce_launch as m

    g = torch.Generator().manual_seed(9)
    a = torch.randn(41, 66, generator=g).half().to(DEV)
    bb = torch.randn(41, 29, generator=g).half().to(DEV)
    c = (torch.randn(66, 29, generator=g) * 8).half().to(DEV)
    c0 = c.clone()
    out = c.view(torch.float16)  # same storage, as gw.finalize does with its bf16 view
    m._launch_gemm_tn(
        a,
        bb,
        c,
        torch.tensor([0.5], device=DEV),
        True,
        out=out,
        fin=torch.tensor([0.125], device=DEV),
    )
    ref = (c0.double() + 0.5 * a.double().t() @ bb.double()) * 0.125
    assert rel_l2(out, ref) < 2e-3


@pytest.mark.skipif(
    DEV != "cpu", reason="launches the Hopper kernel directly under the interpreter"
)
@pytest.mark.parametrize(
    "accumulate,final,reduce",
    # the reduce-add epilogue itself (accumulate, not final) is tested on the GPU only: the
    # interpreter has no descriptor reduce (tests/gpu test_gemm_tma_matches_plain_kernel)
    [(False, False, False), (True, False, False), (True, True, True)],
)
def test_gemm_tma_persistent_kernel(accumulate, final, reduce):
    # the Hopper (TMA, persistent) grad_weight GEMM, run by the interpreter in float16 (its
    # bfloat16 descriptor loads are wrong there): odd K, M and N tails, 3 "SMs" for 8 tiles
    from triton.tools.tensor_descriptor import TensorDescriptor

    from kassay.kernels import _flce_kernels as K

    g = torch.Generator().manual_seed(10)
    k, mm, n = 37, 72, 56
    a = torch.randn(k, mm, generator=g).half()
    bb = torch.randn(k, n, generator=g).half()
    c = (torch.randn(mm, n, generator=g) * 4).half()
    c0 = c.clone()
    out = torch.empty_like(c) if final else c
    bm, bn, bk = 32, 32, 16
    K._gemm_tn_acc_tma_kernel[(3,)](
        TensorDescriptor.from_tensor(a, [bk, bm]),
        TensorDescriptor.from_tensor(bb, [bk, bn]),
        TensorDescriptor.from_tensor(c, [bm, bn // 2]),
        TensorDescriptor.from_tensor(out, [bm, bn // 2]),
        torch.tensor([0.5]),
        torch.tensor([0.25]),
        mm,
        n,
        k,
        ACCUMULATE=accumulate,
        FINAL=final,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=2,
        EPI_SPLIT=2,
        NUM_SMS=3,
        REDUCE=reduce,  # accumulating epilogue as a TMA reduce-add (ignored by FINAL)
    )
    ref = 0.5 * a.double().t() @ bb.double() + (c0.double() if accumulate else 0.0)
    if final:
        ref = ref * 0.25
    assert rel_l2(out, ref) < 2e-3


def test_plan_rows():
    from kassay.kernels.flce import DEFAULT_MEMORY_BUDGET_BYTES, plan_rows

    assert plan_rows(8192, 128256, 2, DEFAULT_MEMORY_BUDGET_BYTES) * 128256 * 2 <= (
        DEFAULT_MEMORY_BUDGET_BYTES
    )
    # the two TARGETS shapes at the default budget: 5 chunks of 1792, 9 of 960 (64-aligned)
    assert plan_rows(8192, 128256, 2, DEFAULT_MEMORY_BUDGET_BYTES) == 1792
    assert plan_rows(8192, 256000, 2, DEFAULT_MEMORY_BUDGET_BYTES) == 960
    assert plan_rows(10, 100, 4, 10**9) == 10
    assert plan_rows(100, 10, 4, 40) == 1
    for n in (1, 7, 100, 1000):
        r = plan_rows(n, 33, 2, 33 * 2 * 9)
        assert 1 <= r <= 9


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(reduction="avg"), "reduction"),
        (dict(label_smoothing=1.5), "label_smoothing"),
        (dict(softcap=0.0), "softcap"),
        (dict(z_loss_scale=-1.0), "z_loss_scale"),
        (dict(memory_budget_bytes=0), "memory_budget_bytes"),
    ],
)
def test_bad_options(kw, match):
    x, w, t, _ = _inputs(4, 8, 10, torch.float32, False, 0.0, 9)
    with pytest.raises(ValueError, match=match):
        flce_kernel()(x, w, t, **kw)


def test_bad_shapes_and_targets():
    x, w, t, _ = _inputs(4, 8, 10, torch.float32, False, 0.0, 10)
    with pytest.raises(ValueError, match="H="):
        flce_kernel()(x, w[:, :4], t)
    with pytest.raises(ValueError, match="target"):
        flce_kernel()(x, w, t[:3])
    with pytest.raises(ValueError, match="outside"):
        flce_kernel()(x, w, torch.full_like(t, 10))
    with pytest.raises(ValueError, match="bias"):
        flce_kernel()(x, w, t, torch.zeros(3, device=DEV))
    with pytest.raises(ValueError, match="share a dtype"):
        flce_kernel()(x, w.half(), t)
    huge_v = torch.zeros(1, 8, device=DEV).expand(2**31, 8)  # a view: no memory behind it
    with pytest.raises(ValueError, match="vocabulary"):
        flce_kernel()(x, huge_v, t)


def test_ce_kernel_grid_stride_matches_one_program_per_row():
    # the CE kernel on a persistent grid (fewer programs than rows, each looping with a grid
    # stride) gives the same bits as one program per row, out-of-range targets included
    from kassay.kernels import _flce_launch as kflce

    g = torch.Generator().manual_seed(12)
    n, v = 11, 300
    z0 = torch.randn(n, v, generator=g).to(DEV)
    t = torch.randint(0, v, (n,), generator=g)
    t[2], t[5], t[9] = II, v + 7, -3
    t = t.to(DEV)
    scale = torch.rand(n, generator=g).to(DEV)
    outs = []
    for programs in (None, 3):
        z = z0.clone()
        loss, zl, lse = (torch.empty(n, device=DEV) for _ in range(3))
        kflce._launch_ce(
            z, t, loss, zl, lse, scale, True, V=v, ignore_index=II, label_smoothing=0.1,
            z_loss_scale=1e-3, softcap=None, compute_grad=True, programs=programs,
        )  # fmt: skip
        outs.append((z, loss, zl, lse))
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)
    assert torch.isfinite(outs[0][0]).all() and torch.isfinite(outs[0][1]).all()


@pytest.mark.parametrize("v", [40, 64, 100, 128, 300])  # interpreter BLOCK_V is 64
@pytest.mark.parametrize("ls,cap", [(0.0, None), (0.1, None), (0.1, 3.0)])
def test_ce_kernel_paired_blocks_match_single(v, ls, cap):
    # two blocks per loop step (one rescale per pair) against one: same values up to float32
    # rounding, for rows shorter than one block, exactly one, one and a half, several
    from kassay.kernels import _flce_launch as kflce

    g = torch.Generator().manual_seed(v)
    n = 5
    z0 = (torch.randn(n, v, generator=g) * 4).to(DEV)
    t = torch.randint(0, v, (n,), generator=g)
    t[1] = II
    t = t.to(DEV)
    scale = torch.rand(n, generator=g).to(DEV)
    outs = []
    for pair in (False, True):
        z = z0.clone()
        loss, zl, lse = (torch.empty(n, device=DEV) for _ in range(3))
        kflce._launch_ce(
            z, t, loss, zl, lse, scale, True, V=v, ignore_index=II, label_smoothing=ls,
            z_loss_scale=1e-3, softcap=cap, compute_grad=True, cfg=FlceConfig(ce_pair=pair),
        )  # fmt: skip
        outs.append((z, loss, zl, lse))
    for a, b in zip(*outs, strict=True):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("v", [40, 64, 128, 192, 300])  # interpreter BLOCK_V 64: tails and none
@pytest.mark.parametrize("ls,cap,zls", [(0.0, None, 0.0), (0.1, None, 1e-3), (0.2, 3.0, 1e-2)])
def test_ce_kernel_against_float64(v, ls, cap, zls):
    # the CE kernel alone (unmasked full steps + masked tail, paired or not) against float64
    from kassay.kernels import _flce_launch as kflce

    g = torch.Generator().manual_seed(v + 1)
    n = 6
    z0 = torch.randn(n, v, generator=g) * 4
    t = torch.randint(0, v, (n,), generator=g)
    t[2] = II
    t[4] = v - 1  # the last column: in the tail whenever there is one
    scale = torch.rand(n, generator=g) + 0.5
    zd = z0.double()
    zc = cap * torch.tanh(zd / cap) if cap is not None else zd
    lse_ref = torch.logsumexp(zc, dim=1)
    valid = t != II
    ts = t.clamp_min(0)
    z_t = zc.gather(1, ts[:, None])[:, 0]
    loss_ref = lse_ref - (1 - ls) * z_t - ls / v * zc.sum(1) + zls * lse_ref**2
    loss_ref = torch.where(valid, loss_ref, 0.0)
    p = torch.softmax(zc, dim=1) * (1 + 2 * zls * lse_ref)[:, None]
    d_ref = p - ls / v - (1 - ls) * F.one_hot(ts, v).double()
    if cap is not None:
        d_ref = d_ref * (1 - (zc / cap) ** 2)
    d_ref = d_ref * torch.where(valid, scale.double(), 0.0)[:, None]
    # with or without L2 eviction hints (ignored by the interpreter, but the code path compiles)
    for pair, hints in [(False, False), (True, False), (True, True)]:
        z = z0.clone().to(DEV)
        loss, zl, lse = (torch.empty(n, device=DEV) for _ in range(3))
        kflce._launch_ce(
            z, t.to(DEV), loss, zl, lse, scale.to(DEV), True, V=v, ignore_index=II,
            label_smoothing=ls, z_loss_scale=zls, softcap=cap, compute_grad=True,
            cfg=FlceConfig(ce_pair=pair, ce_l2_hints=hints),
        )  # fmt: skip
        torch.testing.assert_close(lse.cpu().double()[valid], lse_ref[valid], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(loss.cpu().double(), loss_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(z.cpu().double(), d_ref, rtol=1e-4, atol=1e-6)


def test_config_reaches_the_pass(monkeypatch):
    # the config's memory budget sets the number of chunks (one CE launch each) unless the
    # call's keyword overrides it; gw_accumulation="cublas" (addmm_ in float16 per chunk)
    # rounds grad_weight differently from the float32 accumulator of "auto"
    from kassay.kernels import _flce_autograd

    x, w, t, b = _inputs(64, 32, 77, torch.float16, True, 0.1, 13)
    go = torch.tensor(1.0, device=DEV)
    small = 8 * 77 * 2  # 8 logits rows: 8 chunks
    launches = []
    launch_ce = _flce_autograd._launch_ce

    def counted(*a, **kw):
        launches.append(kw["cfg"])
        launch_ce(*a, **kw)

    monkeypatch.setattr(_flce_autograd, "_launch_ce", counted)

    def grads(**kw):
        launches.clear()
        gw = run_grads(
            lambda xx, ww, tt, bb: flce_kernel()(xx, ww, tt, bb, return_z_loss=True, **kw),
            x, w, t, b, go,
        )[3]  # fmt: skip
        return gw, len(launches)

    assert grads()[1] == 1
    by_keyword, n = grads(memory_budget_bytes=small)
    assert n == 8
    cfg = FlceConfig(memory_budget_bytes=small)
    by_config, n = grads(config=cfg)
    assert n == 8 and launches[0] is cfg
    assert torch.equal(by_keyword, by_config)
    assert grads(config=cfg, memory_budget_bytes=10**9)[1] == 1  # the keyword wins
    drifting, n = grads(config=FlceConfig(memory_budget_bytes=small, gw_accumulation="cublas"))
    assert n == 8 and not torch.equal(drifting, by_config)
    # the module keeps and passes its config
    mod = FusedLinearCrossEntropyLoss(config=cfg)
    launches.clear()
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    mod(xr, wr, t, b).backward()
    assert len(launches) == 8 and torch.equal(wr.grad, by_config)


def test_config_is_frozen_and_checked():
    import dataclasses

    cfg = FlceConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.use_tma_gemm = False  # type: ignore[misc]
    assert dataclasses.replace(cfg, use_tma_gemm=False).use_tma_gemm is False
    for bad in (
        dict(memory_budget_bytes=0),
        dict(gw_accumulation="bf16"),
        dict(grads_fused_max_last_wave=1.5),
        dict(gemm_config_gpu=(128, 256, 64)),
        dict(ce_config_gpu=(4096, 16, 0.5)),
    ):
        with pytest.raises(ValueError):
            FlceConfig(**bad)
    x, w, t, _ = _inputs(4, 8, 10, torch.float32, False, 0.0, 9)
    with pytest.raises(ValueError, match="FlceConfig"):
        flce_kernel()(x, w, t, config={"use_tma_gemm": False})
