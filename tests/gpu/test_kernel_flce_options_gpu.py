"""GPU tests (bf16, AMP) of kassay flce's Liger-parity options: ce_weight, use_token_scaling,
return_token_accuracy, accum_dtype. Against torch's weighted cross-entropy in float64 under the
baseline policy; the fp32/fp16 interpreter runs are in tests/unit/kernels/test_kernel_flce_options.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from flce_reference import (
    II,
    argmax_hits,
    check_options,
    flce_kernel,
    options_loss_fn,
    random_case,
    rel_l2,
    run_grads,
)

from kassay.kernels import FlceOutput

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _inputs(n, h, v, dtype, bias, ignore_frac, seed=0, wscale=3.0):
    return random_case(
        n, h, v, dtype, bias, ignore_frac, seed,
        wscale=wscale, gen_device="cuda", device="cuda", class_weights=True,
    )  # fmt: skip


def _go(n, red):
    g = torch.Generator(device="cuda").manual_seed(1)
    if red == "none":
        return torch.randn(n, device="cuda", generator=g)
    return torch.tensor(1.0, device="cuda")


# (weighted, token scaling, label smoothing, reduction, softcap, z-loss, bias, ignore fraction)
GRID = [
    (True, False, 0.0, "mean", None, 0.0, False, 0.1),
    (True, False, 0.1, "mean", None, 0.0, True, 0.3),
    (True, False, 0.1, "sum", 20.0, 1e-3, False, 0.3),
    (True, False, 0.2, "none", None, 1e-3, True, 0.1),
    (False, True, 0.0, "mean", None, 0.0, False, 0.1),
    (False, True, 0.1, "none", 20.0, 1e-3, True, 0.3),
    (True, True, 0.1, "mean", 20.0, 1e-3, True, 0.3),
    (True, True, 0.0, "sum", None, 0.0, False, 1.0),  # every target ignored
]


@pytest.mark.parametrize("cw_on,ts,ls,red,cap,zls,bias,ign", GRID)
@pytest.mark.parametrize("chunks", [1, 6])
def test_bf16_options(cw_on, ts, ls, red, cap, zls, bias, ign, chunks):
    n, h, v = 300, 256, 4099
    x, w, t, b, cw = _inputs(n, h, v, torch.bfloat16, bias, ign)
    budget = None if chunks == 1 else 50 * v * 2
    out = check_options(
        x, w, t, b, _go(n, red), cw=cw if cw_on else None, ls=ls, red=red, cap=cap, zls=zls,
        ts=ts, budget=budget, floor=1e-4,
    )  # fmt: skip
    _check_accuracy(out, x, w, t, b, cap, red)


@pytest.mark.parametrize("red", ["mean", "none"])
def test_bf16_options_many_chunks_tma_path(red):
    # 16-byte aligned rows, 9 chunks: TMA grad_weight kernel, the scaled float16 accumulator
    # (its bound with class weights), the last chunk's GEMM deferred to backward
    n, h, v = 520, 256, 4104
    x, w, t, b, cw = _inputs(n, h, v, torch.bfloat16, True, 0.1)
    check_options(
        x, w, t, b, _go(n, red), cw=cw, ls=0.1, red=red, cap=30.0, zls=1e-4, ts=True,
        budget=64 * v * 2, factor=1.25, floor=1e-4,
    )  # fmt: skip


def _check_accuracy(out, x, w, t, b, cap, red):
    assert isinstance(out, FlceOutput)
    hits = argmax_hits(x, w, t, b, cap)
    valid = int((t != II).sum())
    # bf16 logits decide near-ties differently from float64: allow 2% of the rows (eager's
    # argmax over its bf16 logits is held to the same)
    z = F.linear(x, w, b).float()
    if cap is not None:
        z = cap * torch.tanh(z / cap)
    eager = ((z.argmax(-1) == t) & (t != II)).double()
    for got in (
        out.token_accuracy.double(),
        eager if red == "none" else eager.sum() / max(valid, 1),
    ):
        want = hits if red == "none" else hits.sum() / max(valid, 1)
        if red == "none":
            assert float((got - want).abs().sum()) <= max(2, 0.02 * valid)
        else:
            assert abs(float(got - want)) <= 0.02 + 1e-7


@pytest.mark.parametrize("amp", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
def test_autocast_options(amp, bias):
    # float32 parameters under autocast: gradients in float32, every option on
    n, h, v = 256, 128, 3001
    x, w, t, b, cw = _inputs(n, h, v, torch.float32, bias, 0.2)
    kw = dict(cw=cw, ls=0.1, red="mean", cap=20.0, zls=1e-3, ts=True)
    d = torch.float64
    ref = run_grads(
        lambda xx, ww, tt, bb: options_loss_fn(xx, ww, tt, bb, **{**kw, "cw": cw.to(d)}),
        x.to(d), w.to(d), t, None if b is None else b.to(d), torch.tensor(1.0, device="cuda"),
    )  # fmt: skip
    with torch.autocast("cuda", dtype=amp):
        eag = run_grads(
            lambda xx, ww, tt, bb: options_loss_fn(xx, ww, tt, bb, **kw),
            x, w, t, b, torch.tensor(1.0, device="cuda"),
        )  # fmt: skip
        holder = {}

        def kassay(xx, ww, tt, bb):
            out = flce_kernel()(
                xx, ww, tt, bb, ce_weight=cw, label_smoothing=0.1, softcap=20.0,
                z_loss_scale=1e-3, return_z_loss=True, use_token_scaling=True,
                return_token_accuracy=True, memory_budget_bytes=64 * v * 2,
            )  # fmt: skip
            holder["out"] = out
            return out.loss, out.z_loss

        got = run_grads(kassay, x, w, t, b, torch.tensor(1.0, device="cuda"))
    for name, r, e, k in zip(("loss", "z_loss", "gx", "gw", "gb"), ref, eag, got, strict=True):
        if r is None:
            continue
        if name.startswith("g"):
            assert k.dtype == torch.float32, name
        assert rel_l2(k, r) <= 1.5 * rel_l2(e, r) + 1e-4, name
    _check_accuracy(holder["out"], x, w, t, b, 20.0, "mean")


def _gw_error(x, w, t, cw, budget, accum_dtype, schedule="auto"):
    from kassay.kernels.flce_config import FlceConfig

    wr = w.clone().requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    flce_kernel()(
        x, wr, t, ce_weight=cw, memory_budget_bytes=budget, accum_dtype=accum_dtype,
        config=FlceConfig(schedule=schedule),
    ).backward()  # fmt: skip
    torch.cuda.synchronize()
    return wr.grad, (torch.cuda.max_memory_allocated() - before)


@pytest.mark.parametrize("schedule", ["rows", "vocab"])
@pytest.mark.parametrize("weighted", [False, True])
def test_accum_dtype_float32_bf16_error_and_memory(weighted, schedule):
    # rows: 32 chunks of 64 rows: the default scaled-float16 accumulator and the float32 one
    # asked by accum_dtype are both near eager's one-GEMM error; float32 costs V·H·2 bytes more.
    # vocab: every grad_weight row is one GEMM over all N rows (no accumulator at all), so
    # accum_dtype changes neither the error nor the peak. (With schedule="auto" this 1 MiB
    # budget picks the vocab schedule, which is why the schedule is pinned here.)
    n, h, v = 2048, 512, 8192
    x, w, t, _, cw = _inputs(n, h, v, torch.bfloat16, False, 0.1, wscale=1.0)
    cw = cw if weighted else None
    d = torch.float64
    ref = run_grads(
        lambda xx, ww, tt, bb: options_loss_fn(xx, ww, tt, bb, cw=None if cw is None else cw.to(d)),
        x.to(d), w.to(d), t, None, torch.tensor(1.0, device="cuda"),
    )[3]  # fmt: skip
    eager = run_grads(
        lambda xx, ww, tt, bb: options_loss_fn(xx, ww, tt, bb, cw=cw),
        x, w, t, None, torch.tensor(1.0, device="cuda"),
    )[3]  # fmt: skip
    budget = 64 * v * 2
    g_def, m_def = _gw_error(x, w, t, cw, budget, None, schedule)
    g_f32, m_f32 = _gw_error(x, w, t, cw, budget, torch.float32, schedule)
    e_eager, e_def, e_f32 = rel_l2(eager, ref), rel_l2(g_def, ref), rel_l2(g_f32, ref)
    print(f"grad_weight rel-L2: eager {e_eager:.4e} default {e_def:.4e} float32 {e_f32:.4e}")
    print(f"peak extra: default {m_def / 2**20:.1f} MiB, float32 {m_f32 / 2**20:.1f} MiB")
    assert e_f32 <= 1.02 * e_eager + 1e-6
    if schedule == "rows":
        assert e_def <= 1.25 * e_eager
        assert m_f32 - m_def >= 0.9 * v * h * 2
    else:
        assert e_def <= 1.02 * e_eager + 1e-6
        assert abs(m_f32 - m_def) <= 0.05 * v * h * 2


def test_accum_dtype_float32_at_the_target_shape():
    # N=8192, H=4096, V=128256: 5 chunks; the float32 accumulator (V·H·4 bytes, and the bf16
    # gradient written from it in backward) adds at most V·H·4 bytes to the default's 1.47 GiB
    n, h, v = 8192, 4096, 128256
    x, w, t, _, _ = _inputs(n, h, v, torch.bfloat16, False, 0.1, wscale=1.0)
    flce_kernel()(x, w.clone().requires_grad_(), t, accum_dtype=torch.float32).backward()
    g, peak = _gw_error(x, w, t, None, 470 * 2**20, torch.float32)
    print(f"accum_dtype=float32 peak extra {peak / 2**30:.3f} GiB")
    assert torch.isfinite(g).all()
    assert peak / 2**30 <= 1.5 + v * h * 4 / 2**30 + 0.05


def test_options_at_the_target_shape_keep_memory():
    # class weights, token scaling and accuracy add O(N + V) bytes, nothing of V·H or N·V
    n, h, v = 8192, 4096, 128256
    x, w, t, _, cw = _inputs(n, h, v, torch.bfloat16, False, 0.1, wscale=1.0)
    wr, xr = w.clone().requires_grad_(), x.clone().requires_grad_()
    kw = dict(ce_weight=cw, use_token_scaling=True, return_token_accuracy=True, label_smoothing=0.1)
    flce_kernel()(xr, wr, t, **kw).loss.backward()
    xr.grad = wr.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = flce_kernel()(xr, wr, t, **kw)
    out.loss.backward()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - before) / 2**30
    print(f"all options peak extra {peak:.4f} GiB, token accuracy {float(out.token_accuracy):.5f}")
    assert peak <= 1.5
    assert torch.isfinite(wr.grad).all() and torch.isfinite(xr.grad).all()
