"""Regenerate the checked-in gRPC stubs from protos/kassay/contract/v1/*.proto.

    python -m kassay.contract.protogen            # write service/kassay/contract/v1/
    python -m kassay.contract.protogen --check    # exit 1 if the checked-in stubs are stale

The stubs are generated with grpcio-tools (pinned in the dev extra: GPU hosts run grpcio of the
same minor, and newer tools emit code that refuses older runtimes) and mypy-protobuf for typed
.pyi files. protoc is run with `-I protos`, so the generated imports read
`from kassay.contract.v1 import worker_pb2`, which resolves because service/ is the source root.
"""

from __future__ import annotations

import argparse
import difflib
import shutil
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
PROTO_ROOT = REPO_ROOT / "protos"
STUB_DIR = REPO_ROOT / "service" / "kassay" / "contract" / "v1"
PACKAGE = Path("kassay") / "contract" / "v1"
GRPC_TOOLS_VERSION = "1.84.2"

INIT_TEXT = '''"""Generated protobuf/gRPC stubs of the kassay.v1 worker contract
(protos/kassay/contract/v1/; the proto package, and so the gRPC service names, stay kassay.v1).

Never edit by hand: run `make protos` (python -m kassay.contract.protogen).
"""
'''


class ProtogenError(RuntimeError):
    """The stubs cannot be generated here (missing tools, wrong versions, protoc failed)."""


def _plugin(name: str) -> str:
    """Path of a protoc plugin installed next to this interpreter (or on PATH)."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise ProtogenError(f"{name} not found: install the dev extra (mypy-protobuf)")
    return found


def _check_tools() -> None:
    try:
        from grpc_tools import grpc_version
    except ImportError as exc:
        raise ProtogenError("grpcio-tools is not installed: install the dev extra") from exc
    if grpc_version.VERSION != GRPC_TOOLS_VERSION:
        raise ProtogenError(
            f"grpcio-tools {grpc_version.VERSION} installed, but the stubs are generated with "
            f"{GRPC_TOOLS_VERSION} (pinned in pyproject.toml's dev extra)"
        )


def proto_files() -> list[Path]:
    """The .proto files, relative to PROTO_ROOT, in a stable order."""
    files = sorted(p.relative_to(PROTO_ROOT) for p in (PROTO_ROOT / PACKAGE).glob("*.proto"))
    if not files:
        raise ProtogenError(f"no .proto files under {PROTO_ROOT / PACKAGE}")
    return files


def generate(out_root: Path) -> Path:
    """Generate every stub into out_root/kassay/contract/v1/ and return that directory."""
    _check_tools()
    from importlib.resources import files

    from grpc_tools import protoc

    well_known = str(files("grpc_tools") / "_proto")
    out_dir = out_root / PACKAGE
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out=quiet:{out_root}",
        f"--mypy_grpc_out=quiet:{out_root}",
        *[str(p) for p in proto_files()],
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise ProtogenError(f"protoc failed with exit code {rc}: {' '.join(args[1:])}")
    (out_dir / "__init__.py").write_text(INIT_TEXT)
    return out_dir


def _generated_names(directory: Path) -> set[str]:
    return {
        p.name
        for p in directory.iterdir()
        if p.is_file() and (p.name == "__init__.py" or "_pb2" in p.name)
    }


def write() -> list[str]:
    """Regenerate into STUB_DIR (replacing stale stubs); returns the file names written."""
    with tempfile.TemporaryDirectory(prefix="kassay-protogen-") as tmp:
        fresh = generate(Path(tmp))
        STUB_DIR.mkdir(parents=True, exist_ok=True)
        names = sorted(_generated_names(fresh))
        for stale in _generated_names(STUB_DIR) - set(names):
            (STUB_DIR / stale).unlink()
        for name in names:
            shutil.copyfile(fresh / name, STUB_DIR / name)
    return names


def check() -> list[str]:
    """Problems that make the checked-in stubs differ from freshly generated ones (empty: fresh)."""
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kassay-protogen-") as tmp:
        fresh = generate(Path(tmp))
        want = _generated_names(fresh)
        have = _generated_names(STUB_DIR) if STUB_DIR.is_dir() else set()
        for name in sorted(want - have):
            problems.append(f"missing: {STUB_DIR / name}")
        for name in sorted(have - want):
            problems.append(f"not generated from any .proto: {STUB_DIR / name}")
        for name in sorted(want & have):
            new, old = (fresh / name).read_text(), (STUB_DIR / name).read_text()
            if new != old:
                diff = difflib.unified_diff(
                    old.splitlines(),
                    new.splitlines(),
                    f"checked-in/{name}",
                    f"generated/{name}",
                    lineterm="",
                    n=1,
                )
                lines = list(diff)
                more = f"\n  ... {len(lines) - 12} more diff lines" if len(lines) > 12 else ""
                problems.append(f"stale: {STUB_DIR / name}\n  " + "\n  ".join(lines[:12]) + more)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kassay.contract.protogen", description="regenerate the kassay.v1 gRPC stubs"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="do not write; exit 1 if the checked-in stubs are stale",
    )
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = check()
            if problems:
                print(
                    "gRPC stubs are stale; run `make protos` and commit the result:",
                    file=sys.stderr,
                )
                for p in problems:
                    print(f"- {p}", file=sys.stderr)
                return 1
            print(f"gRPC stubs in {STUB_DIR} are up to date")
            return 0
        names = write()
    except ProtogenError as exc:
        print(f"protogen: {exc}", file=sys.stderr)
        return 2 if not args.check else 1
    print(f"wrote {', '.join(names)} to {STUB_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
