"""kassay's LSE-merge Triton kernels on the CPU (Triton interpreter), float32 and float16 outs.

Every check is against a float64 torch reference computed here (the op module's reference is
tested by the engine-level tests). Sizes are tiny: the interpreter is slow.
"""

from __future__ import annotations

import math

import pytest
import torch

from kassay.kernels.lse_merge import MergeConfig, merge_state, merge_state_, merge_states

# The interpreter evaluates 1/0 and log(0) of empty rows in numpy before tl.where picks the
# -inf/0 branch; numpy warns about it. The kernels' results are checked, the warnings are noise.
pytestmark = pytest.mark.filterwarnings(
    "ignore:divide by zero:RuntimeWarning",
    "ignore:invalid value:RuntimeWarning",
    "ignore:overflow encountered:RuntimeWarning",
)

NEG_INF = float("-inf")
POS_INF = float("inf")


# ------------------------------------------------------------------------------------ helpers


def _to_bsh(lse: torch.Tensor, layout: str) -> torch.Tensor:
    return lse.transpose(-1, -2) if layout == "hT" else lse


def ref_merge(
    outs: torch.Tensor, lses: torch.Tensor, layout: str, posinf_is_empty: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 reference: outs [K, ..., S, Hh, D], lses [K, ..., (Hh, S) | (S, Hh)]."""
    lb = _to_bsh(lses.double(), layout)
    if posinf_is_empty:
        lb = torch.where(lb == POS_INF, NEG_INF, lb)
    lse = torch.logsumexp(lb, dim=0)  # all -inf -> -inf
    w = torch.where(torch.isneginf(lb), 0.0, torch.exp(lb - lse))
    # an empty state contributes nothing, whatever garbage (NaN) its out rows hold
    out = torch.where(w[..., None] > 0, w[..., None] * outs.double(), 0.0).sum(0)
    return out, _to_bsh(lse, layout)


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    den = ref.norm().item()
    return (x - ref).norm().item() / (den if den > 0 else 1.0)


def lse_close(lse: torch.Tensor, ref: torch.Tensor, rtol: float = 2**-23) -> None:
    """Same infinities; finite values within ~1 float32 ulp of the float64 truth."""
    assert not torch.isnan(lse).any()
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref)), "empty-row marks differ"
    err = (lse.double()[fin] - ref[fin]).abs()
    tol = ref[fin].abs().clamp_min(1.0) * rtol * 1.5
    assert (err <= tol).all(), f"lse off by {err.max().item()}"


OUT_RTOL = {torch.float32: 2e-6, torch.float16: 1e-3}


def make_states(
    k: int,
    batch: tuple[int, ...],
    s: int,
    hh: int,
    d: int,
    *,
    dtype: torch.dtype,
    layout: str,
    regime: str,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """outs [K, *batch, S, Hh, D] in dtype and lses float32 in layout, for a regime."""
    g = torch.Generator().manual_seed(seed)
    outs = torch.randn((k, *batch, s, hh, d), generator=g).to(dtype)
    lb = torch.randn((k, *batch, s, hh), generator=g) * 2.0 + 3.0
    if regime == "huge":
        sign = 1.0 if seed % 2 == 0 else -1.0
        lb = sign * 1e4 + torch.randn((k, *batch, s, hh), generator=g) * 3.0
    elif regime == "empty":
        u = torch.rand((k, *batch, s, hh), generator=g)
        lb = torch.where(u < 0.3, NEG_INF, lb)
        lb = torch.where((u >= 0.3) & (u < 0.4), POS_INF, lb)  # FA2's empty-row mark
        all_empty = torch.rand((*batch, s, hh), generator=g) < 0.25
        lb[:, all_empty] = NEG_INF
        lb.view(k, -1)[:, 0] = NEG_INF  # at least one row empty in every state
        # garbage in empty states' outs must not leak into the result
        outs = torch.where(torch.isinf(lb)[..., None], torch.nan, outs.float()).to(dtype)
    lses = _to_bsh(lb, layout).contiguous()
    return outs, lses


# ------------------------------------------------------------------------------- merge_states


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("layout", ["hT", "Th"])
@pytest.mark.parametrize("regime", ["normal", "huge", "empty"])
@pytest.mark.parametrize("k", [2, 3])  # K = 2 runs on the two-state kernel, K = 3 on the K-way one
def test_merge_states_regimes(dtype: torch.dtype, layout: str, regime: str, k: int) -> None:
    outs, lses = make_states(k, (2,), 5, 3, 16, dtype=dtype, layout=layout, regime=regime, seed=1)
    out, lse = merge_states(outs, lses, lse_layout=layout)
    ref_o, ref_l = ref_merge(outs, lses, layout)
    assert out.dtype == dtype and out.shape == ref_o.shape
    assert lse.dtype == torch.float32 and lse.shape == ref_l.shape
    assert not torch.isnan(out).any()
    lse_close(lse, ref_l)
    assert rel_l2(out, ref_o) <= OUT_RTOL[dtype]
    if regime == "empty":
        empty = torch.isneginf(_to_bsh(ref_l, layout))
        assert empty.any()
        assert (out[empty] == 0).all()


@pytest.mark.parametrize("k", [1, 2, 5])
def test_merge_states_k_and_no_batch(k: int) -> None:
    outs, lses = make_states(
        k, (), 7, 2, 8, dtype=torch.float32, layout="hT", regime="normal", seed=k
    )
    out, lse = merge_states(outs, lses)
    ref_o, ref_l = ref_merge(outs, lses, "hT")
    assert out.shape == (7, 2, 8) and lse.shape == (2, 7)
    assert rel_l2(out, ref_o) <= 2e-6
    lse_close(lse, ref_l)


def test_merge_states_two_batch_dims_odd_d_and_sequences() -> None:
    outs, lses = make_states(
        2, (2, 3), 3, 2, 12, dtype=torch.float32, layout="Th", regime="empty", seed=3
    )
    out, lse = merge_states(list(outs), list(lses), lse_layout="Th")
    ref_o, ref_l = ref_merge(outs, lses, "Th")
    assert out.shape == (2, 3, 3, 2, 12) and lse.shape == (2, 3, 3, 2)
    assert rel_l2(out, ref_o) <= 2e-6
    lse_close(lse, ref_l)


@pytest.mark.parametrize("k", [2, 3])
def test_merge_states_noncontiguous(k: int) -> None:
    # outs: heads strided (every other head of a bigger buffer), batch and seq permuted.
    b, s, hh, d = 2, 4, 3, 16
    g = torch.Generator().manual_seed(7)
    big = torch.randn(k, s, b, 2 * hh, d, generator=g)
    outs = big[:, :, :, ::2, :].transpose(1, 2)  # [K, B, S, Hh, D], non-contiguous
    # lses "hT" as a transposed view of a [K, B, S, Hh] buffer
    lses = (torch.randn(k, b, s, hh, generator=g) * 3).transpose(-1, -2)
    assert not outs.is_contiguous() and not lses.is_contiguous()
    out, lse = merge_states(outs, lses, lse_layout="hT")
    ref_o, ref_l = ref_merge(outs, lses, "hT")
    assert rel_l2(out, ref_o) <= 2e-6
    lse_close(lse, ref_l)


def test_merge_states_unmergeable_batch_dims() -> None:
    # Batch dims whose strides cannot be flattened into one: the launcher walks them.
    k, s, hh, d = 2, 3, 2, 8
    base = torch.randn(k, 3, 2, s, hh, d)
    outs = base.transpose(1, 2)  # [K, 2, 3, S, Hh, D] with non-mergeable batch strides
    lses = (torch.randn(k, 3, 2, hh, s) * 2).transpose(1, 2)
    out, lse = merge_states(outs, lses)
    ref_o, ref_l = ref_merge(outs, lses, "hT")
    assert rel_l2(out, ref_o) <= 2e-6
    lse_close(lse, ref_l)


@pytest.mark.parametrize("k", [2, 4])  # K = 2: the pair kernel (float32) and K-way (out_dtype)
def test_merge_states_out_dtype_and_accumulate(k: int) -> None:
    outs, lses = make_states(
        k, (1,), 6, 2, 16, dtype=torch.float32, layout="hT", regime="normal", seed=9
    )
    ref_o, _ = ref_merge(outs, lses, "hT")
    out16, _ = merge_states(outs, lses, out_dtype=torch.float16)
    assert out16.dtype == torch.float16 and rel_l2(out16, ref_o) <= 1e-3
    out16s, _ = merge_states(outs.half(), lses, accumulate="out_dtype")
    ref16, _ = ref_merge(outs.half(), lses, "hT")
    assert out16s.dtype == torch.float16
    # rounding after every state: worse than one rounding but bounded by K roundings
    assert rel_l2(out16s, ref16) <= k * 1e-3
    out32, _ = merge_states(outs.half(), lses, out_dtype=torch.float32)
    assert out32.dtype == torch.float32 and rel_l2(out32, ref16) <= 2e-6


@pytest.mark.parametrize("base", [-1e4, 1e4])
def test_huge_lse_after_empty_states(base: float) -> None:
    # Rows whose first finite state comes after empty ones, at |lse| ~ 1e4: the running
    # maximum starts at -inf and must not turn into exp(+1e4) or 0 * inf.
    k, s, hh, d = 4, 6, 2, 8
    g = torch.Generator().manual_seed(31)
    outs = torch.randn(k, s, hh, d, generator=g)
    lb = base + torch.randn(k, s, hh, generator=g) * 3
    lb[:3, 0] = NEG_INF  # only the last state
    lb[:2, 1] = NEG_INF
    lb[0, 2] = POS_INF
    lb[1:, 3] = NEG_INF  # only the first state
    lb[:, 4] = NEG_INF  # all empty
    lses = lb.transpose(-1, -2).contiguous()
    ref_o, ref_l = ref_merge(outs, lses, "hT")
    out, lse = merge_states(outs, lses)
    assert not torch.isnan(out).any()
    assert rel_l2(out, ref_o) <= 2e-6
    lse_close(lse, ref_l)
    acc_o, acc_l = outs[0].clone(), lses[0].clone()
    for i in range(1, k):
        merge_state_(acc_o, acc_l, outs[i], lses[i])
    assert not torch.isnan(acc_o).any()
    assert rel_l2(acc_o, ref_o) <= 1e4 * 2**-24 * k
    lse_close(acc_l, ref_l, rtol=2**-22 * k)


def test_posinf_option() -> None:
    outs, lses = make_states(
        2, (), 4, 2, 8, dtype=torch.float32, layout="hT", regime="normal", seed=4
    )
    lses[0, 0, 1] = POS_INF
    out, lse = merge_states(outs, lses)  # default: +inf is an empty row
    assert torch.isfinite(lse).all()
    assert torch.allclose(out[1, 0].double(), outs[1, 1, 0].double(), atol=1e-6)
    out_raw, lse_raw = merge_states(outs, lses, posinf_is_empty=False)
    assert lse_raw[0, 1] == POS_INF and torch.isnan(out_raw[1, 0]).all()
    assert torch.isfinite(out_raw[0]).all()


def test_nan_lse_propagates() -> None:
    outs, lses = make_states(
        2, (), 3, 1, 8, dtype=torch.float32, layout="hT", regime="normal", seed=5
    )
    lses[1, 0, 2] = float("nan")
    out, lse = merge_states(outs, lses)
    assert torch.isnan(lse[0, 2]) and torch.isnan(out[2, 0]).all()
    assert torch.isfinite(lse[0, :2]).all()


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        ({"lse_layout": "TH"}, "lse_layout"),
        ({"out_dtype": torch.int32}, "out_dtype"),
        ({"accumulate": "bf16"}, "accumulate"),
    ],
)
def test_merge_states_bad_options(kwargs: dict, msg: str) -> None:
    outs, lses = make_states(
        2, (), 3, 2, 8, dtype=torch.float32, layout="hT", regime="normal", seed=0
    )
    with pytest.raises(ValueError, match=msg):
        merge_states(outs, lses, **kwargs)


def test_merge_states_bad_inputs() -> None:
    outs, lses = make_states(
        2, (), 3, 2, 8, dtype=torch.float32, layout="hT", regime="normal", seed=0
    )
    with pytest.raises(ValueError, match="lses has shape"):
        merge_states(outs, lses, lse_layout="Th")
    with pytest.raises(ValueError, match="float32"):
        merge_states(outs, lses.double())
    with pytest.raises(ValueError, match="float16, bfloat16 or float32"):
        merge_states(outs.to(torch.int32), lses)
    with pytest.raises(ValueError, match="contiguous in its last dim"):
        merge_states(outs.transpose(-1, -2).contiguous().transpose(-1, -2)[..., :2, :], lses)
    with pytest.raises(ValueError, match="at least 4 dims"):
        merge_states(outs[0, 0], lses[0])


# ------------------------------------------------------------------------------- merge_state_


def _run_steps(
    outs: torch.Tensor,
    lses: torch.Tensor,
    layout: str,
    *,
    use_acc: bool,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge K states as K-1 in-place steps into an accumulator that starts as state 0."""
    out = outs[0].to(out_dtype or outs.dtype).clone()
    lse = lses[0].clone()
    acc = outs[0].float().clone() if use_acc else None
    ptr_o, ptr_l = out.data_ptr(), lse.data_ptr()
    for i in range(1, outs.shape[0]):
        assert merge_state_(out, lse, outs[i], lses[i], lse_layout=layout, acc=acc) is None
    assert out.data_ptr() == ptr_o and lse.data_ptr() == ptr_l  # same storage: in place
    return out, lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("layout", ["hT", "Th"])
@pytest.mark.parametrize("regime", ["normal", "huge", "empty"])
def test_merge_state_inplace_steps(dtype: torch.dtype, layout: str, regime: str) -> None:
    k = 3
    outs, lses = make_states(k, (2,), 4, 3, 16, dtype=dtype, layout=layout, regime=regime, seed=11)
    ref_o, ref_l = ref_merge(outs, lses, layout)
    out, lse = _run_steps(outs, lses, layout, use_acc=False)
    assert not torch.isnan(out).any()
    # In-place steps keep lse in float32 between steps: at |lse| ~ 1e4 its rounding (half an
    # ulp, ~5e-4) enters the next step's weights. That is the contract's own limit.
    lse_rtol = 2**-23 * (k - 1) if regime != "huge" else 2**-22 * (k - 1)
    lse_close(lse, ref_l, rtol=lse_rtol)
    tol = OUT_RTOL[dtype] * (k - 1)
    if regime == "huge":
        tol = max(tol, 1e4 * 2**-24 * (k - 1))
    assert rel_l2(out, ref_o) <= tol


def test_merge_state_acc_matches_kway_and_beats_out_dtype() -> None:
    k = 6
    outs, lses = make_states(
        k, (1,), 8, 2, 32, dtype=torch.float16, layout="hT", regime="normal", seed=12
    )
    ref_o, ref_l = ref_merge(outs, lses, "hT")
    kway, _ = merge_states(outs, lses)
    with_acc, lse_acc = _run_steps(outs, lses, "hT", use_acc=True)
    no_acc, _ = _run_steps(outs, lses, "hT", use_acc=False)
    # fp32 acc: the same as one K-way merge up to one fp16 rounding step
    diff = (with_acc.float() - kway.float()).abs()
    assert (diff <= kway.float().abs() * 2**-10 + 2**-24).all()
    assert rel_l2(with_acc, ref_o) <= 1e-3
    assert rel_l2(with_acc, ref_o) <= rel_l2(no_acc, ref_o)
    lse_close(lse_acc, ref_l, rtol=2**-23 * k)


@pytest.mark.parametrize("layout", ["hT", "Th"])
def test_merge_state_second_half(layout: str) -> None:
    b, s, hh, d = 2, 7, 3, 16
    outs, lses = make_states(
        2, (b,), s, hh, d, dtype=torch.float32, layout=layout, regime="empty", seed=13
    )
    out, lse = outs[0].clone(), lses[0].clone()
    out_before, lse_before = out.clone(), lse.clone()
    h0 = s // 2
    step_o = outs[1][:, h0:].clone()
    step_l = (lses[1][..., h0:] if layout == "hT" else lses[1][:, h0:]).clone()
    acc = out.float().clone()
    acc_before = acc.clone()
    merge_state_(out, lse, step_o, step_l, lse_layout=layout, second_half=True, acc=acc)
    # first half bit-identical (NaN-aware: empty states carry NaN garbage)
    assert torch.equal(out[:, :h0].isnan(), out_before[:, :h0].isnan())
    assert torch.equal(out[:, :h0].nan_to_num(), out_before[:, :h0].nan_to_num())
    assert torch.equal(acc[:, :h0].nan_to_num(), acc_before[:, :h0].nan_to_num())
    lb, lb0 = _to_bsh(lse, layout), _to_bsh(lse_before, layout)
    assert torch.equal(lb[:, :h0], lb0[:, :h0])
    # second half = merge of the two states there
    sub_o = outs[:, :, h0:]
    sub_l = lses[..., h0:] if layout == "hT" else lses[:, :, h0:]
    ref_o, ref_l = ref_merge(sub_o, sub_l, layout)
    assert rel_l2(out[:, h0:], ref_o) <= 2e-6
    assert rel_l2(acc[:, h0:], ref_o) <= 2e-6
    lse_close(_to_bsh(lb[:, h0:], layout), ref_l)


def test_merge_state_noncontiguous_and_empty_accumulator() -> None:
    # The accumulator starts empty (lse -inf, out garbage); views are non-contiguous.
    b, s, hh, d = 2, 5, 2, 8
    buf = torch.full((s, b, hh, d), float("nan"))
    out = buf.transpose(0, 1)  # [B, S, Hh, D], non-contiguous
    lse_buf = torch.full((b, s, hh), NEG_INF)
    lse = lse_buf.transpose(-1, -2)  # "hT" view
    outs, lses = make_states(
        3, (b,), s, hh, d, dtype=torch.float32, layout="hT", regime="normal", seed=14
    )
    for i in range(3):
        merge_state_(out, lse, outs[i], lses[i])
    ref_o, ref_l = ref_merge(outs, lses, "hT")
    assert rel_l2(out, ref_o) <= 4e-6
    lse_close(lse, ref_l, rtol=2**-22)
    assert torch.equal(out, buf.transpose(0, 1))  # the caller's buffers hold the result
    assert torch.equal(lse, lse_buf.transpose(-1, -2))


def test_merge_state_all_empty_gives_zero_and_neg_inf() -> None:
    out = torch.full((3, 2, 8), float("nan"), dtype=torch.float16)
    lse = torch.full((2, 3), POS_INF)  # FA2's mark
    step_o = torch.full((3, 2, 8), float("nan"), dtype=torch.float16)
    step_l = torch.full((2, 3), NEG_INF)
    merge_state_(out, lse, step_o, step_l)
    assert (out == 0).all() and torch.isneginf(lse).all()


def test_merge_state_bad_inputs() -> None:
    out = torch.zeros(4, 2, 8)
    lse = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="out_step has shape"):
        merge_state_(out, lse, torch.zeros(3, 2, 8), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="second_half"):
        merge_state_(out, lse, torch.zeros(4, 2, 8), lse, second_half=True)
    with pytest.raises(ValueError, match="lse has shape"):
        merge_state_(out, torch.zeros(4, 2), out, lse)
    with pytest.raises(ValueError, match="lse_step has shape"):
        merge_state_(out, lse, out, torch.zeros(4, 2))
    with pytest.raises(ValueError, match="acc must be a float32"):
        merge_state_(out, lse, out, lse, acc=torch.zeros(4, 2, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="acc has shape"):
        merge_state_(out, lse, out, lse, acc=torch.zeros(4, 2, 4))
    with pytest.raises(ValueError, match="lse_layout"):
        merge_state_(out, lse, out, lse, lse_layout="ht")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="float32"):
        merge_state_(out, lse.half(), out, lse)


def test_huge_lse_no_overflow_two_states() -> None:
    # log(exp(a)+exp(b)) overflows past 88 in float32; the shifted form is exact.
    out = torch.ones(1, 1, 4)
    lse = torch.tensor([[800.0]])
    merge_state_(out, lse, torch.full((1, 1, 4), 3.0), torch.tensor([[800.0]]))
    assert math.isclose(lse.item(), 800.0 + math.log(2.0), rel_tol=2**-23)
    assert torch.allclose(out, torch.full((1, 1, 4), 2.0))


@pytest.mark.parametrize("layout", ["hT", "Th"])
@pytest.mark.parametrize("posinf_is_empty", [True, False])
def test_pair_kernel_matches_kway_kernel(layout: str, posinf_is_empty: bool) -> None:
    # K = 2 runs on the two-state kernel by default; the K-way kernel must give the same result.
    outs, lses = make_states(
        2, (3,), 6, 4, 24, dtype=torch.float32, layout=layout, regime="empty", seed=5
    )
    lses[1, 0] = torch.where(lses[1, 0] == float("-inf"), float("inf"), lses[1, 0])
    kw = MergeConfig(pair_kernel=False)
    a = merge_states(outs, lses, lse_layout=layout, posinf_is_empty=posinf_is_empty)
    b = merge_states(outs, lses, lse_layout=layout, posinf_is_empty=posinf_is_empty, config=kw)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(torch.isnan(x), torch.isnan(y))
        fin = ~torch.isnan(x)
        assert torch.allclose(x[fin], y[fin], rtol=2e-6, atol=1e-7, equal_nan=False)


@pytest.mark.parametrize(
    "cfg",
    [
        MergeConfig(block_elems=64, num_warps=2, skip_empty_loads=False, tile_tokens=2),
        MergeConfig(block_elems=16, num_warps=1, skip_empty_loads=True, tile_tokens=1),
        MergeConfig(block_elems=128, num_warps=4, skip_empty_loads=False, tile_tokens=4),
        MergeConfig(block_elems=4096, num_warps=4, skip_empty_loads=True, tile_tokens=0),
        MergeConfig(block_elems=2048, num_warps=4, max_registers=32),
    ],
)
@pytest.mark.parametrize("layout", ["hT", "Th"])
def test_launch_configs(cfg: MergeConfig, layout: str) -> None:
    # The tuning knobs the benchmark sweeps must not change results (beyond fp32 rounding).
    outs, lses = make_states(
        3, (2,), 5, 3, 16, dtype=torch.float32, layout=layout, regime="empty", seed=21
    )
    ref_o, ref_l = ref_merge(outs, lses, layout)
    out, lse = merge_states(outs, lses, lse_layout=layout, config=cfg)
    assert not torch.isnan(out).any()
    assert rel_l2(out, ref_o) <= 2e-6
    lse_close(lse, ref_l)
    acc_o, acc_l = outs[0].clone(), lses[0].clone()
    for i in (1, 2):
        merge_state_(acc_o, acc_l, outs[i], lses[i], lse_layout=layout, config=cfg)
    assert not torch.isnan(acc_o).any()
    assert rel_l2(acc_o, ref_o) <= 4e-6
    lse_close(acc_l, ref_l, rtol=2**-22)


# ------------------------------------------------------------------------------- merge_state


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("layout", ["hT", "Th"])
@pytest.mark.parametrize("regime", ["normal", "huge", "empty"])
def test_merge_state_two_states(dtype: torch.dtype, layout: str, regime: str) -> None:
    # FlashInfer-style two-state merge: new tensors, inputs untouched, the K-way merge's values
    outs, lses = make_states(2, (2,), 5, 3, 16, dtype=dtype, layout=layout, regime=regime, seed=8)
    a_out, a_lse, b_out, b_lse = outs[0].clone(), lses[0].clone(), outs[1].clone(), lses[1].clone()
    out, lse = merge_state(a_out, a_lse, b_out, b_lse, lse_layout=layout)
    for t, orig in zip(
        (a_out, a_lse, b_out, b_lse), (outs[0], lses[0], outs[1], lses[1]), strict=True
    ):
        assert torch.equal(t.nan_to_num(), orig.nan_to_num())
    assert out.dtype == dtype and out.is_contiguous() and lse.is_contiguous()
    assert out.data_ptr() != a_out.data_ptr() and lse.data_ptr() != a_lse.data_ptr()
    ref_o, ref_l = ref_merge(outs, lses, layout)
    assert out.shape == ref_o.shape and lse.shape == ref_l.shape
    assert not torch.isnan(out).any()
    lse_close(lse, ref_l)
    assert rel_l2(out, ref_o) <= OUT_RTOL[dtype]
    kway_o, kway_l = merge_states(outs, lses, lse_layout=layout)
    torch.testing.assert_close(out, kway_o, rtol=OUT_RTOL[dtype], atol=OUT_RTOL[dtype])
    torch.testing.assert_close(lse, kway_l, rtol=2e-7, atol=0.0)


def test_merge_state_natural_log_and_views() -> None:
    # equal LSEs weigh the two outs equally and add ln 2 (natural log, not log2's +1); strided
    # views of a [T, 2, Hh, D] buffer (FlashInfer's stacked layout) and a "Th" LSE are accepted
    both = torch.stack([torch.full((3, 2, 4), 1.0), torch.full((3, 2, 4), 3.0)], dim=1)
    lse = torch.full((3, 2, 2), 5.0)
    out, merged = merge_state(both[:, 0], lse[:, 0], both[:, 1], lse[:, 1], lse_layout="Th")
    assert torch.allclose(out, torch.full((3, 2, 4), 2.0))
    assert torch.allclose(merged, torch.full((3, 2), 5.0 + math.log(2.0)))


def test_merge_state_bad_inputs_two_states() -> None:
    a = torch.zeros(4, 2, 8)
    la = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="out_step"):
        merge_state(a, la, torch.zeros(3, 2, 8), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="float32"):
        merge_state(a, la.double(), a, la)
    with pytest.raises(ValueError, match="lse_layout"):
        merge_state(a, la, a, la, lse_layout="TH")


def test_config_keyword_and_deprecated_alias() -> None:
    # config= is the keyword; _config= (its former name) still works, with a warning
    from kassay.kernels.lse_merge import LaunchConfig

    assert LaunchConfig is MergeConfig
    outs, lses = make_states(3, (), 4, 2, 8, dtype=torch.float32, layout="hT", regime="normal",
                             seed=3)  # fmt: skip
    cfg = MergeConfig(block_elems=16, num_warps=1)
    new = merge_states(outs, lses, config=cfg)
    with pytest.warns(DeprecationWarning, match="config="):
        old = merge_states(outs, lses, _config=cfg)
    for x, y in zip(new, old, strict=True):
        assert torch.equal(x, y)
    with pytest.raises(ValueError, match="config= only"):
        merge_states(outs, lses, config=cfg, _config=cfg)
    with pytest.raises(ValueError, match="MergeConfig"):
        merge_states(outs, lses, config={"block_elems": 16})
