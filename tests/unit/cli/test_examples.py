"""The examples users copy: every job spec under examples/ is valid, and the CI examples build
the repository's wheel, submit it with `--artifact` through the real `kassay` argument parser,
gate on the exit code and publish the JUnit and Markdown reports; the job they submit names the
impls the example kernel package provides."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kassay.cli import build_parser
from kassay.contract.spec import parse_spec
from kassay.ops.expand import expand

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
PACKAGE = EXAMPLES / "kernel-package"
CI = {
    "github": EXAMPLES / "ci" / "github-actions.yml",
    "gitlab": EXAMPLES / "ci" / "gitlab-ci.yml",
}


@pytest.mark.parametrize(
    "path", sorted(EXAMPLES.rglob("*.yaml")), ids=lambda p: str(p.relative_to(EXAMPLES))
)
def test_every_example_job_spec_is_valid(path: Path) -> None:
    assert expand(parse_spec(path.read_text()))


def _commands(doc: Any) -> list[str]:
    """Every shell line of a CI file (GitHub `run:` steps, GitLab `script:` items)."""
    if "jobs" in doc:
        return [s["run"] for job in doc["jobs"].values() for s in job["steps"] if "run" in s]
    return [line for job in doc.values() if isinstance(job, dict) for line in job["script"]]


def _submit_args(command: str) -> Any:
    """The `kassay submit` line parsed by kassay's own parser (CI variables made plain)."""
    line = re.sub(r"\$\{\{[^}]*\}\}|\$[A-Z_]+", "X", " ".join(command.split("\\\n")))
    words = shlex.split(line)
    return build_parser().parse_args(words[words.index("kassay") + 1 :])


@pytest.mark.parametrize("ci", sorted(CI))
def test_ci_examples_build_submit_gate_and_publish(ci: str) -> None:
    doc = yaml.safe_load(CI[ci].read_text())
    commands = _commands(doc)
    build = next(i for i, c in enumerate(commands) if "pip wheel" in c)
    assert "--no-deps" in commands[build] and "-w dist" in commands[build]
    submit = next(i for i, c in enumerate(commands) if "kassay submit" in c)
    assert build < submit
    args = _submit_args(commands[submit])
    assert args.spec == "kassay-job.yaml" and args.artifact == ["dist/*.whl"]
    assert args.wait and (args.junit, args.markdown) == ("kassay.xml", "kassay.md")
    # the exit code gates the CI job: nothing swallows it
    assert "|| true" not in commands[submit] and "set +e" not in commands[submit]
    if ci == "github":
        steps = doc["jobs"]["kernels"]["steps"]
        after = steps[next(i for i, s in enumerate(steps) if "kassay submit" in s.get("run", "")) :]
        published = [s for s in after[1:] if s.get("if") == "always()"]
        text = yaml.safe_dump(published)
        assert "GITHUB_STEP_SUMMARY" in text and "kassay.md" in text
        assert any("kassay.xml" in str(s.get("with", {})) for s in published)
    else:
        arts = doc["kassay"]["artifacts"]
        assert arts["when"] == "always" and arts["reports"]["junit"] == "kassay.xml"
        assert {"kassay.xml", "kassay.md"} <= set(arts["paths"])


def test_the_example_job_names_the_impls_of_the_example_package(monkeypatch) -> None:
    """kassay-job.yaml (what the CI examples submit) runs the package's entry-point impls."""
    import tomllib

    project = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]
    (target,) = project["entry-points"]["kassay.impls"].values()
    module, _, func = target.partition(":")
    monkeypatch.syspath_prepend(str(PACKAGE / "src"))
    try:
        provided = {i.name for i in getattr(__import__(module, fromlist=[func]), func)()}
    finally:  # the package stays a test-local import
        for name in [m for m in sys.modules if m.startswith(module.split(".")[0])]:
            del sys.modules[name]
    spec = parse_spec((PACKAGE / "kassay-job.yaml").read_text())
    named = {i for s in spec.suites for i in s.impls}
    assert provided and provided <= named
    assert named - provided <= {"torch", "kassay"}  # the rest are kassay's own
    # unpinned torch and triton: the worker installs the wheel without dependencies
    assert not [d for d in project["dependencies"] if re.search(r"[=<>~]", d)]
