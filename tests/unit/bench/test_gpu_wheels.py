"""bench/gpu_wheels.sh fetches what the H200 image lacks. When the service gained a dependency
(alembic, stop 13) and the script did not, `kassay serve` died on the device at import and a CI
latency run waited for it until its time limit: every package the api and worker extras need,
their dependencies included, must be in the image or in the script's list."""

from __future__ import annotations

import importlib.metadata as md
import re
from pathlib import Path

from packaging.requirements import Requirement

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "gpu_wheels.sh"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _script_lists() -> tuple[set[str], set[str]]:
    text = SCRIPT.read_text()
    image = set(re.search(r"^# IMAGE: (.+)$", text, re.M).group(1).split())  # type: ignore[union-attr]
    block = re.search(r"^pkgs=\((.*?)^\)", text, re.M | re.S).group(1)  # type: ignore[union-attr]
    pkgs = {re.split(r"[=<>\[]", tok)[0] for tok in block.split()}
    return {_norm(n) for n in image}, {_norm(n) for n in pkgs}


def _closure(roots: list[Requirement]) -> set[str]:
    """Names of `roots` and of everything they require (markers evaluated for this Python,
    extras followed), from the installed distributions' metadata."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        req = todo.pop()
        name = _norm(req.name)
        key = name + "[" + ",".join(sorted(req.extras)) + "]"
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = md.requires(req.name) or []
        except md.PackageNotFoundError:
            continue  # not installed here (a platform-only extra): nothing to follow
        for text in requires:
            sub = Requirement(text)
            envs = [{"extra": e} for e in req.extras] or [{"extra": ""}]
            if sub.marker is None or any(sub.marker.evaluate(env) for env in envs):
                todo.append(sub)
    return {k.split("[")[0] for k in seen}


def test_the_gpu_wheels_cover_the_service() -> None:
    image, pkgs = _script_lists()
    needed = _closure([Requirement("kassay[api,worker]")]) - {"kassay"}
    have = _closure([Requirement(n) for n in image]) | pkgs
    missing = sorted(needed - have)
    assert not missing, f"bench/gpu_wheels.sh lacks {missing} (add them to pkgs)"


def test_the_check_sees_a_missing_dependency() -> None:
    image, pkgs = _script_lists()
    needed = _closure([Requirement("kassay[api,worker]")])
    assert {"alembic", "mako", "fastapi-offline", "grpcio"} <= needed
    assert "alembic" not in _closure([Requirement(n) for n in image]) | (pkgs - {"alembic"})
