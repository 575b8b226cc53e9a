"""Benchmark of kassay's attention-state merge (LSE correction) kernels against peers.

    PYTHONPATH=service python3 bench/lse_merge.py --out bench/results/lse_merge-h200-<date>.json

Times, on one GPU, for bf16 outs and float32 natural-log LSEs:
  * kassay ``merge_states`` (K-way, one pass) and ``merge_state_`` (in-place step: full and second
    half, with and without a float32 accumulator; K-1 steps as a K-way merge);
  * torch baseline: plain torch ops in float32 (max-shifted, correct on empty rows);
  * TransformerEngine-style torch: lse in float64, max + log1p(exp(min - max)) in place, out
    corrected in its own dtype (bf16);
  * ring-flash-attention-style torch: out in float32, out -= sigmoid(lse_b - lse) * (out - out_b),
    lse -= logsigmoid(lse - lse_b);
  * a vLLM-style Triton two-state merge, written here from the formulas (one program per
    (token, head) row; K > 2 as K-1 sequential merges).

Bytes (nominal, as TARGETS.md counts them) = (K+1)·T·Hh·D·2 + (K+1)·T·Hh·4: K states read, one
written. Where an implementation must move more by its design (a float32 accumulator), the
"actual" bytes are counted too. The copy ceiling (bytes read + written by a device-to-device
copy) is measured in the same run. Every case is checked against a float64 reference on freshly
poisoned outputs before it is timed (rel-L2 of out and of the finite lse values, NaN counts,
mismatched infinities). Timing: triton.testing.do_bench, median, L2 flushed between reps; small
shapes are also timed as CUDA-graph replays (all impls alike).

Why it times on its own and not through `kassay run`: it counts the bytes each design must
move (a float32 accumulator's extra traffic) against a copy ceiling measured in the same run,
and times small shapes as graph replays for every impl alike; the engine's device time agrees
with do_bench within 0.3-2.4% on the merges large enough to matter (bench/README.md, "Timing
fidelity"). The side-by-side tables users see come from `kassay run examples/h200.yaml`.

``--smoke`` runs tiny shapes (works on the CPU under TRITON_INTERPRET=1, with a wall clock).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT / "service") not in sys.path:
    sys.path.insert(0, str(_ROOT / "service"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from common import run_meta, save_json  # noqa: E402

from kassay.kernels import lse_merge as km  # noqa: E402

NEG_INF = float("-inf")
POS_INF = float("inf")
CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
Tensor = torch.Tensor


# ------------------------------------------------------------------ vLLM-style Triton two-state


@triton.jit
def _two_state_merge_kernel(
    out_ptr,
    lse_out_ptr,
    a_ptr,
    a_lse_ptr,
    b_ptr,
    b_lse_ptr,
    HH,
    D,
    s_os,
    s_oh,
    s_ls,
    s_lh,
    BLOCK_D: tl.constexpr,
):
    """One program per (token, head): the two-state merge straight from its formulas."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    la = tl.load(a_lse_ptr + t * s_ls + h * s_lh)
    lb = tl.load(b_lse_ptr + t * s_ls + h * s_lh)
    la = tl.where(la == float("inf"), float("-inf"), la)
    lb = tl.where(lb == float("inf"), float("-inf"), lb)
    mx = tl.maximum(la, lb)
    ea = tl.exp(la - mx)
    eb = tl.exp(lb - mx)
    se = ea + eb
    tl.store(lse_out_ptr + t * s_ls + h * s_lh, tl.log(se) + mx)
    d = tl.arange(0, BLOCK_D)
    m = d < D
    row = t * s_os + h * s_oh
    xa = tl.load(a_ptr + row + d, mask=m, other=0.0).to(tl.float32)
    xb = tl.load(b_ptr + row + d, mask=m, other=0.0).to(tl.float32)
    res = xa * (ea / se) + xb * (eb / se)
    tl.store(out_ptr + row + d, res.to(out_ptr.dtype.element_ty), mask=m)


def vllm_two(a: Tensor, la: Tensor, b: Tensor, lb: Tensor, layout: str) -> tuple[Tensor, Tensor]:
    """a, b: [T, Hh, D] contiguous; la, lb in layout, contiguous. Returns new (out, lse)."""
    t, hh, d = a.shape
    out = torch.empty_like(a)
    lse = torch.empty_like(la)
    s_ls, s_lh = (1, t) if layout == "hT" else (hh, 1)
    _two_state_merge_kernel[(t, hh)](
        out, lse, a, la, b, lb, hh, d, *a.stride()[:2], s_ls, s_lh,
        BLOCK_D=triton.next_power_of_2(d), num_warps=1,
    )  # fmt: skip
    return out, lse


# ------------------------------------------------------------------------------- torch peers


def bsh(lse: Tensor, layout: str) -> Tensor:
    return lse.transpose(-1, -2) if layout == "hT" else lse


def torch_fp32_kway(outs: Tensor, lses: Tensor, layout: str) -> tuple[Tensor, Tensor]:
    lb = bsh(lses, layout)
    lb = torch.where(lb == POS_INF, NEG_INF, lb)
    m = lb.amax(0)
    m = torch.where(torch.isinf(m), 0.0, m)
    e = torch.exp(lb - m)
    ssum = e.sum(0)
    lse = torch.where(ssum == 0, NEG_INF, m + torch.log(ssum))
    w = torch.where(ssum == 0, 0.0, e / ssum)
    out = (w[..., None] * outs.float()).nan_to_num(0.0).sum(0).to(outs.dtype)
    return out, bsh(lse, layout).contiguous()


def torch_fp32_step(out: Tensor, lse: Tensor, out_s: Tensor, lse_s: Tensor, layout: str) -> None:
    """In place, plain float32 torch ops."""
    a, b = bsh(lse, layout), bsh(lse_s, layout)
    a2 = torch.where(a == POS_INF, NEG_INF, a)
    b2 = torch.where(b == POS_INF, NEG_INF, b)
    m = torch.maximum(a2, b2)
    m = torch.where(torch.isinf(m), 0.0, m)
    ea, eb = torch.exp(a2 - m), torch.exp(b2 - m)
    ssum = ea + eb
    inv = torch.where(ssum == 0, 0.0, 1.0 / ssum)
    res = (ea * inv)[..., None] * out.float() + (eb * inv)[..., None] * out_s.float()
    out.copy_(res.nan_to_num(0.0))
    a.copy_(torch.where(ssum == 0, NEG_INF, m + torch.log(ssum)))


def te_step(out: Tensor, lse64: Tensor, out_s: Tensor, lse_s: Tensor, layout: str) -> None:
    """TransformerEngine-style in-place step: lse (float64) by max + log1p(exp(min - max)),
    out rescaled and accumulated in its own dtype."""
    a = bsh(lse64, layout)
    b = bsh(lse_s, layout).double()
    mx = torch.maximum(a, b)
    mn = torch.minimum(a, b)
    new = mx + torch.log1p(torch.exp(mn - mx))
    out.mul_(torch.exp(a - new).to(out.dtype)[..., None])
    out.add_(out_s * torch.exp(b - new).to(out.dtype)[..., None])
    a.copy_(new)


def te_kway(outs: Tensor, lses: Tensor, layout: str) -> tuple[Tensor, Tensor]:
    """TE's context-parallel flow: K-1 in-place lse corrections (float64), then the out
    corrections, each an addcmul into an out kept in its own dtype."""
    lse = lses[0].double().clone()
    a = bsh(lse, layout)
    for i in range(1, outs.shape[0]):
        b = bsh(lses[i], layout).double()
        mx, mn = torch.maximum(a, b), torch.minimum(a, b)
        a.copy_(mx + torch.log1p(torch.exp(mn - mx)))
    out = torch.zeros_like(outs[0])
    for i in range(outs.shape[0]):
        w = torch.exp(bsh(lses[i], layout).double() - a).to(out.dtype)
        out.addcmul_(outs[i], w[..., None])
    return out, lse.float()


def ring_update(out32: Tensor, lse_bsh1: Tensor, out_b: Tensor, lse_b: Tensor, layout: str):
    """ring-flash-attention's update: out float32 [.., S, Hh, D], lse float32 [.., S, Hh, 1]."""
    lb = bsh(lse_b, layout).unsqueeze(-1)
    out32 = out32 - torch.sigmoid(lb - lse_bsh1) * (out32 - out_b.float())
    lse_bsh1 = lse_bsh1 - F.logsigmoid(lse_bsh1 - lb)
    return out32, lse_bsh1


def ring_kway(outs: Tensor, lses: Tensor, layout: str) -> tuple[Tensor, Tensor]:
    out = outs[0].float()
    lse = bsh(lses[0], layout).unsqueeze(-1)
    for i in range(1, outs.shape[0]):
        out, lse = ring_update(out, lse, outs[i], lses[i], layout)
    return out.to(outs.dtype), bsh(lse.squeeze(-1), layout).contiguous()


def vllm_kway(outs: Tensor, lses: Tensor, layout: str) -> tuple[Tensor, Tensor]:
    out, lse = outs[0], lses[0]
    for i in range(1, outs.shape[0]):
        out, lse = vllm_two(out, lse, outs[i], lses[i], layout)
    return out, lse


def kassay_steps(outs: Tensor, lses: Tensor, layout: str, use_acc: bool) -> tuple[Tensor, Tensor]:
    out, lse = outs[0].clone(), lses[0].clone()
    acc = outs[0].float() if use_acc else None
    for i in range(1, outs.shape[0]):
        km.merge_state_(out, lse, outs[i], lses[i], lse_layout=layout, acc=acc)
    return out, lse


# ---------------------------------------------------------------------------------- helpers


def make_states(k: int, t: int, hh: int, d: int, layout: str, regime: str, seed: int):
    g = torch.Generator(device=DEV).manual_seed(seed)
    outs = torch.randn((k, t, hh, d), generator=g, device=DEV, dtype=torch.float32)
    lb = torch.randn((k, t, hh), generator=g, device=DEV) * 2.0 + 5.0
    if regime == "empty_rows":
        # 10 % of rows empty in each state (a third of them marked +inf as FA2 does), 2 % of
        # rows empty in every state; empty states' outs hold zeros as FA2 writes them.
        u = torch.rand((k, t, hh), generator=g, device=DEV)
        lb = torch.where(u < 0.067, NEG_INF, lb)
        lb = torch.where((u >= 0.067) & (u < 0.1), POS_INF, lb)
        all_empty = torch.rand((t, hh), generator=g, device=DEV) < 0.02
        lb[:, all_empty] = NEG_INF
        outs = torch.where(torch.isinf(lb)[..., None], 0.0, outs)
    elif regime == "huge":
        lb = 800.0 + torch.randn((k, t, hh), generator=g, device=DEV) * 3.0
    outs = outs.to(torch.bfloat16)
    lses = (lb.transpose(-1, -2) if layout == "hT" else lb).contiguous()
    return outs, lses


def reference(outs: Tensor, lses: Tensor, layout: str) -> tuple[Tensor, Tensor]:
    lb = bsh(lses, layout).double()
    lb = torch.where(lb == POS_INF, NEG_INF, lb)
    lse = torch.logsumexp(lb, dim=0)
    out = torch.zeros(outs.shape[1:], dtype=torch.float64, device=outs.device)
    for i in range(outs.shape[0]):
        w = torch.where(torch.isneginf(lb[i]), 0.0, torch.exp(lb[i] - lse))
        out += torch.where(w[..., None] > 0, w[..., None] * outs[i].double(), 0.0)
    return out, bsh(lse, layout)


def errors(out: Tensor, lse: Tensor, ref_o: Tensor, ref_l: Tensor) -> dict[str, Any]:
    o = out.double()
    nan_out = int(torch.isnan(o).sum())
    den = ref_o.norm().item() or 1.0
    rel_out = (o.nan_to_num(0.0) - ref_o).norm().item() / den if nan_out == 0 else math.nan
    lse = lse.double()
    fin = torch.isfinite(ref_l)
    inf_mismatch = int(((torch.isneginf(lse) != torch.isneginf(ref_l)) | torch.isnan(lse)).sum())
    rl = ref_l[fin]
    dl = lse[fin] - rl
    rel_lse = dl.norm().item() / (rl.norm().item() or 1.0) if torch.isfinite(dl).all() else math.nan
    return {
        "rel_l2_out": rel_out,
        "rel_l2_lse": rel_lse,
        "nan_out": nan_out,
        "lse_inf_or_nan_mismatch": inf_mismatch,
    }


def poison(nbytes: int) -> None:
    if CUDA:
        blk = torch.full((nbytes // 4 + 4096,), float("nan"), device=DEV)
        del blk


def bench(fn: Callable[[], Any], *, graph: bool = False, rep: int = 40) -> float:
    """Median ms. On CUDA: do_bench (L2 flushed between reps), optionally replaying a graph."""
    if not CUDA:
        fn()
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts)
    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        torch.cuda.synchronize()
        return float(triton.testing.do_bench(g.replay, warmup=10, rep=rep, return_mode="median"))
    return float(triton.testing.do_bench(fn, warmup=10, rep=rep, return_mode="median"))


def copy_ceiling_tbps(nbytes: int) -> float:
    x = torch.randn(nbytes // 4, device=DEV)
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x), rep=100)
    return 2 * nbytes / (ms * 1e-3) / 1e12


_COPY_AT: dict[int, float] = {}


def copy_tbps_at(traffic: int) -> float:
    """Copy bandwidth for a copy moving ``traffic`` bytes (read + written), cached by size."""
    key = max(traffic // 2 // 4, 1)
    if key not in _COPY_AT:
        x = torch.randn(key, device=DEV)
        y = torch.empty_like(x)
        _COPY_AT[key] = 8 * key / (bench(lambda: y.copy_(x)) * 1e-3) / 1e12
    return _COPY_AT[key]


def nominal_bytes(k: int, t: int, hh: int, d: int) -> int:
    return (k + 1) * t * hh * d * 2 + (k + 1) * t * hh * 4


@dataclass
class Results:
    meta: dict[str, Any]
    copy_tbps: float = 0.0
    sweep: list[dict[str, Any]] = field(default_factory=list)
    cases: list[dict[str, Any]] = field(default_factory=list)

    def add(self, case: dict[str, Any]) -> None:
        ms = case["ms"]
        case["tbps"] = case["bytes"] / (ms * 1e-3) / 1e12
        case["frac_copy"] = case["tbps"] / self.copy_tbps if self.copy_tbps else None
        case["copy_tbps_same_bytes"] = copy_tbps_at(case["bytes"])  # an eager copy, cached
        case["frac_copy_same_bytes"] = case["tbps"] / case["copy_tbps_same_bytes"]
        if case.get("bytes_actual"):
            case["tbps_actual"] = case["bytes_actual"] / (ms * 1e-3) / 1e12
            case["frac_copy_actual"] = case["tbps_actual"] / self.copy_tbps
        self.cases.append(case)
        print(
            f"  {case['shape']:<22} {case['regime']:<10} {case['mode']:<10} K={case['K']} "
            f"{case['impl']:<22} {ms * 1e3:9.1f} us {case['tbps']:6.2f} TB/s "
            f"err_out={case.get('rel_l2_out', float('nan')):.2e} "
            f"err_lse={case.get('rel_l2_lse', float('nan')):.2e} nan={case.get('nan_out')}",
            flush=True,
        )


# ------------------------------------------------------------------------------------- runs


def run_kway(res: Results, shape: dict[str, int], k: int, regime: str, layout: str,
             impls: list[str], graph: bool = False, seed: int = 0) -> None:  # fmt: skip
    t, hh, d = shape["T"], shape["Hh"], shape["D"]
    outs, lses = make_states(k, t, hh, d, layout, regime, seed)
    ref_o, ref_l = reference(outs, lses, layout)
    nbytes = nominal_bytes(k, t, hh, d)
    fns: dict[str, Callable[[], tuple[Tensor, Tensor]]] = {
        "kassay": lambda: km.merge_states(outs, lses, lse_layout=layout),
        "kassay_steps_bf16": lambda: kassay_steps(outs, lses, layout, False),
        "kassay_steps_fp32acc": lambda: kassay_steps(outs, lses, layout, True),
        "torch_fp32": lambda: torch_fp32_kway(outs, lses, layout),
        "te_style": lambda: te_kway(outs, lses, layout),
        "ring_style": lambda: ring_kway(outs, lses, layout),
        "vllm_style_triton": lambda: vllm_kway(outs, lses, layout),
    }
    el = t * hh * d
    actual = {
        "kassay_steps_bf16": (k - 1) * (3 * el * 2 + 3 * t * hh * 4) + 2 * el * 2,
        "kassay_steps_fp32acc": (k - 1) * (el * 12 + 3 * t * hh * 4) + el * 6,
    }
    sname = f"T={t},Hh={hh},D={d}"
    for name in impls:
        fn = fns[name]
        poison(el * 4 * 2)
        out, lse = fn()
        if CUDA:
            torch.cuda.synchronize()
        err = errors(out, lse, ref_o, ref_l)
        del out, lse
        ms = bench(fn)
        case = {"shape": sname, "T": t, "Hh": hh, "D": d, "K": k, "mode": "kway", "regime": regime,
                "layout": layout, "impl": name, "ms": ms, "bytes": nbytes, **err}  # fmt: skip
        if name in actual:
            case["bytes_actual"] = actual[name]
        res.add(case)
        if graph and CUDA:
            gms = bench(fn, graph=True)
            res.add({**case, "impl": name + "[graph]", "ms": gms, "graph": True})


def run_step(res: Results, shape: dict[str, int], regime: str, layout: str, half: bool,
             impls: list[str], graph: bool = False, seed: int = 0) -> None:  # fmt: skip
    """One in-place step (merge of an accumulator with one new state), full or second half."""
    t, hh, d = shape["T"], shape["Hh"], shape["D"]
    outs, lses = make_states(2, t, hh, d, layout, regime, seed)
    h0 = t // 2 if half else 0
    ts = t - h0
    step_o = outs[1][h0:].contiguous()
    step_l = (lses[1][:, h0:] if layout == "hT" else lses[1][h0:]).contiguous()
    sub_l = lses[..., h0:] if layout == "hT" else lses[:, h0:]
    ref_o, ref_l = reference(outs[:, h0:], sub_l, layout)
    nbytes = nominal_bytes(2, ts, hh, d)
    el = ts * hh * d

    def sl(x: Tensor) -> Tensor:  # the updated half of an accumulator (a view)
        if x.dim() == 3:
            return x[h0:]
        return x[:, h0:] if layout == "hT" else x[h0:]

    def fresh():
        return outs[0].clone(), lses[0].clone()

    state: dict[str, Any] = {}

    def setup(name: str) -> None:
        o, l_ = fresh()
        state.update(o=o, l=l_, acc=outs[0].float() if name == "kassay_fp32acc" else None)
        if name == "te_style":
            state["l64"] = lses[0].double()
        if name == "ring_style":
            state["o32"] = outs[0].float()
            state["l1"] = bsh(lses[0], layout).unsqueeze(-1).clone()

    def call(name: str) -> None:
        o, l_ = state["o"], state["l"]
        if name in ("kassay", "kassay_fp32acc"):
            km.merge_state_(o, l_, step_o, step_l, lse_layout=layout, second_half=half,
                            acc=state["acc"])  # fmt: skip
        elif name == "torch_fp32":
            torch_fp32_step(sl(o), sl(l_), step_o, step_l, layout)
        elif name == "te_style":
            te_step(sl(o), sl(state["l64"]), step_o, step_l, layout)
        elif name == "ring_style":
            o32, l1 = state["o32"], state["l1"]
            no, nl = ring_update(o32[h0:], l1[h0:], step_o, step_l, layout)
            o32[h0:] = no
            l1[h0:] = nl
        elif name == "vllm_style_triton":
            no, nl = vllm_two(o, l_, step_o, step_l, layout)  # full only: out-of-place
            state["o"], state["l"] = no, nl

    def result(name: str) -> tuple[Tensor, Tensor]:
        if name == "te_style":
            return state["o"], state["l64"].float()
        if name == "ring_style":
            return state["o32"].to(outs.dtype), bsh(state["l1"].squeeze(-1), layout)
        return state["o"], state["l"]

    sname = f"T={t},Hh={hh},D={d}"
    mode = "step_half" if half else "step"
    for name in impls:
        if name == "vllm_style_triton" and half:
            continue
        setup(name)
        call(name)
        if CUDA:
            torch.cuda.synchronize()
        o, l_ = result(name)
        err = errors(sl(o), sl(l_), ref_o, ref_l)
        ms = bench(lambda name=name: call(name))
        case = {"shape": sname, "T": t, "Hh": hh, "D": d, "K": 2, "mode": mode, "regime": regime,
                "layout": layout, "impl": name, "ms": ms, "bytes": nbytes, **err}  # fmt: skip
        if name == "kassay_fp32acc":
            case["bytes_actual"] = el * 12 + 3 * ts * hh * 4
        if name == "ring_style":
            case["bytes_actual"] = el * (4 + 2 + 4) + 3 * ts * hh * 4
        res.add(case)
        if graph and CUDA:
            gms = bench(lambda name=name: call(name), graph=True)
            res.add({**case, "impl": name + "[graph]", "ms": gms, "graph": True})
        state.clear()


def run_sweep(res: Results, shape: dict[str, int], configs: list[km.MergeConfig]) -> None:
    t, hh, d = shape["T"], shape["Hh"], shape["D"]
    for regime in ("normal",):
        for k in (2, 4, 8):
            outs, lses = make_states(k, t, hh, d, "hT", regime, 1)
            nb = nominal_bytes(k, t, hh, d)
            ref_o, ref_l = reference(outs, lses, "hT")
            for cfg in configs:
                poison(t * hh * d * 8)
                out, lse = km.merge_states(outs, lses, config=cfg)
                err = errors(out, lse, ref_o, ref_l)
                del out, lse
                ms = bench(lambda c=cfg, o=outs, l_=lses: km.merge_states(o, l_, config=c))
                row = {"mode": "kway", "K": k, "regime": regime, "cfg": cfg.__dict__, "ms": ms,
                       "tbps": nb / ms / 1e9, **err}  # fmt: skip
                res.sweep.append(row)
                print(f"  sweep kway K={k} {regime:<10} {cfg} {ms * 1e3:8.1f} us "
                      f"{row['tbps']:.3f} TB/s err={err['rel_l2_out']:.2e}", flush=True)  # fmt: skip
        # the in-place step
        outs, lses = make_states(2, t, hh, d, "hT", regime, 2)
        nb = nominal_bytes(2, t, hh, d)
        for cfg in configs:
            o, l_ = outs[0].clone(), lses[0].clone()
            po, pl = outs[1], lses[1]
            ms = bench(
                lambda c=cfg, o=o, l_=l_, po=po, pl=pl: km.merge_state_(o, l_, po, pl, config=c)
            )
            row = {"mode": "step", "K": 2, "regime": regime, "cfg": cfg.__dict__, "ms": ms,
                   "tbps": nb / ms / 1e9}  # fmt: skip
            res.sweep.append(row)
            print(f"  sweep step     {regime:<10} {cfg} {ms * 1e3:8.1f} us "
                  f"{row['tbps']:.3f} TB/s", flush=True)  # fmt: skip


def env_meta(argv: list[str]) -> dict[str, Any]:
    return {
        **run_meta(argv),
        "device": torch.cuda.get_device_name() if CUDA else "cpu (interpreter)",
        "kassay_default_config": km.MergeConfig().__dict__,
        "timing": "triton.testing.do_bench median, warmup 10 ms, rep 40 ms, L2 flushed per rep",
        "bytes": "(K+1)*T*Hh*D*2 + (K+1)*T*Hh*4 (K states read, one written)",
    }


def table(res: Results) -> str:
    lines = [
        "| shape | regime | mode | K | layout | impl | µs | TB/s | frac copy | frac same-size copy | "
        "rel-L2 out | rel-L2 lse | NaN out |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in res.cases:
        tb = f"{c['tbps']:.2f}"
        fr = f"{c['frac_copy']:.2f}" if c.get("frac_copy") else "-"
        if c.get("tbps_actual"):
            tb += f" ({c['tbps_actual']:.2f} actual)"
            fr += f" ({c['frac_copy_actual']:.2f})"
        lines.append(
            f"| {c['shape']} | {c['regime']} | {c['mode']} | {c['K']} | {c['layout']} | "
            f"{c['impl']} | {c['ms'] * 1e3:.1f} | {tb} | {fr} | {c['frac_copy_same_bytes']:.2f} | "
            f"{c['rel_l2_out']:.2e} | "
            f"{c['rel_l2_lse']:.2e} | {c['nan_out']} |"
        )
    return "\n".join(lines)


ALL_KWAY = ["kassay", "kassay_steps_bf16", "kassay_steps_fp32acc", "torch_fp32", "te_style",
            "ring_style", "vllm_style_triton"]  # fmt: skip
ALL_STEP = ["kassay", "kassay_fp32acc", "torch_fp32", "te_style", "ring_style",
            "vllm_style_triton"]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="JSON results path")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (CPU interpreter ok)")
    ap.add_argument("--no-sweep", action="store_true", help="skip the launch-config sweep")
    ap.add_argument("--only-main", action="store_true", help="main shape only")
    args = ap.parse_args(argv)

    res = Results(meta=env_meta([sys.argv[0], *argv]))
    main_shape = {"T": 256, "Hh": 4, "D": 32} if args.smoke else {"T": 32768, "Hh": 32, "D": 128}
    res.copy_tbps = copy_ceiling_tbps(1 << 20 if args.smoke else 1 << 30)
    res.meta["copy_ceiling"] = "y.copy_(x), 1 GiB fp32, bytes read + written"
    print(f"copy ceiling: {res.copy_tbps:.3f} TB/s", flush=True)

    if not args.no_sweep:
        lc = km.MergeConfig
        configs = [
            lc(block_elems=2048),
            lc(block_elems=4096),
            lc(block_elems=2048, num_warps=2),
            lc(block_elems=2048, tile_tokens=16),
            lc(block_elems=2048, pair_kernel=False),  # K = 2 on the K-way kernel (v4 and before)
        ]
        run_sweep(res, main_shape, configs)

    ks = (2, 4, 8)
    for regime in ("normal", "empty_rows"):
        for k in ks:
            impls = ALL_KWAY if k > 2 else [i for i in ALL_KWAY if "steps" not in i]
            run_kway(res, main_shape, k, regime, "hT", impls, seed=10 + k)
        for k in (2, 8):
            run_kway(res, main_shape, k, regime, "Th", ["kassay"], seed=20 + k)
        for half in (False, True):
            run_step(res, main_shape, regime, "hT", half, ALL_STEP, seed=30)
        run_step(res, main_shape, regime, "Th", True, ["kassay", "kassay_fp32acc"], seed=31)
    # a repeat of the headline case, for the spread between identical runs
    run_kway(res, main_shape, 2, "normal", "hT", ["kassay"], seed=12)
    run_kway(res, main_shape, 2, "huge", "hT", ["kassay", "torch_fp32", "te_style",
                                                "ring_style", "vllm_style_triton"], seed=40)  # fmt: skip

    if not args.only_main:
        others = [{"T": 64, "Hh": 4, "D": 16}] if args.smoke else [
            {"T": 32768, "Hh": 32, "D": 64},
            {"T": 32768, "Hh": 32, "D": 256},
            {"T": 32768, "Hh": 8, "D": 128},
        ]  # fmt: skip
        for shp in others:
            for k in (2, 8):
                run_kway(res, shp, k, "normal", "hT",
                         ["kassay", "torch_fp32", "vllm_style_triton"], seed=50 + k)  # fmt: skip
            run_step(res, shp, "normal", "hT", False, ["kassay", "kassay_fp32acc"], seed=51)
            run_step(res, shp, "normal", "hT", True, ["kassay"], seed=52)
        small = [{"T": 16, "Hh": 2, "D": 16}] if args.smoke else [
            {"T": 1024, "Hh": 32, "D": 128},
            {"T": 128, "Hh": 32, "D": 128},
        ]  # fmt: skip
        for shp in small:
            for k in (2, 8):
                run_kway(res, shp, k, "normal", "hT",
                         ["kassay", "torch_fp32", "te_style", "ring_style",
                          "vllm_style_triton"], graph=True, seed=60 + k)  # fmt: skip
            run_step(res, shp, "normal", "hT", False,
                     ["kassay", "torch_fp32", "te_style", "ring_style", "vllm_style_triton"],
                     graph=True, seed=61)  # fmt: skip

    md = table(res)
    print("\n" + md)
    payload = {"meta": res.meta, "copy_tbps": res.copy_tbps, "sweep": res.sweep,
               "cases": res.cases, "table_md": md}  # fmt: skip
    save_json(payload, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
