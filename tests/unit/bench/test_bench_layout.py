"""bench/ holds benchmarks users run on kassay's public kernel API; research/ holds the probes.

bench/*.py must not reach into kassay.kernels' private names (a module or name starting with
`_`): what they measure is what a user can call. research/*.py may, but must stay importable.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
KERNELS = "kassay.kernels"


def _is_kernels(module: str) -> bool:
    return module == KERNELS or module.startswith(KERNELS + ".")


def _private(dotted: str) -> bool:
    return any(part.startswith("_") for part in dotted.split("."))


def private_kernel_uses(source: str) -> list[str]:
    """Private names of kassay.kernels a script imports or reaches: imports of a `_` module or
    name, attributes `m._x` of a kernels module bound to `m`, and `_` keywords in calls of an
    imported kernels function or module attribute."""
    tree = ast.parse(source)
    found: list[str] = []
    modules: set[str] = set()  # local names bound to a kassay.kernels module
    functions: set[str] = set()  # local names bound to a public kassay.kernels object
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _is_kernels(a.name):
                    if _private(a.name):
                        found.append(a.name)
                    modules.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and _is_kernels(node.module):
            if _private(node.module):
                found.append(node.module)
            for a in node.names:
                if a.name.startswith("_"):
                    found.append(f"{node.module}.{a.name}")
                elif node.module == KERNELS and a.name in ("flce", "lse_merge", "flce_config"):
                    modules.add(a.asname or a.name)
                else:
                    functions.add(a.asname or a.name)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
        ):
            found.append(f"{node.value.id}.{node.attr}")
        if isinstance(node, ast.Call):
            f = node.func
            kernel_call = (isinstance(f, ast.Name) and f.id in functions) or (
                isinstance(f, ast.Attribute)
                and isinstance(f.value, ast.Name)
                and f.value.id in modules
            )
            if kernel_call:
                found += [
                    f"keyword {k.arg}" for k in node.keywords if (k.arg or "").startswith("_")
                ]
    return found


def test_bench_scripts_use_only_the_public_kernel_api():
    scripts = sorted((ROOT / "bench").glob("*.py"))
    assert {p.name for p in scripts} >= {"flce.py", "lse_merge.py", "common.py"}
    bad = {p.name: private_kernel_uses(p.read_text()) for p in scripts}
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_check_finds_private_uses():
    snippets = {
        "from kassay.kernels.flce import _launch_ce": ["kassay.kernels.flce._launch_ce"],
        "from kassay.kernels import _flce_kernels as K": ["kassay.kernels._flce_kernels"],
        "import kassay.kernels._flce_launch": ["kassay.kernels._flce_launch"],
        "from kassay.kernels import flce as m\nm._num_sms(0)": ["m._num_sms"],
        "from kassay.kernels import lse_merge as km\nkm.merge_states(o, l, _config=c)": [
            "keyword _config"
        ],
        "from kassay.kernels import merge_states\nmerge_states(o, l, _config=c)": [
            "keyword _config"
        ],
    }
    for source, want in snippets.items():
        assert private_kernel_uses(source) == want, source
    ok = "from kassay.kernels import FlceConfig, fused_linear_cross_entropy as f\nf(x, config=c)"
    assert private_kernel_uses(ok) == []


def test_research_keeps_what_was_learned_not_probe_scripts():
    """bench/ keeps what users run; research/ keeps notes with the results and the commands
    (NOTES-probes.md: the probes' scripts are in git history), the result files and the list of
    H200 runs still pending, no scripts to rot."""
    assert not list((ROOT / "bench").glob("*probe*.py"))
    assert not list((ROOT / "bench").glob("NOTES-*.md"))
    assert not list((ROOT / "research").glob("*.py"))
    notes = (ROOT / "research" / "NOTES-probes.md").read_text()
    assert (ROOT / "research" / "README.md").is_file()
    # every result file a note names is still there
    named = set(re.findall(r"research/results/([\w.\-]+\.(?:json|log|txt|csv))", notes))
    assert len(named) >= 10
    for name in named:
        assert (ROOT / "research" / "results" / name).exists(), name
