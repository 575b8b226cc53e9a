"""The op registry: every op is a folder (a package) whose `__init__` holds its torch-free
contract as `OP` (an `Op` instance), next to its runtime, impls, coverage and self-test probes.

Found two ways, on first use:
- built in: the packages beside this file (found by listing them, as tritonbench lists its
  operators' folders: a new built-in op is a new folder and nothing else);
- plugins: the `kassay.ops` entry-point group of installed distributions, each naming an `Op`
  instance, or a module or callable that gives one (`OP`), e.g. in a plugin's pyproject.toml:

      [project.entry-points."kassay.ops"]
      my_op = "my_kernels.my_op:OP"

A plugin may not take a built-in op's name; one that fails to load is logged and left out (a
broken plugin must not take the service down). The API and the workers must both have it
installed: the API admits and prices jobs with the contract, the workers run the rest.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

from kassay.errors import UnknownOpError
from kassay.ops.base import Op, OpParams, OutputSpec

log = logging.getLogger(__name__)

#: the entry-point group plugin ops are found in
ENTRY_POINT_GROUP = "kassay.ops"

_OPS: dict[str, Op] = {}


def _as_op(obj: Any) -> Op:
    if isinstance(obj, ModuleType):
        obj = getattr(obj, "OP", None)
    elif callable(obj) and not isinstance(obj, Op):
        obj = obj()
    if not isinstance(obj, Op):
        raise TypeError(f"gave {type(obj).__name__}, not a kassay.ops.Op")
    return obj


def _discover() -> dict[str, Op]:
    ops: dict[str, Op] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.ispkg:
            op = _as_op(importlib.import_module(f"{__name__}.{info.name}"))
            ops[op.name] = op
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            op = _as_op(ep.load())
            if op.name in ops:
                raise ValueError(f"op {op.name!r} is already taken (a built-in or another plugin)")
        except Exception as exc:
            log.warning("op plugin %s (%s) failed to load: %s", ep.name, ep.value, exc)
            continue
        ops[op.name] = op
    return ops


def all_ops() -> list[Op]:
    """Every op, built-in and plugin, in name order."""
    if not _OPS:
        _OPS.update(_discover())
    return [_OPS[k] for k in sorted(_OPS)]


def op_names() -> list[str]:
    return [op.name for op in all_ops()]


def get_op(name: str) -> Op:
    all_ops()
    try:
        return _OPS[name]
    except KeyError:
        from kassay.errors import did_you_mean

        names = sorted(_OPS)
        raise UnknownOpError(
            f"unknown op {name!r}{did_you_mean(name, names)}; known ops: {', '.join(names)}",
            details={"field": "op", "allowed": names},
        ) from None


def params_model(name: str) -> type[OpParams]:
    """Op `name`'s params model (UnknownOpError naming the known ops): what the wire codec's
    edges read params through (kassay.contract.wire.ParamsModel)."""
    return get_op(name).params_model


__all__ = ["Op", "OpParams", "OutputSpec", "all_ops", "get_op", "op_names", "params_model"]
