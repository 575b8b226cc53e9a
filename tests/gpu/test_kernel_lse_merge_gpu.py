"""kassay's LSE-merge Triton kernels on CUDA: bfloat16 outs and the benchmark shapes.

Marked ``gpu``; skipped without CUDA. References are float64 torch on the device, chunked over
the K states. Result buffers are poisoned (NaN) through the caching allocator before each call,
so an element the kernel leaves unwritten shows up as NaN.
"""

from __future__ import annotations

import pytest
import torch

from kassay.kernels.lse_merge import merge_state_, merge_states

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

NEG_INF = float("-inf")
POS_INF = float("inf")
DEV = "cuda"


def _to_bsh(lse: torch.Tensor, layout: str) -> torch.Tensor:
    return lse.transpose(-1, -2) if layout == "hT" else lse


def ref_merge(
    outs: torch.Tensor, lses: torch.Tensor, layout: str
) -> tuple[torch.Tensor, torch.Tensor]:
    lb = _to_bsh(lses, layout).double()
    lb = torch.where(lb == POS_INF, NEG_INF, lb)
    lse = torch.logsumexp(lb, dim=0)
    out = torch.zeros(outs.shape[1:], dtype=torch.float64, device=outs.device)
    for i in range(outs.shape[0]):
        w = torch.where(torch.isneginf(lb[i]), 0.0, torch.exp(lb[i] - lse))
        out += torch.where(w[..., None] > 0, w[..., None] * outs[i].double(), 0.0)
    return out, _to_bsh(lse, layout)


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    den = ref.norm().item()
    return (x - ref).norm().item() / (den if den > 0 else 1.0)


def check_lse(lse: torch.Tensor, ref: torch.Tensor, rtol: float = 2**-23) -> None:
    assert not torch.isnan(lse).any()
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref))
    fin = torch.isfinite(ref)
    err = (lse.double()[fin] - ref[fin]).abs()
    tol = ref[fin].abs().clamp_min(1.0) * rtol * 1.5
    assert bool((err <= tol).all()), f"lse off by {err.max().item()}"


def poison(nbytes: int) -> None:
    """Leave NaN in the caching allocator's free blocks, so fresh outputs start as NaN."""
    blk = torch.full((nbytes // 4 + 1024,), float("nan"), device=DEV)
    del blk


def make_states(
    k: int, batch: tuple[int, ...], s: int, hh: int, d: int, *, dtype, layout, regime, seed
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=DEV).manual_seed(seed)
    outs = torch.randn((k, *batch, s, hh, d), generator=g, device=DEV).to(dtype)
    lb = torch.randn((k, *batch, s, hh), generator=g, device=DEV) * 2.0 + 3.0
    if regime in ("huge", "huge_empty"):
        lb = 1e4 + torch.randn((k, *batch, s, hh), generator=g, device=DEV) * 3.0
        if seed % 2:
            lb = -lb
    if regime in ("empty", "huge_empty"):
        u = torch.rand((k, *batch, s, hh), generator=g, device=DEV)
        lb = torch.where(u < 0.3, NEG_INF, lb)
        lb = torch.where((u >= 0.3) & (u < 0.4), POS_INF, lb)
        all_empty = torch.rand((*batch, s, hh), generator=g, device=DEV) < 0.2
        lb[:, all_empty] = NEG_INF
        outs = torch.where(torch.isinf(lb)[..., None], torch.nan, outs.float()).to(dtype)
    return outs, _to_bsh(lb, layout).contiguous()


OUT_TOL = {torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 2e-6}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("layout", ["hT", "Th"])
@pytest.mark.parametrize("regime", ["normal", "huge", "empty", "huge_empty"])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_merge_states_small(dtype, layout, regime, k) -> None:
    outs, lses = make_states(k, (3,), 37, 5, 64, dtype=dtype, layout=layout, regime=regime, seed=k)
    ref_o, ref_l = ref_merge(outs, lses, layout)
    poison(outs[0].numel() * 4 * 2)
    out, lse = merge_states(outs, lses, lse_layout=layout)
    assert not torch.isnan(out).any()
    check_lse(lse, ref_l)
    # bf16: one rounding of the fp32 sum (rel-L2 of a uniform rounding ~ 2^-9 / sqrt(3))
    assert rel_l2(out, ref_o) <= OUT_TOL[dtype] / 2


@pytest.mark.parametrize("d", [64, 80, 128, 256])
def test_merge_states_head_dims_noncontiguous(d) -> None:
    k, b, s, hh = 3, 2, 129, 8
    outs_full, lses = make_states(
        k, (b,), s, 2 * hh, d, dtype=torch.bfloat16, layout="Th", regime="empty", seed=d
    )
    outs = outs_full[..., ::2, :]  # heads strided
    lses_v = lses[..., ::2].transpose(-1, -2)  # an "hT" view of Th data
    ref_o, ref_l = ref_merge(outs, lses_v, "hT")
    poison(outs[0].numel() * 8)
    out, lse = merge_states(outs, lses_v, lse_layout="hT")
    assert not torch.isnan(out).any()
    check_lse(lse, ref_l)
    assert rel_l2(out, ref_o) <= 4e-3


@pytest.mark.parametrize("layout", ["hT", "Th"])
@pytest.mark.parametrize("regime", ["normal", "empty"])
def test_benchmark_shape_kway_and_steps(layout, regime) -> None:
    # T=32768, Hh=32, D=128, bf16 out, fp32 lse; K=2 and K=8.
    t, hh, d = 32768, 32, 128
    for k in (2, 8):
        outs, lses = make_states(
            k, (), t, hh, d, dtype=torch.bfloat16, layout=layout, regime=regime, seed=100 + k
        )
        ref_o, ref_l = ref_merge(outs, lses, layout)
        poison(outs[0].numel() * 4)
        out, lse = merge_states(outs, lses, lse_layout=layout)
        assert not torch.isnan(out).any()
        check_lse(lse, ref_l)
        err_kway = rel_l2(out, ref_o)
        assert err_kway <= 4e-3
        # K-1 in-place steps, with and without an fp32 accumulator
        errs = {}
        for use_acc in (False, True):
            acc_o, acc_l = outs[0].clone(), lses[0].clone()
            acc = outs[0].float() if use_acc else None
            ptr = acc_o.data_ptr()
            for i in range(1, k):
                merge_state_(acc_o, acc_l, outs[i], lses[i], lse_layout=layout, acc=acc)
            assert acc_o.data_ptr() == ptr
            assert not torch.isnan(acc_o).any()
            check_lse(acc_l, ref_l, rtol=2**-23 * k)
            errs[use_acc] = rel_l2(acc_o, ref_o)
        # fp32 acc matches one K-way merge; bf16 accumulation grows with K but stays bounded
        assert errs[True] <= err_kway * 1.05 + 1e-6
        assert errs[False] <= err_kway * (k - 1) * 1.5
        del outs, lses, ref_o, ref_l


@pytest.mark.parametrize("layout", ["hT", "Th"])
def test_second_half_benchmark_shape(layout) -> None:
    t, hh, d = 32768, 32, 128
    outs, lses = make_states(
        2, (), t, hh, d, dtype=torch.bfloat16, layout=layout, regime="empty", seed=7
    )
    h0 = t // 2
    out, lse = outs[0].clone(), lses[0].clone()
    before_o, before_l = out.clone(), lse.clone()
    step_o = outs[1][h0:].clone()
    step_l = (lses[1][:, h0:] if layout == "hT" else lses[1][h0:]).clone()
    merge_state_(out, lse, step_o, step_l, lse_layout=layout, second_half=True)
    lb, lb0 = _to_bsh(lse, layout), _to_bsh(before_l, layout)
    assert torch.equal(out[:h0].view(torch.int16), before_o[:h0].view(torch.int16))
    assert torch.equal(lb[:h0].view(torch.int32), lb0[:h0].view(torch.int32))
    sub_l = lses[..., h0:] if layout == "hT" else lses[:, h0:]
    ref_o, ref_l = ref_merge(outs[:, h0:], sub_l, layout)
    assert not torch.isnan(out[h0:]).any()
    assert rel_l2(out[h0:], ref_o) <= 4e-3
    check_lse(_to_bsh(lb[h0:], layout), ref_l)


def test_batch_dims_and_unmergeable_strides() -> None:
    outs, lses = make_states(
        3, (2, 3), 100, 4, 128, dtype=torch.bfloat16, layout="hT", regime="normal", seed=5
    )
    outs_v = outs.transpose(1, 2)  # [K, 3, 2, S, Hh, D]: batch dims not mergeable
    lses_v = lses.transpose(1, 2)
    ref_o, ref_l = ref_merge(outs_v, lses_v, "hT")
    out, lse = merge_states(outs_v, lses_v)
    check_lse(lse, ref_l)
    assert rel_l2(out, ref_o) <= 4e-3
    acc_o, acc_l = outs_v[0].clone(), lses_v[0].clone()
    for i in (1, 2):
        merge_state_(acc_o, acc_l, outs_v[i], lses_v[i])
    assert rel_l2(acc_o, ref_o) <= 1e-2


@pytest.mark.parametrize("k", [2, 4, 8])
@pytest.mark.parametrize("layout", ["hT", "Th"])
@pytest.mark.parametrize("cap", [32, 40, 48])
def test_register_cap_changes_nothing(k: int, layout: str, cap: int) -> None:
    # A register cap (Triton maxnreg) may make the compiler spill; results must be bit-identical.
    from kassay.kernels.lse_merge import MergeConfig

    g = torch.Generator(device=DEV).manual_seed(k + cap)
    outs = torch.randn(k, 2, 96, 6, 128, device=DEV, generator=g).to(torch.bfloat16)
    shape = (k, 2, 6, 96) if layout == "hT" else (k, 2, 96, 6)
    lses = torch.randn(*shape, device=DEV, generator=g) * 5
    lses[0, :, :3] = NEG_INF
    free = merge_states(outs, lses, lse_layout=layout, config=MergeConfig(max_registers=0))
    capped = merge_states(outs, lses, lse_layout=layout, config=MergeConfig(max_registers=cap))
    assert torch.equal(free[0], capped[0])
    assert torch.equal(free[1], capped[1])
    acc = [outs[0].clone(), lses[0].clone()]
    merge_state_(*acc, outs[1], lses[1], lse_layout=layout, config=MergeConfig(max_registers=cap))
    ref = [outs[0].clone(), lses[0].clone()]
    merge_state_(*ref, outs[1], lses[1], lse_layout=layout)
    assert torch.equal(acc[0], ref[0]) and torch.equal(acc[1], ref[1])
