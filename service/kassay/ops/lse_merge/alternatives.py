"""Correct lse_merge impls written differently from torch: the fairness corpus.

- `alt_logsumexp`: lse = logsumexp over the states, weights exp(lse_i - lse) (no division by
  the sum of shifted exponentials), in float32.
- `alt_pairwise`: the K states merged as a balanced tree of two-way merges (max + log1p form),
  float32; the step modes use the same two-way merge.
- `alt_float64`: the merge in float64, rounded once; steps keep their accumulator's dtype.
- `alt_sigmoid`: ring-flash-attention's sigmoid / logsigmoid update with empty rows guarded,
  and a K-way merge folding the states in with it.
- `alt_kahan`: float32 weights, out accumulated over the states with Kahan compensation (in
  float32 even when the output dtype is asked for: more exact, never less).

Empty rows (lse -inf, or +inf as FlashAttention-2 marks them) weigh nothing; a row empty in
every state gives out 0 and lse -inf, as the op defines. Kind "alternative": offered only where
mutants are (`kassay selftest`, tests).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kassay.ops.lse_merge import harness as lse_harness
from kassay.ops.lse_merge.runtime import lse_to_th, th_to_layout
from kassay.ops.registry import Impl, register


def _empty(lse: torch.Tensor) -> torch.Tensor:
    """+inf (FlashAttention-2's empty row) as -inf."""
    return torch.where(torch.isposinf(lse), torch.full_like(lse, -torch.inf), lse)


def _two_way(
    o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor, l2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two states (out [rows, Hh, D] in the work dtype, lse [rows, Hh], -inf empty) with
    max + log1p(exp(min - max)); both empty: out 0, lse -inf."""
    mx, mn = torch.maximum(l1, l2), torch.minimum(l1, l2)
    live = torch.isfinite(mx)
    mx_s = torch.where(live, mx, torch.zeros_like(mx))
    lse = torch.where(live, mx_s + torch.log1p(torch.exp(mn - mx_s)), mx)
    lse_s = torch.where(live, lse, torch.zeros_like(lse))
    c1 = torch.where(live, torch.exp(l1 - lse_s), torch.zeros_like(lse))[..., None]
    c2 = torch.where(live, torch.exp(l2 - lse_s), torch.zeros_like(lse))[..., None]
    return c1 * o1 + c2 * o2, lse


def _sigmoid_two_way(
    o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor, l2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """ring-flash-attention's form: out = o1 - sigmoid(l2 - l1) (o1 - o2), lse = l1 -
    logsigmoid(l1 - l2), with empty states guarded."""
    e1, e2 = torch.isneginf(l1), torch.isneginf(l2)
    both = e1 & e2
    l1s = torch.where(e1, torch.zeros_like(l1), l1)
    l2s = torch.where(e2, torch.zeros_like(l2), l2)
    sg = torch.sigmoid(l2s - l1s)
    sg = torch.where(e2, torch.zeros_like(sg), torch.where(e1, torch.ones_like(sg), sg))
    out = o1 - sg[..., None] * (o1 - o2)
    lse = l1s - F.logsigmoid(l1s - l2s)
    lse = torch.where(e1, l2, torch.where(e2, l1, lse))
    out = torch.where(both[..., None], torch.zeros_like(out), out)
    return out, lse


def _fold(
    outs: torch.Tensor, lses: torch.Tensor, lse_layout: str, accumulate: str, how: str
) -> tuple[torch.Tensor, torch.Tensor]:
    lse = _empty(lse_to_th(lses, lse_layout).float())
    k = outs.shape[0]
    if how == "logsumexp":
        total = torch.logsumexp(lse, dim=0)
        live = torch.isfinite(total)
        safe = torch.where(live, total, torch.zeros_like(total))
        coef = torch.where(live[None], torch.exp(lse - safe[None]), torch.zeros_like(lse))
        acc_dtype = torch.float32 if accumulate == "float32" else outs.dtype
        out = torch.zeros(outs.shape[1:], dtype=acc_dtype, device=outs.device)
        for i in range(k):
            out += (coef[i, ..., None] * outs[i].float()).to(acc_dtype)
        return out.to(outs.dtype), th_to_layout(total, lse_layout)
    if how == "pairwise":
        states = [(outs[i].float(), lse[i]) for i in range(k)]
        while len(states) > 1:
            nxt = [_two_way(*states[i], *states[i + 1]) for i in range(0, len(states) - 1, 2)]
            if len(states) % 2:
                nxt.append(states[-1])
            states = nxt
        out, total = states[0]
        out = torch.where(torch.isfinite(total)[..., None], out, torch.zeros_like(out))
        return out.to(outs.dtype), th_to_layout(total, lse_layout)
    if how == "sigmoid":
        o, lt = outs[0].float(), lse[0]
        o = torch.where(torch.isfinite(lt)[..., None], o, torch.zeros_like(o))
        for i in range(1, k):
            o, lt = _sigmoid_two_way(o, lt, outs[i].float(), lse[i])
            if accumulate == "out":
                o = o.to(outs.dtype).float()
        return o.to(outs.dtype), th_to_layout(lt, lse_layout)
    # kahan: float32 weights, compensated sum of the weighted states
    m = lse.max(dim=0).values
    m_s = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp(lse - m_s)
    s = w.sum(dim=0)
    total = torch.where(s > 0, m_s + torch.log(s), torch.full_like(s, -torch.inf))
    coef = torch.where(s > 0, w / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(w))
    acc = torch.zeros(outs.shape[1:], dtype=torch.float32, device=outs.device)
    comp = torch.zeros_like(acc)
    for i in range(k):
        y = coef[i, ..., None] * outs[i].float() - comp
        t = acc + y
        comp = (t - acc) - y
        acc = t
    return acc.to(outs.dtype), th_to_layout(total, lse_layout)


def _merge64(
    outs: torch.Tensor, lses: torch.Tensor, *, lse_layout: str, accumulate: str
) -> tuple[torch.Tensor, torch.Tensor]:
    lse = _empty(lse_to_th(lses, lse_layout).double())
    total = torch.logsumexp(lse, dim=0)
    live = torch.isfinite(total)
    safe = torch.where(live, total, torch.zeros_like(total))
    coef = torch.where(live[None], torch.exp(lse - safe[None]), torch.zeros_like(lse))
    out = (coef[..., None] * outs.double()).sum(dim=0)
    return out.to(outs.dtype), th_to_layout(total.float(), lse_layout)


def _merge(how: str) -> lse_harness.LseMerge:
    def merge(
        outs: torch.Tensor, lses: torch.Tensor, *, lse_layout: str, accumulate: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return _fold(outs, lses, lse_layout, accumulate, how)

    return merge


def _step(how: str) -> lse_harness.LseUpdate:
    def step(
        v: lse_harness.StepView, out_step: torch.Tensor, lse_step: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        l_old = _empty(v.lse.float())
        l_new = _empty(lse_step.float())
        if how == "float64":
            res, lse = _two_way(v.base.double(), l_old.double(), out_step.double(), l_new.double())
            res, lse = res.float(), lse.float()
        elif how == "sigmoid":
            res, lse = _sigmoid_two_way(v.base, l_old, out_step.float(), l_new)
        else:
            res, lse = _two_way(v.base, l_old, out_step.float(), l_new)
        # a row empty in both: out 0, lse -inf (the op's empty row)
        keep = ~torch.isfinite(lse)
        lse = torch.where(keep, l_old, lse)
        res = torch.where(keep[..., None], torch.zeros_like(res), res)
        return res, lse

    return lse_harness.step_update(step)


_ALTS = {
    "alt_logsumexp": (_merge("logsumexp"), _step("pairwise"), "logsumexp weights exp(lse_i - lse)"),
    "alt_pairwise": (_merge("pairwise"), _step("pairwise"), "a tree of two-way max + log1p merges"),
    "alt_float64": (_merge64, _step("float64"), "float64 merge and steps, rounded once"),
    "alt_sigmoid": (
        _merge("sigmoid"),
        _step("sigmoid"),
        "sigmoid / logsigmoid, empty rows guarded",
    ),
    "alt_kahan": (_merge("kahan"), _step("pairwise"), "Kahan-compensated float32 accumulation"),
}

for _name, (_m, _u, _desc) in _ALTS.items():
    register(
        Impl(
            "lse_merge",
            _name,
            lse_harness.as_run(_m, _u),
            f"correct alternative: {_desc}",
            kind="alternative",
        ),
        replace=True,
    )
