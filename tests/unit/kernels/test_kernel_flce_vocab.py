"""CPU tests (Triton interpreter, float32/float16) of kassay flce's vocabulary-panel schedule.

The schedule (`kassay.kernels._flce_vocab`) recomputes the logits panel by panel in backward;
every option of the row schedule must hold there under the same baseline policy against a
float64 reference, with several panels, with and without the float32 grad_x accumulator held in
grad_weight's tail rows. The bfloat16 and AMP runs are in tests/gpu/test_kernel_flce_gpu.py.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from flce_reference import (
    II,
    argmax_hits,
    check_against_reference,
    check_options,
    flce_kernel,
    random_case,
)

from kassay.kernels import FlceConfig
from kassay.kernels._flce_launch import plan_schedule
from kassay.kernels._flce_vocab import (
    _kept_layout,
    plan_backward,
    plan_kept,
    scratch_rows,
    tail_rows,
)

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
    reason="needs TRITON_INTERPRET=1 (set by tests/conftest.py on hosts without a GPU)",
)

DEV = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
#: the vocabulary schedule, panels as narrow as the budget says (the shipped floor is 64), and
#: forward panels of 32 columns: at these small shapes the forward then keeps the logits of
#: grad_W's first columns for the backward (`plan_kept`; at the shipped 8192 it keeps none)
VOCAB = FlceConfig(schedule="vocab", vocab_min_cols=1, vocab_forward_max_cols=32)
#: the same, every backward panel's logits recomputed
RECOMPUTE = dataclasses.replace(VOCAB, vocab_keep_logits=False)


def _inputs(n, h, v, dtype, bias, ign, seed=0, weights=False):
    return random_case(
        n, h, v, dtype, bias, ign, seed, wscale=2, gen_device="cpu", device=DEV,
        class_weights=weights,
    )  # fmt: skip


def _go(n, red, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) if red == "none" else torch.tensor(1.0)).to(DEV)


def _budget(n, cols, dtype):
    return n * cols * torch.empty((), dtype=dtype).element_size()


# (bias, label_smoothing, ignore_fraction, softcap, z_loss_scale)
OPTIONS = [
    (False, 0.0, 0.0, None, 0.0),
    (True, 0.1, 0.3, None, 0.0),
    (False, 0.0, 0.3, 5.0, 1e-2),
    (True, 0.2, 0.5, 3.0, 1e-3),
    (False, 0.1, 1.0, None, 1e-3),  # every target ignored
]


DTYPES = [torch.float32, torch.float16]
REDUCTIONS = ["mean", "sum", "none"]
# V=123: 2N rows (N for float32) of grad_W hold the grad_x accumulator, so the walk has a tail;
# V=40: no room, the accumulator is separate
SHAPES = [(24, 123, 20), (24, 40, 16)]


def _pairs(*axes: list) -> list[tuple]:
    """Every pair of the first two axes, the others cycled through: each option meets each
    reduction, each dtype each shape, at a quarter of the full grid's interpreter time."""
    first, second, *rest = axes
    cases = []
    for i, a in enumerate(first):
        for j, b in enumerate(second):
            # axis r steps every (r+1)-th of `second`: two cycled axes drift apart
            cases.append((a, b, *(ax[(i + j // (r + 1)) % len(ax)] for r, ax in enumerate(rest))))
    return cases


@pytest.mark.parametrize(
    "opts,red,dtype,shape,cfg", _pairs(OPTIONS, REDUCTIONS, DTYPES, SHAPES, [VOCAB, RECOMPUTE])
)
def test_grid(opts, red, dtype, shape, cfg):
    bias, ls, ign, cap, zls = opts
    n, v, cols = shape
    x, w, t, b = _inputs(n, 16, v, dtype, bias, ign)
    check_against_reference(
        x, w, t, b, _go(n, red), ls=ls, red=red, cap=cap, zls=zls, budget=_budget(n, cols, dtype),
        factor=1.25, floor=4 * torch.finfo(dtype).eps, config=cfg,
    )  # fmt: skip


@pytest.mark.parametrize("opts,dtype,red", _pairs(OPTIONS[1:4], DTYPES, ["mean", "none"]))
def test_panels_in_grad_weights_unwritten_rows(opts, dtype, red):
    bias, ls, ign, cap, zls = opts
    # H=64: backward panels live in grad_W's own unwritten rows and in grad_x's buffer (64
    # columns); the budget pays for 4 columns, used only where nothing wider is free
    n, h, v = 24, 64, 300
    _, panels = plan_backward(n, h, v, 4, dtype, dtype, dtype, bias, VOCAB)
    assert {p.where for p in panels} >= {"rows", "gx"}
    x, w, t, b = _inputs(n, h, v, dtype, bias, ign)
    check_against_reference(
        x, w, t, b, _go(n, red), ls=ls, red=red, cap=cap, zls=zls, budget=_budget(n, 4, dtype),
        factor=1.25, floor=4 * torch.finfo(dtype).eps, config=VOCAB,
    )  # fmt: skip


def test_inplace_panels_with_one_gradient_only():
    # grad_W alone (no accumulator: one walk, panels in grad_W's rows, then the budget's) and
    # grad_x alone (no grad_W rows to borrow: panels in grad_x's buffer): the same gradients
    # as with both
    n, h, v = 24, 64, 300
    x, w, t, b = _inputs(n, h, v, torch.float32, True, 0.2, seed=4)
    kw = dict(label_smoothing=0.1, memory_budget_bytes=_budget(n, 4, torch.float32), config=VOCAB)
    xs, ws, bs = (a.clone().requires_grad_() for a in (x, w, b))
    flce_kernel()(xs, ws, t, bs, **kw).backward()
    wr, br = w.clone().requires_grad_(), b.clone().requires_grad_()
    flce_kernel()(x, wr, t, br, **kw).backward()
    xr = x.clone().requires_grad_()
    flce_kernel()(xr, w, t, b, **kw).backward()
    torch.testing.assert_close(wr.grad, ws.grad, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(br.grad, bs.grad, rtol=1e-6, atol=1e-8)
    # grad_x alone walks other panels than with grad_W: float32 sums in another order
    torch.testing.assert_close(xr.grad, xs.grad, rtol=1e-4, atol=1e-7)


def _check_kept(n, h, v, cdt, gw_dt, gx_dt, cfg):
    """`plan_kept`'s layout on a model of grad_W's rows: the kept logits sit past the kept
    columns' own rows, clear of each other, of the accumulator's tail and of the forward's
    buffer for the other columns, which fits its panels."""
    kp = plan_kept(n, h, v, cdt, gw_dt, gx_dt is not None, cfg) if gw_dt is not None else None
    if kp is None:
        return None
    kept, rest_row, rest_cols = kp
    k = kept[-1][1]
    r = tail_rows(n, h, v, cols=1, gw_dtype=gw_dt) if gx_dt is not None else 0
    owner = [None] * v
    for v0, v1, row in kept:
        s = scratch_rows(n, h, v1 - v0, cdt, gw_dt)
        assert row >= k and row + s <= v - r, "kept logits on a kept row or the tail"
        assert (row * h * gw_dt.itemsize) % 16 == 0
        for i in range(row, row + s):
            assert owner[i] is None, "two kept panels share a row"
            owner[i] = v0
    rest_rows = scratch_rows(n, h, rest_cols, cdt, gw_dt)
    assert rest_row + rest_rows <= v, "the forward's buffer runs past grad_W"
    assert all(owner[i] is None for i in range(rest_row, rest_row + rest_rows))
    assert rest_cols >= min(1024, cfg.vocab_forward_max_cols, v - k)
    return kept


def _check_plan(n, h, v, cols, cdt, gw_dt, gx_dt, need_gb, cfg):
    """Replay `plan_backward`'s panels on a model of the memory: every gradient of every column
    comes from exactly one panel, and no panel's logits sit on bytes still needed (with the
    forward's kept logits, where `plan_kept` keeps any)."""
    kept = _check_kept(n, h, v, cdt, gw_dt, gx_dt, cfg)
    r, panels = plan_backward(n, h, v, cols, cdt, gw_dt, gx_dt, need_gb, cfg, kept)
    if kept:
        assert [(p.v0, p.v1, p.row) for p in panels[: len(kept)]] == kept
        assert all(p.where == "kept" for p in panels[: len(kept)])
        assert all(p.where != "kept" for p in panels[len(kept) :])
    written = [False] * v  # grad_W rows written so far
    counts = {"gx": [0] * v, "gw": [0] * v, "gb": [0] * v}
    rounded = False
    for pn in panels:
        assert 0 <= pn.v0 < pn.v1 <= v
        if not pn.gx and gx_dt is not None:
            rounded = True  # vocab_backward rounds grad_x before the first panel without it
        assert not (pn.gx and rounded), "a grad_x term after grad_x was rounded"
        if pn.where in ("rows", "kept"):
            s = scratch_rows(n, h, pn.v1 - pn.v0, cdt, gw_dt)
            span = range(pn.row, pn.row + s)
            assert pn.row >= pn.v1 and pn.row + s <= v, "scratch overlaps its own rows"
            assert not any(written[i] for i in span), "scratch on a written row"
            if r and not rounded:
                assert pn.row + s <= v - r, "scratch on the live accumulator"
        elif pn.where == "gx":
            assert gx_dt is not None and not rounded
            assert n * (pn.v1 - pn.v0) * cdt.itemsize <= n * h * gx_dt.itemsize
        else:
            assert pn.v1 - pn.v0 <= cols
        for name, on in (("gx", pn.gx), ("gw", pn.gw), ("gb", pn.gb)):
            if on:
                for c in range(pn.v0, pn.v1):
                    counts[name][c] += 1
        if pn.gw:
            if r and not rounded:
                assert pn.v1 <= v - r, "grad_W written over the live accumulator"
            for c in range(pn.v0, pn.v1):
                written[c] = True
    for name, dt in (("gx", gx_dt), ("gw", gw_dt), ("gb", True if need_gb else None)):
        assert counts[name] == [1 if dt is not None else 0] * v, name
    return r, panels


@pytest.mark.parametrize(
    "n,h,v,cols",
    [
        (24, 16, 123, 20),
        (24, 64, 300, 4),
        (3, 5, 101, 8),
        (64, 32, 5000, 16),
        (8192, 2304, 256000, 64),
        (8192, 4096, 128256, 64),
        (24, 16, 40, 16),
    ],
)
@pytest.mark.parametrize("cdt,gw_dt,gx_dt", [
    (torch.float16, torch.float16, torch.float16), (torch.float32, torch.float32, torch.float32),
    (torch.float16, torch.float32, torch.float32), (torch.float16, None, torch.float16),
    (torch.float16, torch.float16, None),
])  # fmt: skip
def test_backward_plan_covers_every_column_once_and_keeps_live_bytes(
    n, h, v, cols, cdt, gw_dt, gx_dt
):
    for cfg in (FlceConfig(), VOCAB, RECOMPUTE, FlceConfig(vocab_inplace_cols=0)):
        _check_plan(n, h, v, cols, cdt, gw_dt, gx_dt, True, cfg)


@pytest.mark.parametrize(
    "shape,gx,frac", [((8192, 4096, 128256), True, 0.28), ((8192, 2304, 256000), True, 0.20),
                      ((8192, 4096, 128256), False, 0.32)],
)  # fmt: skip
def test_the_forward_keeps_a_fifth_to_a_third_of_the_logits_at_the_target_shapes(shape, gx, frac):
    # a kept column costs H + N rows of 16-bit grad_W (its row, its logits): K ~ (V - R)·H/(H + N)
    n, h, v = shape
    bf = torch.bfloat16
    kept = _check_kept(n, h, v, bf, bf, bf if gx else None, FlceConfig())
    k = kept[-1][1]
    r = 2 * n if gx else 0
    assert frac * v <= k <= (v - r) * h / (h + n)
    assert all(v1 - v0 == 8192 for v0, v1, _ in kept[:-1])  # the forward's widest panels
    # nothing kept where the config says so, or where grad_W is not computed (no bytes to use)
    assert (
        plan_kept(n, h, v, bf, bf, gx, dataclasses.replace(FlceConfig(), vocab_keep_logits=False))
        is None
    )
    # the layout helper packs panels one after the other from row K on
    panels, end = _kept_layout(24, 16, 30, 16, torch.float16, torch.float16)
    assert [(a, b) for a, b, _ in panels] == [(0, 16), (16, 30)]
    assert panels[0][2] == 30 and end == panels[1][2] + scratch_rows(
        24, 16, 14, torch.float16, torch.float16
    )


def test_kept_logits_give_the_recomputed_gradients_and_a_second_backward_recomputes():
    # the kept path (logits of the first columns from the forward) against every panel
    # recomputed, with and without grad_x (grad_W alone keeps none); then retain_graph: a second backward finds the kept
    # bytes spent and recomputes, with the same gradients
    n, h, v = 24, 64, 300
    assert plan_kept(n, h, v, torch.float32, torch.float32, True, VOCAB) is not None
    x, w, t, b = _inputs(n, h, v, torch.float32, True, 0.2, seed=7)
    kw = dict(label_smoothing=0.1, softcap=6.0, z_loss_scale=1e-3,
              memory_budget_bytes=_budget(n, 32, torch.float32))  # fmt: skip
    for want_x, want_w in ((True, True), (False, True)):
        grads = []
        for cfg in (VOCAB, RECOMPUTE):
            xs = x.clone().requires_grad_(want_x)
            ws = w.clone().requires_grad_(want_w)
            bs = b.clone().requires_grad_()
            loss = flce_kernel()(xs, ws, t, bs, config=cfg, **kw)
            loss.backward(retain_graph=True)
            first = [a.grad.clone() for a in (xs, ws, bs) if a.requires_grad]
            for a in (xs, ws, bs):
                a.grad = None
            loss.backward()
            second = [a.grad for a in (xs, ws, bs) if a.requires_grad]
            for a, c in zip(first, second, strict=True):
                torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-8)
            grads.append(first)
        for a, c in zip(*grads, strict=True):
            torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-8)


def test_backward_plan_at_the_target_shape_walks_wide_panels():
    # N=8192, H=2304, V=256000, a 1 MiB budget (64 columns): the panels are those of a far
    # larger budget, in grad_W's rows and grad_x's buffer; only the accumulator's 2N rows are
    # walked twice
    n, h, v = 8192, 2304, 256000
    bf = torch.bfloat16
    r, panels = _check_plan(n, h, v, 64, bf, bf, bf, False, FlceConfig())
    assert r == 2 * n
    walked = sum(p.v1 - p.v0 for p in panels)
    assert walked == v + r
    widths = [p.v1 - p.v0 for p in panels if p.gx]
    assert sum(widths) / len(widths) >= 4096
    assert all(p.where != "own" for p in panels if p.gx)


def test_the_tail_is_walked_when_it_should_be():
    assert tail_rows(24, 16, 123, 20, torch.float16) == 48
    assert tail_rows(24, 16, 123, 20, torch.float32) == 24
    assert tail_rows(24, 16, 40, 16, torch.float16) == 0  # 48 rows > V: separate accumulator
    assert tail_rows(3, 5, 101, 8, torch.float16) == 7  # odd offset moved to a 4-byte boundary


@pytest.mark.parametrize("red,ts,dtype", _pairs(REDUCTIONS, [False, True], DTYPES))
def test_class_weights_and_token_scaling(red, ts, dtype):
    n, v = 24, 123
    x, w, t, b, cw = _inputs(n, 16, v, dtype, True, 0.25, seed=5, weights=True)
    out = check_options(
        x, w, t, b, _go(n, red), cw=cw, ls=0.1, red=red, cap=6.0, zls=1e-3, ts=ts,
        budget=_budget(n, 20, dtype), floor=4 * torch.finfo(dtype).eps, config=VOCAB,
    )  # fmt: skip
    hits = argmax_hits(x, w, t, b, 6.0)
    valid = (t != II).sum()
    want = hits if red == "none" else hits.sum() / valid
    tol = 0.0 if dtype == torch.float32 else 1.0 / float(valid)
    assert float((out.token_accuracy.double() - want).abs().max()) <= tol + 1e-7


def test_argmax_ties_across_panels_go_to_the_first_column():
    h, v = 8, 260
    g = torch.Generator().manual_seed(0)
    w = torch.randn(v, h, generator=g) * 0.1
    x = torch.randn(6, h, generator=g).abs() + 1.0
    for c in (3, 70, 200):  # identical largest logits, in three different panels of 50
        w[c] = torch.ones(h)
    t = torch.tensor([3, 70, 200, 3, II, 5])
    out = flce_kernel()(
        x.to(DEV), w.to(DEV), t.to(DEV), reduction="none", return_token_accuracy=True,
        memory_budget_bytes=6 * 50 * 4, config=VOCAB,
    )  # fmt: skip
    assert out.token_accuracy.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]


def test_same_results_as_the_row_schedule():
    # two correct schedules: the loss agrees to float32 rounding, the gradients to a few ulp
    x, w, t, b = _inputs(32, 16, 150, torch.float32, True, 0.2, seed=3)
    outs = []
    for cfg, budget in ((FlceConfig(schedule="rows"), 7 * 150 * 4), (VOCAB, 32 * 33 * 4)):
        xr, wr, br = (a.clone().requires_grad_() for a in (x, w, b))
        loss = flce_kernel()(
            xr, wr, t, br, label_smoothing=0.1, z_loss_scale=1e-3, softcap=8.0,
            memory_budget_bytes=budget, config=cfg,
        )  # fmt: skip
        loss.backward()
        outs.append((loss.detach(), xr.grad, wr.grad, br.grad))
    for a, c in zip(*outs, strict=True):
        torch.testing.assert_close(a, c, rtol=2e-5, atol=1e-7)


def test_autocast_fp32_params_fp16():
    x, w, t, b = _inputs(20, 16, 60, torch.float32, True, 0.1, seed=5)
    for bias in (None, b):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        br = None if bias is None else bias.clone().requires_grad_()
        with torch.autocast(DEV, dtype=torch.float16):
            loss = flce_kernel()(xr, wr, t, br, memory_budget_bytes=20 * 16 * 2, config=VOCAB)
        loss.backward()
        assert xr.grad.dtype == wr.grad.dtype == torch.float32
        assert br is None or br.grad.dtype == torch.float32
        xs, ws, bs = (a.clone().requires_grad_() if a is not None else None for a in (x, w, bias))
        with torch.autocast(DEV, dtype=torch.float16):
            want = flce_kernel()(xs, ws, t, bs, config=FlceConfig(schedule="rows"))
        want.backward()
        torch.testing.assert_close(loss, want, rtol=1e-3, atol=1e-4)
        torch.testing.assert_close(xr.grad, xs.grad, rtol=2e-2, atol=1e-4)
        torch.testing.assert_close(wr.grad, ws.grad, rtol=2e-2, atol=1e-4)


def test_no_grad_and_partial_grads():
    x, w, t, b = _inputs(16, 16, 90, torch.float32, True, 0.1, seed=6)
    kw = dict(memory_budget_bytes=16 * 25 * 4, config=VOCAB)
    with torch.no_grad():
        plain = flce_kernel()(x, w, t, b, **kw)
    xr = x.clone().requires_grad_()  # only grad_x asked: no grad_W buffer, separate accumulator
    loss = flce_kernel()(xr, w, t, b, **kw)
    loss.backward()
    torch.testing.assert_close(loss.detach(), plain)
    wr = w.clone().requires_grad_()  # only grad_W
    flce_kernel()(x, wr, t, b, **kw).backward()
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    flce_kernel()(xs, ws, t, b, **kw).backward()
    torch.testing.assert_close(xr.grad, xs.grad)
    torch.testing.assert_close(wr.grad, ws.grad)


def test_out_of_range_targets_raise_and_leave_inputs_alone():
    x, w, t, _ = _inputs(8, 16, 30, torch.float32, False, 0.0, seed=2)
    bad = t.clone()
    bad[3] = 30
    w0 = w.clone()
    with pytest.raises(ValueError, match="outside \\[0, V=30\\)"):
        flce_kernel()(x, w, bad, memory_budget_bytes=8 * 8 * 4, config=VOCAB)
    assert torch.equal(w, w0)


def test_plan_schedule_picks_by_cost_and_fit():
    big = dict(n=8192, h=4096, v=128256, elem_bytes=2)
    # the default budget: row chunks of 1792 rows, as shipped
    p = plan_schedule(**big, budget_bytes=470 * 2**20)
    assert p.schedule == "rows" and p.rows == 1792
    # 10 MiB: 40 rows per chunk would read and write grad_W 200 times; panels of 640 columns
    p = plan_schedule(**big, budget_bytes=10 * 2**20)
    assert p.schedule == "vocab" and p.cols == 640 and p.work_bytes <= 10 * 2**20
    # no gradients: nothing to accumulate, both 2·N·H·V; a tie goes to the row schedule
    assert plan_schedule(**big, budget_bytes=470 * 2**20, grads=False).schedule == "rows"
    # forced schedules, and a budget below both plans' floors takes the leaner
    assert plan_schedule(**big, budget_bytes=10 * 2**20, schedule="rows").schedule == "rows"
    p = plan_schedule(**big, budget_bytes=2**20, schedule="auto", min_cols=64)
    assert p.schedule == "vocab" and p.cols == 64 and p.work_bytes <= 2**20
    # below the narrowest panel only the row schedule fits (4 rows: 1 MiB - 1 byte)
    p = plan_schedule(**big, budget_bytes=2**20 - 1, schedule="auto", min_cols=64)
    assert p.schedule == "rows" and p.work_bytes <= 2**20
    tiny = plan_schedule(**big, budget_bytes=1, min_cols=64)
    assert tiny.work_bytes == min(128256 * 2, 8192 * 64 * 2)


@pytest.mark.parametrize(
    "shape,mib,fpb,keep,want",
    [
        # the H100 curve of 2026-12-07 with the kept logits
        # (bench/results/flce-budgets-h100-2026-12-07-run4.json): the vocabulary schedule ran
        # 51.7-52.5 ms (shape 1) and 62.6-64.4 ms (shape 2) at any budget; the row schedule
        # 63.0 / 54.5 / 48.7 ms at 62.6 / 93.9 / 125.2 MiB (shape 1), 76.3 / 63.3 / 57.8 ms at
        # 125 / 187.5 / 250 MiB (shape 2): the planner must take the faster one at each
        ((8192, 4096, 128256), 62.6, 200.0, True, "vocab"),
        ((8192, 4096, 128256), 93.9, 200.0, True, "vocab"),
        ((8192, 4096, 128256), 125.2, 200.0, True, "rows"),
        ((8192, 2304, 256000), 125.0, 200.0, True, "vocab"),
        ((8192, 2304, 256000), 187.5, 200.0, True, "vocab"),
        ((8192, 2304, 256000), 250.0, 200.0, True, "rows"),
        # every panel recomputed (run2 of that day: vocab 57.3 / 67.4 ms at any budget; rows
        # 62.2 / 54.4 ms at 62.6 / 93.9 MiB, 75.0 / 63.6 ms at 125 / 187.5 MiB)
        ((8192, 4096, 128256), 62.6, 200.0, False, "vocab"),
        ((8192, 4096, 128256), 93.9, 200.0, False, "rows"),
        ((8192, 2304, 256000), 125.0, 200.0, False, "vocab"),
        ((8192, 2304, 256000), 187.5, 200.0, False, "rows"),
    ],
)
def test_plan_schedule_follows_the_measured_curve(shape, mib, fpb, keep, want):
    n, h, v = shape
    p = plan_schedule(n, h, v, 2, int(mib * 2**20), flop_per_byte=fpb, keep_logits=keep)
    assert p.schedule == want


def test_config_schedule_is_checked():
    with pytest.raises(ValueError, match="schedule must be"):
        FlceConfig(schedule="columns")
    with pytest.raises(ValueError, match="vocab_min_cols"):
        dataclasses.replace(FlceConfig(), vocab_min_cols=0)


def test_auto_budget_and_plan_call():
    from kassay.kernels import plan_call

    x, w, t, _ = _inputs(8, 16, 30, torch.float32, False, 0.0, seed=2)
    # off CUDA "auto" is the config's budget; the plan names what the call runs
    assert plan_call(x, w, memory_budget_bytes="auto") == plan_call(x, w)
    assert plan_call(x, w).schedule == "rows"
    lean = plan_call(x, w, memory_budget_bytes=8 * 10 * 4, config=VOCAB)
    assert (lean.schedule, lean.cols) == ("vocab", 10)
    auto = flce_kernel()(x, w, t, memory_budget_bytes="auto")
    torch.testing.assert_close(auto, flce_kernel()(x, w, t))
    for bad in ("Auto", 0, -5, 1.5, True):
        with pytest.raises(ValueError, match="memory_budget_bytes must be"):
            flce_kernel()(x, w, t, memory_budget_bytes=bad)
