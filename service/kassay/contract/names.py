"""Short, stable case names: what tells a case apart from the others of its suite.

A case's full label names every param, defaults included (`T=16,Hh=2,D=32,K=2,dtype=float32,
lse_layout=hT,mode=merge,accumulate=float32 [normal seed=0]`: JUnit names of up to 329
characters). Its short name keeps the op and impl, the params that vary within its suite's grid,
the regime and seed where the suite has several, and, for a point default coverage added, why
(`lse_merge.torch K=3 +ragged sizes`). The case key stays the identity (history, comparisons);
the name is for people, the same in every view: the CLI, Markdown, JUnit, HTML, the dashboard and
the regression lines. Where two cases of a suite would get one name, the params that tell them
apart are added.

Part of the torch-free contract (the API and the reports import it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class _Case(Protocol):
    case_id: str
    op: str
    impl: str
    suite_index: int
    params: dict[str, Any]
    regime: str
    seed: int
    coverage: str


def _value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _params(params: dict[str, Any], keys: Iterable[str]) -> str:
    return ",".join(f"{k}={_value(params.get(k))}" for k in keys)


def short_names(cases: Sequence[_Case]) -> dict[str, str]:
    """case_id -> its short name (see the module docstring)."""
    suites: dict[tuple[str, int], list[_Case]] = defaultdict(list)
    for c in cases:
        suites[(c.op, c.suite_index)].append(c)
    names: dict[str, str] = {}
    for members in suites.values():
        names.update(_suite_names(members))
    return names


@dataclass(frozen=True)
class _Shown:
    """What a suite's names show: the params that vary in its grid, and whether its regimes
    and seeds do."""

    keys: tuple[str, ...]
    regimes: bool
    seeds: bool

    def name(self, c: _Case, extra: Sequence[str] = ()) -> str:
        parts = [f"{c.op}.{c.impl}"]
        shown = _params(c.params, [*self.keys, *(k for k in extra if k not in self.keys)])
        if shown:
            parts.append(shown)
        tags = [c.regime] if self.regimes else []
        tags += [f"seed={c.seed}"] if self.seeds else []
        if tags:
            parts.append(f"[{' '.join(tags)}]")
        if c.coverage:
            parts.append(f"+{c.coverage}")
        return " ".join(parts)


def _suite_names(members: list[_Case]) -> dict[str, str]:
    grid = [c for c in members if not c.coverage] or members
    shown = _Shown(
        keys=tuple(k for k in _keys(grid) if len({repr(c.params.get(k)) for c in grid}) > 1),
        regimes=len({c.regime for c in members}) > 1,
        seeds=len({c.seed for c in members}) > 1,
    )
    first = {c.case_id: shown.name(c) for c in members}
    clash: dict[str, list[_Case]] = defaultdict(list)
    for c in members:
        clash[first[c.case_id]].append(c)
    names: dict[str, str] = {}
    for same in clash.values():
        if len(same) == 1:
            names[same[0].case_id] = first[same[0].case_id]
            continue
        extra = [k for k in _keys(same) if len({repr(c.params.get(k)) for c in same}) > 1]
        for c in same:
            names[c.case_id] = shown.name(c, extra) if extra else f"{shown.name(c)} ({c.case_id})"
    return names


def _keys(cases: Sequence[_Case]) -> list[str]:
    """Every param key of the cases, in first-seen order."""
    seen: dict[str, None] = {}
    for c in cases:
        seen.update(dict.fromkeys(c.params))
    return list(seen)
