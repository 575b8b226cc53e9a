"""Does a user's function fit an op's calling convention? (kassay.testing takes plain
functions: the op's harness calls them, and a mismatch must say which argument is missing, not
fail every case with a TypeError from deep inside the harness.) Torch-free."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any


def signature_misfit(
    fn: Callable[..., Any], positional: Sequence[str], keywords: Sequence[str] = ()
) -> str | None:
    """None when `fn` can be called as fn(*positional, **{k: ... for k in keywords}); else
    what is wrong, in the convention's words ("missing argument 'params' (the 5th)", "takes no
    keyword 'accumulate'", "needs an argument 'scale' the harness does not pass")."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: the call will tell
        return None
    params = list(sig.parameters.values())
    takes_var_pos = any(p.kind is p.VAR_POSITIONAL for p in params)
    takes_var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    by_position = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(by_position) < len(positional) and not takes_var_pos:
        i = len(by_position)
        return f"missing argument {positional[i]!r} (the {_ordinal(i + 1)} positional one)"
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    bound_by_position = {p.name for p in by_position[: len(positional)]}
    for k in keywords:
        if k in bound_by_position:
            return f"argument {k!r} comes by keyword, not in position"
        if k not in named and not takes_var_kw:
            return f"takes no keyword {k!r}"
    for p in params:
        required = p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        if required and p.name not in bound_by_position and p.name not in keywords:
            return f"needs an argument {p.name!r} the harness does not pass"
    return None


def _ordinal(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")
