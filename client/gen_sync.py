"""Generate the SDK's blocking client (kassay_client/_sync/) from its one definition, the async
client (kassay_client/_async/), with unasync, then format it with ruff.

    python client/gen_sync.py            write the generated files (`make sdk`)
    python client/gen_sync.py --check    exit 1 when they are stale (tests/unit runs this)
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import unasync

PACKAGE = Path(__file__).resolve().parent / "kassay_client"
HEADER = (
    "# Generated from kassay_client/_async/{name} by client/gen_sync.py (unasync): do not\n"
    "# edit; edit the async definition and run `make sdk`.\n"
)
#: names the async definition uses that the blocking client spells differently (unasync's own
#: rules already turn async/await, __aenter__, AsyncIterator ... into their blocking forms)
REPLACEMENTS = {
    "AsyncClient": "Client",
    "AsyncJobs": "Jobs",
    "AsyncArtifacts": "Artifacts",
    "AsyncWorkers": "Workers",
    "AsyncBaseTransport": "BaseTransport",
    "aclose": "close",
    "aread": "read",
    "aiter_lines": "iter_lines",
    "_aio": "_io",
}


def generate() -> dict[str, str]:
    """{file name: text} of the blocking twin of every module of _async/."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "_async"
        shutil.copytree(PACKAGE / "_async", src)
        files = sorted(str(p) for p in src.glob("*.py"))
        rule = unasync.Rule("/_async/", "/_sync/", additional_replacements=REPLACEMENTS)
        unasync.unasync_files(files, rules=[rule])
        out = Path(tmp) / "_sync"
        for path in out.glob("*.py"):
            path.write_text(HEADER.format(name=path.name) + path.read_text())
        # what the blocking spelling allows that the async one did not (import order,
        # `yield from`, parentheses left by a removed await), then the house format
        ruff = [sys.executable, "-m", "ruff"]
        root = PACKAGE.parent.parent  # the repository's ruff settings
        fixes = ["--fix", "--unsafe-fixes", "--select", "I,UP028,UP034", "--quiet"]
        subprocess.run([*ruff, "check", *fixes, str(out)], check=True, cwd=root)
        subprocess.run([*ruff, "format", "--quiet", str(out)], check=True, cwd=root)
        return {p.name: p.read_text() for p in sorted(out.glob("*.py"))}


def stale() -> list[str]:
    """The generated files that differ from what _async/ gives now (or are missing)."""
    want = generate()
    have = {p.name: p.read_text() for p in (PACKAGE / "_sync").glob("*.py")}
    return sorted(k for k in want.keys() | have.keys() if want.get(k) != have.get(k))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if args.check:
        bad = stale()
        if bad:
            print(f"stale: {', '.join(bad)} (run `make sdk`)", file=sys.stderr)
        return 1 if bad else 0
    target = PACKAGE / "_sync"
    target.mkdir(exist_ok=True)
    for name, text in generate().items():
        (target / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
