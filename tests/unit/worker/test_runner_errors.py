"""What a case says when the impl runner cannot start (#38): its own first error, with host
paths cut to the package's part; and where the sandbox lets it read."""

from __future__ import annotations

import os
from pathlib import Path

from kassay.worker.executor.remote_impls import exception_line, short_path
from kassay.worker.runner.sandbox import installed_code, python_readable

STDERR = """\
Traceback (most recent call last):
  File "<frozen runpy>", line 189, in _run_module_as_main
  File "/srv/app/service/kassay/worker/runner/main.py", line 41, in <module>
    from kassay.worker.frames import Channel
PermissionError: [Errno 13] Permission denied: '{pkg}/__init__.py'
During handling of the above exception, another exception occurred:
RuntimeError: later
"""


def test_the_first_traceback_s_exception_line_with_the_package_s_own_path(tmp_path: Path) -> None:
    pkg = tmp_path / "src" / "mykernels"
    (pkg / "sub").mkdir(parents=True)
    for folder in (pkg, pkg / "sub"):
        (folder / "__init__.py").write_text("")
    line = exception_line(STDERR.format(pkg=pkg / "sub").splitlines())
    assert line == "PermissionError: [Errno 13] Permission denied: 'mykernels/sub/__init__.py'"
    assert str(tmp_path) not in line


def test_paths_outside_packages_keep_only_their_last_part() -> None:
    assert short_path("/etc/shadow") == ".../shadow"
    assert short_path("/venv/lib/python3.12/site-packages/torch/__init__.py") == "torch/__init__.py"
    assert exception_line(["no traceback here", "ValueError: bad /a/b/c.txt"]) == (
        "ValueError: bad .../c.txt"
    )
    assert exception_line(["all fine"]) == ""
    assert len(exception_line(["Traceback (most recent call last):", "E: " + "x" * 900])) == 500


def test_the_sandbox_reads_an_editable_install_s_sources_not_the_current_folder() -> None:
    """The test venv holds kassay editable (setuptools' finder: no sys.path entry for it)."""
    import kassay

    source = os.path.realpath(os.path.dirname(kassay.__file__))
    cwd = os.path.realpath(os.getcwd())
    assert source in installed_code(cwd)
    readable = python_readable()
    assert any(source == r or source.startswith(r + "/") for r in readable), readable
    assert cwd not in readable
    # one rule per tree
    assert not [a for a in readable for b in readable if a != b and a.startswith(b + "/")]
