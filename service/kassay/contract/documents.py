"""Bounded reading of job-spec documents (YAML or JSON) from untrusted senders.

A body limit bounds the bytes that arrive, not what they expand to: YAML aliases let a 500-byte
document stand for gigabytes once something walks it (every alias of an alias multiplies), and
deep nesting exhausts the parser's recursion. So every document is measured after parsing, walking
shared nodes once per reference exactly as a validator or serializer later would, and refused as
soon as it is too deep, has too many nodes, expands past a byte budget, or holds text that cannot
be stored as UTF-8 (lone surrogates). The walk stops at the first limit crossed, so its cost is
bounded by the limits, not by the expansion.

PyYAML's SafeLoader is kept (no arbitrary objects); it shares one Python object per anchor, so
parsing itself stays linear in the document's size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import yaml

from kassay.errors import InvalidSpecError


@dataclass(frozen=True)
class DocumentLimits:
    """What one parsed document may amount to.

    max_depth: nesting of mappings/lists (a job spec needs about 6).
    max_nodes: values counted once per reference (aliases expanded).
    max_bytes: characters of every key and string, counted once per reference, plus 8 bytes per
    other value: roughly what a JSON dump of the expanded document would take.
    max_aliases: alias references in a YAML document.
    """

    max_depth: int = 32
    max_nodes: int = 200_000
    max_bytes: int = 8 * 2**20
    max_aliases: int = 1_000


DEFAULT_LIMITS = DocumentLimits()


class _Refused(Exception):
    pass


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses deep nesting and many aliases while composing."""

    limits: DocumentLimits = DEFAULT_LIMITS

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > self.limits.max_aliases:
                raise _Refused(f"more than {self.limits.max_aliases} YAML aliases")
        self._depth += 1
        try:
            if self._depth > self.limits.max_depth:
                raise _Refused(f"nested deeper than {self.limits.max_depth} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _measure(doc: Any, limits: DocumentLimits) -> None:
    """Walk `doc` (shared nodes once per reference) and raise _Refused at the first limit."""
    nodes = 0
    size = 0
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > limits.max_nodes:
            raise _Refused(f"more than {limits.max_nodes} values once aliases are expanded")
        if depth > limits.max_depth:
            raise _Refused(f"nested deeper than {limits.max_depth} levels")
        if isinstance(value, str):
            size += len(value)
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise _Refused("a string is not valid Unicode text (a lone surrogate)") from None
        else:
            size += 8
        if size > limits.max_bytes:
            raise _Refused(f"larger than {limits.max_bytes} bytes once aliases are expanded")
        if isinstance(value, dict):
            for k, v in value.items():
                stack.append((k, depth + 1))
                stack.append((v, depth + 1))
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


def load_document(
    data: str | bytes, *, json_only: bool = False, limits: DocumentLimits = DEFAULT_LIMITS
) -> Any:
    """Parse a YAML (or, with json_only, strict JSON) document within `limits`.

    Raises InvalidSpecError with a bounded message (never the document's content) when it does
    not parse or is too large, too deep or not valid text."""
    kind = "JSON" if json_only else "YAML or JSON"
    try:
        if json_only:
            doc = json.loads(data)
        else:
            loader = _BoundedLoader(data)
            loader.limits = limits
            try:
                doc = loader.get_single_data()
            finally:
                loader.dispose()
        _measure(doc, limits)
    except _Refused as exc:
        raise InvalidSpecError(f"the job spec is refused: {exc}") from None
    except RecursionError:
        raise InvalidSpecError(
            f"the job spec is refused: nested deeper than {limits.max_depth} levels"
        ) from None
    except (yaml.YAMLError, ValueError) as exc:
        text = str(exc)
        if len(text) > 300:
            text = text[:300] + " ..."
        raise InvalidSpecError(f"the job spec is not valid {kind}: {text}") from None
    return doc
