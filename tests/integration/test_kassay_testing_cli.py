"""#39: the same case gets the same verdict from kassay.testing in a pytest process and from
`kassay run` (the console script, as a user runs it, cwd outside the repository): a correct
impl and a mutant that breaks on one regime, case key by case key."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from users import KASSAY, user_env

import kassay.testing as kt
from kassay.impls import get_impl, load

pytestmark = pytest.mark.integration

GRID = {"T": 32, "Hh": 2, "D": 16, "K": [2, 3], "dtype": ["float32", "float16"], "mode": "merge"}
#: a mutant of the self-test: log(exp(a)+exp(b)), which overflows on the huge regime
MUTANT = "m_naive_logaddexp"


def test_kassay_run_and_kassay_testing_agree_case_by_case(tmp_path: Path) -> None:
    load(mutants=True)
    mutant = get_impl("lse_merge", MUTANT, include_mutants=True)
    spec = {
        "name": "agree",
        "suites": [
            {
                "op": "lse_merge",
                "impls": ["torch", MUTANT],
                "params": GRID,
                "coverage": "none",
                "timing": {"enabled": False},
            }
        ],
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    done = subprocess.run(
        [*KASSAY, "run", "job.yaml", "--device", "cpu", "--quiet", "--json", "report.json"],
        cwd=tmp_path,
        env=user_env({"KASSAY_ENABLE_MUTANTS": "true"}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-2000:]
    cases = json.loads((tmp_path / "report.json").read_text())["cases"]
    by_cli = {(c["group_id"], c["impl"]): c["status"] for c in cases}
    by_pytest: dict[tuple[str, str], str] = {}
    for case in kt.cases("lse_merge", **GRID):
        for name, impl in (("torch", "torch"), (MUTANT, mutant)):
            try:
                (res,) = kt.assert_kernel("lse_merge", impl, case)
            except kt.KernelAssertionError as exc:
                (res,) = exc.results
            by_pytest[(case.key, name)] = res.status
    assert by_pytest == by_cli
    assert {s for (_, i), s in by_cli.items() if i == "torch"} == {"passed"}
    assert "failed" in {s for (_, i), s in by_cli.items() if i == MUTANT}, by_cli
