"""kassay's pytest plugin (entry point `pytest11`: on whenever kassay is installed).

    --kassay-report PATH   write every case the session asserted (kassay.testing.assert_kernel)
                           as a kassay report: JSON (the report schema, kassay.report/v1), or
                           JUnit / Markdown / HTML by PATH's extension (.xml, .md, .html)
    --kassay-timing        time each case as a job does (off by default: a plain `pytest` stays
                           fast; verdicts do not depend on timing)
    --kassay-device DEV    auto (default: CUDA when present), cpu, cuda, cuda:N

Without a GPU (no nvidia-smi) and with TRITON_INTERPRET unset, the plugin sets
TRITON_INTERPRET=1 before the test modules are imported, as `kassay run` does: Triton kernels
then run under Triton's CPU interpreter.

The `kassay` fixture is kassay.testing itself (`kassay.assert_kernel(...)`, `kassay.cases(...)`);
a test that uses it is marked `kassay`, so `pytest -m kassay` runs those alone.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from kassay.testing.session import SESSION

_CASES_KEY = pytest.StashKey[list[Any]]()
_STARTED_KEY = pytest.StashKey[datetime]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kassay", "kassay: kernel verdicts against a float64 reference")
    group.addoption(
        "--kassay-report",
        metavar="PATH",
        default=None,
        help="write the cases the session asserted as a kassay report (.json, .xml JUnit, "
        ".md Markdown, .html)",
    )
    group.addoption(
        "--kassay-timing",
        action="store_true",
        default=False,
        help="time each asserted case as a job does (default: verdicts only)",
    )
    group.addoption(
        "--kassay-device",
        metavar="DEV",
        default="auto",
        help="device of kassay's cases: auto (CUDA when present), cpu, cuda, cuda:N",
    )


def pytest_configure(config: pytest.Config) -> None:
    from kassay.triton_mode import ensure_triton_mode

    # before the test modules import their Triton kernels: without a GPU they run under
    # Triton's CPU interpreter, as in `kassay run` (TRITON_INTERPRET set by the user wins)
    ensure_triton_mode()
    config.addinivalue_line("markers", "kassay: a test that asserts kernels with kassay")
    report = config.getoption("--kassay-report")
    if report:
        _format_of(report)  # a bad extension fails at once, before any test ran
    cases: list[Any] = []
    config.stash[_CASES_KEY] = cases
    config.stash[_STARTED_KEY] = datetime.now(timezone.utc)
    SESSION.update(
        device=config.getoption("--kassay-device"),
        timing=config.getoption("--kassay-timing"),
        record=cases.append,
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "kassay" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.kassay)


@pytest.fixture
def kassay() -> Any:
    """kassay.testing: `kassay.assert_kernel(op, impl, case | **grid)`, `kassay.cases(...)`."""
    import kassay.testing

    return kassay.testing


def pytest_unconfigure(config: pytest.Config) -> None:
    SESSION.update(device="auto", timing=False, record=None)
    path = config.getoption("--kassay-report")
    if not path or _CASES_KEY not in config.stash:
        return
    from kassay.contract.results import Report, Summary, named
    from kassay.reports import render
    from kassay.validate.env import environment, resolve_device

    cases = config.stash[_CASES_KEY]
    report = Report(
        name="pytest",
        labels={},
        created_at=config.stash[_STARTED_KEY],
        finished_at=datetime.now(timezone.utc),
        environments=[environment(resolve_device(config.getoption("--kassay-device")))],
        summary=Summary.of(cases),
        cases=named(cases),
    )
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(report, _format_of(path)))


def _format_of(path: str) -> str:
    from kassay.reports import FORMATS

    suffix = Path(path).suffix.lstrip(".").lower()
    for f in FORMATS.values():
        if suffix == f.extension:
            return f.name
    known = ", ".join(f".{f.extension}" for f in FORMATS.values())
    raise pytest.UsageError(f"--kassay-report {path}: unknown extension; use one of {known}")
