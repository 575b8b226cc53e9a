"""The house has no import circles: kassay's modules form a DAG, counting every import, the
lazy ones inside functions and those under TYPE_CHECKING too (a lazy import that only hides a
circle is still one). And it has floors (FLOORS, the picture in the README's Layout section): a
package imports only from floors below its own, never from one beside or above it; the api
reaches workers only through gRPC (kassay.contract)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[2] / "service"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in SERVICE.rglob("*.py"):
        if "v1" in path.relative_to(SERVICE).parts:  # generated stubs
            continue
        name = ".".join(path.relative_to(SERVICE).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def _graph() -> dict[str, set[str]]:
    mods = _modules()

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [owner(a.name) for a in node.names if a.name.startswith("kassay")]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kassay"):
                base = node.module or ""
                targets = [owner(f"{base}.{a.name}") or owner(base) for a in node.names]
            graph[mod] |= {t for t in targets if t and t != mod}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


#: the floors, ground first: a package may import from lower floors only (its own modules aside)
FLOORS: dict[str, int] = {
    # 0: leaves every process may use
    "kassay": 0,  # the package itself: __version__
    "kassay.errors": 0,
    "kassay.logs": 0,
    "kassay.ports": 0,
    "kassay.static": 0,
    "kassay.triton_mode": 0,
    # 1: what crosses process boundaries (torch-free), and the kernels (a library of their own)
    "kassay.contract": 1,
    "kassay.artifacts": 1,
    "kassay.kernels": 1,
    # 2: the ops: contracts, inputs and references, their impls and the impl registry
    "kassay.ops": 2,
    # 3: what reads the ops: plugin-facing impl names, report renderers, settings
    "kassay.impls": 3,
    "kassay.reports": 3,
    "kassay.settings": 3,
    # 4: the engine
    "kassay.validate": 4,
    # 5: the two servers, which meet only in kassay.contract
    "kassay.worker": 5,
    "kassay.api": 5,
    # 6: what users start: the command, the pytest plugin
    "kassay.cli": 6,
    "kassay.testing": 6,
}


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def _arrows_up(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """(package, package it imports on its own floor or above) -> the module imports."""
    up: dict[tuple[str, str], list[str]] = {}
    for mod, deps in graph.items():
        a = _package(mod)
        for dep in deps:
            b = _package(dep)
            if a != b and FLOORS[b] >= FLOORS[a]:
                up.setdefault((a, b), []).append(f"{mod} -> {dep}")
    return up


def test_the_floor_check_finds_arrows_up_and_beside() -> None:
    graph = {
        "kassay.validate.engine": {"kassay.reports.html", "kassay.contract.results"},  # down
        "kassay.reports.html": {"kassay.validate.engine"},  # up
        "kassay.api.app": {"kassay.worker.keepalive", "kassay.api.pages"},  # beside; its own
        "kassay.ops.flce": {"kassay.ops.registry", "kassay.kernels.flce"},  # its own; down
    }
    assert _arrows_up(graph) == {
        ("kassay.reports", "kassay.validate"): ["kassay.reports.html -> kassay.validate.engine"],
        ("kassay.api", "kassay.worker"): ["kassay.api.app -> kassay.worker.keepalive"],
    }


def test_every_arrow_points_down_a_floor() -> None:
    graph = _graph()
    unknown = sorted({_package(m) for m in graph} - set(FLOORS))
    assert not unknown, f"give each new package a floor in FLOORS: {unknown}"
    assert _arrows_up(graph) == {}  # no exceptions: every arrow points down


def test_no_import_circles() -> None:
    assert _cycles(_graph()) == []


def test_the_layers_point_one_way() -> None:
    graph = _graph()
    for mod, deps in graph.items():
        if _in(mod, "kassay.ops"):
            # an op's folder registers its impls beside the op loader (kassay.ops.registry);
            # nothing above: not the plugin-facing kassay.impls, not the engine, nor the servers
            above = ("kassay.impls", "kassay.validate", "kassay.worker", "kassay.api")
            assert not {d for d in deps if any(_in(d, a) for a in above)}, mod
        if mod.startswith("kassay.api"):
            # the API meets the worker in kassay.contract only (stubs, codec, channel policies)
            above = {d for d in deps if d.startswith(("kassay.worker", "kassay.impls"))}
            assert not above, (mod, above)
        if mod.startswith("kassay.contract"):
            # the ground floor: itself and the error types, nothing else of kassay's (an op's
            # params model reaches the codec as an argument, kassay.contract.wire.ParamsModel)
            up = {d for d in deps if not _in(d, "kassay.contract")} - {"kassay.errors"}
            assert not up, (mod, up)


def test_the_contract_imports_no_torch() -> None:
    import json
    import subprocess
    import sys

    code = (
        "import json, sys\nimport kassay.contract.wire, kassay.contract.spec, kassay.contract.results, "
        "kassay.contract.keepalive, "
        "kassay.contract.addresses\nfrom kassay.contract.v1 import worker_pb2_grpc\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_the_registrys_old_path_still_imports_with_a_deprecation_warning() -> None:
    import subprocess
    import sys

    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n    import kassay.impls.registry\nexcept DeprecationWarning as e:\n"
        "    print('warned:', e)\n"
        "warnings.simplefilter('ignore')\n"
        "from kassay.impls.registry import Impl, register\n"
        "import kassay.impls, kassay.ops.registry as r\n"
        "assert Impl is r.Impl is kassay.impls.Impl and register is r.register\n"
        "print('same')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == [
        "warned: kassay.impls.registry moved to kassay.ops.registry (plugins: import Impl and "
        "register from kassay.impls)",
        "same",
    ], out.stdout + out.stderr


def test_the_readmes_picture_of_the_floors_is_the_tests() -> None:
    readme = (SERVICE.parent / "README.md").read_text()
    block = readme.split("## Layout", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    drawn: dict[str, int] = {}
    for line in block.strip().splitlines():
        # "N  name  name   what the floor holds": three spaces or more end the names
        floor, names, _what = re.fullmatch(r"(\d)\s+(.*?)\s{3,}(.*)", line).groups()
        drawn.update({"kassay." + name: int(floor) for name in names.split()})
    assert drawn == {k: v for k, v in FLOORS.items() if k != "kassay"}
