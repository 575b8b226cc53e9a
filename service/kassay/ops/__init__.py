"""The op registry: one module per op, each exposing `OP` (an `Op` instance)."""

from __future__ import annotations

from kassay.errors import UnknownOpError
from kassay.ops.base import Op, OpParams, OutputSpec
from kassay.ops.flce import OP as FLCE
from kassay.ops.lse_merge import OP as LSE_MERGE

OPS: dict[str, Op] = {FLCE.name: FLCE, LSE_MERGE.name: LSE_MERGE}


def get_op(name: str) -> Op:
    try:
        return OPS[name]
    except KeyError:
        raise UnknownOpError(
            f"unknown op {name!r}; known ops: {', '.join(sorted(OPS))}",
            details={"field": "op", "allowed": sorted(OPS)},
        ) from None


__all__ = ["OPS", "Op", "OpParams", "OutputSpec", "get_op"]
