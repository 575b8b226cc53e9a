"""The calling convention every flce impl shares: leaves, autocast, backward, outputs.

An flce impl is written as a loss function
    loss_fn(x, weight, target, bias, params) -> loss | (loss, z_loss)
x [N, H], weight [V, H], bias [V] or None (leaf tensors with requires_grad), target [N] int64.
When params.ce_weight is set, the per-class weights come as a keyword, `ce_weight=` ([V]
float32): a loss_fn without that keyword cannot run those cases (the run says so). When
params.return_token_accuracy is set, loss_fn returns an object with `.loss`, `.z_loss` and
`.token_accuracy` (kassay's FlceOutput, Liger's CrossEntropyOutput) or a (loss, z_loss,
token_accuracy) tuple.
`as_run` turns it into the registry's `run(inputs, params)`: it makes fresh leaves, enters
torch.autocast when params.autocast is set (so the impl sees exactly what a training step under
AMP gives it), back-propagates the op's grad_output and collects the gradients. Every impl goes
through the same steps, so timings compare like with like.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import Any

import torch

from kassay.ops.flce import FlceParams
from kassay.ops.runtime import DTYPES

Tensors = dict[str, torch.Tensor]
LossFn = Callable[..., Any]


def autocast_ctx(params: FlceParams, device: torch.device) -> contextlib.AbstractContextManager:
    if params.autocast == "none":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[params.autocast])


def _takes_ce_weight(loss_fn: LossFn) -> bool:
    try:
        sig = inspect.signature(loss_fn)
    except (TypeError, ValueError):  # a builtin or C callable: let the call decide
        return True
    return "ce_weight" in sig.parameters or any(
        q.kind is inspect.Parameter.VAR_KEYWORD for q in sig.parameters.values()
    )


def _unpack(res: Any) -> tuple[torch.Tensor, Any, Any]:
    """(loss, z_loss, token_accuracy) of whatever shape of result a loss_fn returns."""
    if hasattr(res, "loss"):  # FlceOutput, Liger's CrossEntropyOutput
        return res.loss, getattr(res, "z_loss", None), getattr(res, "token_accuracy", None)
    if isinstance(res, tuple):
        return res[0], res[1] if len(res) > 1 else None, res[2] if len(res) > 2 else None
    return res, None, None


def as_run(loss_fn: LossFn) -> Callable[[Tensors, Any], Tensors]:
    takes_ce_weight = _takes_ce_weight(loss_fn)

    def run(inputs: Tensors, params: FlceParams) -> Tensors:
        x = inputs["x"].detach().requires_grad_(True)
        w = inputs["weight"].detach().requires_grad_(True)
        b = inputs["bias"].detach().requires_grad_(True) if "bias" in inputs else None
        kw: dict[str, Any] = {}
        if getattr(params, "ce_weight", False):
            if not takes_ce_weight:
                raise RuntimeError("this impl's loss_fn takes no ce_weight= (per-class weights)")
            kw["ce_weight"] = inputs["ce_weight"]
        with autocast_ctx(params, x.device):
            res = loss_fn(x, w, inputs["target"], b, params, **kw)
        loss, z_loss, acc = _unpack(res)
        loss.backward(inputs["grad_output"].to(loss.dtype).expand_as(loss))
        out: Tensors = {"loss": loss.detach()}
        if params.return_z_loss:
            if z_loss is None:
                raise RuntimeError("impl returned no z_loss although return_z_loss was asked")
            out["z_loss"] = z_loss.detach()
        if getattr(params, "return_token_accuracy", False):
            if acc is None:
                raise RuntimeError("impl returned no token_accuracy although it was asked")
            out["token_accuracy"] = acc.detach().float()
        out["grad_input"] = _grad(x, "x")
        out["grad_weight"] = _grad(w, "weight")
        if b is not None:
            out["grad_bias"] = _grad(b, "bias")
        return out

    return run


def from_callable(loss_fn: LossFn) -> tuple[Callable[[Tensors, Any], Tensors], None]:
    """A user's loss_fn as an impl's run (kassay.testing); TypeError saying what does not fit
    the convention above."""
    from kassay.ops.callables import signature_misfit

    misfit = signature_misfit(loss_fn, ("x", "weight", "target", "bias", "params"))
    if misfit:
        raise TypeError(
            f"{getattr(loss_fn, '__qualname__', loss_fn)!r} does not fit op 'flce': {misfit}; "
            "expected loss_fn(x, weight, target, bias, params[, ce_weight=]) -> loss | "
            "(loss, z_loss)"
        )
    return as_run(loss_fn), None


def _grad(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.grad is None:
        raise RuntimeError(f"no gradient reached {name}")
    return t.grad


def token_accuracy(
    logits: torch.Tensor, target: torch.Tensor, valid: torch.Tensor, params: FlceParams
) -> torch.Tensor:
    """Argmax hits of non-ignored rows: [N] 0/1 for reduction none, else their fraction
    (0 when every row is ignored), float32, no gradient."""
    hits = ((logits.detach().argmax(dim=-1) == target) & valid).float()
    if params.reduction == "none":
        return hits
    return hits.sum() / valid.sum().clamp_min(1)


def z_loss_term(lse: torch.Tensor, valid: torch.Tensor, params: FlceParams) -> torch.Tensor:
    """scale * lse^2 per non-ignored row, reduced like the loss (mean is sum / number of
    non-ignored rows, 0 when every row is ignored)."""
    zl = params.z_loss_scale * lse.float() ** 2 * valid
    if params.reduction == "none":
        return zl
    if params.reduction == "sum":
        return zl.sum()
    return zl.sum() / valid.sum().clamp_min(1)


__all__ = [
    "LossFn",
    "Tensors",
    "as_run",
    "autocast_ctx",
    "from_callable",
    "token_accuracy",
    "z_loss_term",
]
