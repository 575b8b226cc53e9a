"""The `kassay` command, one package (the top floor: it may import every area). Each module
registers its own subcommands:

- local.py: `run`, `selftest` (the engine in this process)
- worker.py: `worker`
- api.py: `api`, `serve`, `demo`; db.py: `db upgrade|current`
- the SDK's kassay_client.cli: `submit`, `wait`, `report`, `compare`, `jobs`, `cancel` (it
  ships with the SDK, which imports no service module)

Registration modules keep heavy imports (torch, grpc, fastapi) inside their command functions so
that `kassay --help` and the client commands start fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from kassay.triton_mode import ensure_triton_mode

_AREAS = (
    "kassay.cli.local",
    "kassay.cli.worker",
    "kassay.cli.api",
    "kassay.cli.db",
    "kassay_client.cli",
)


def build_parser() -> argparse.ArgumentParser:
    from kassay import __version__

    parser = argparse.ArgumentParser(prog="kassay", description="kassay: kernel assay")
    parser.add_argument("--version", action="version", version=f"kassay {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _AREAS:
        try:
            area = importlib.import_module(mod)
        except ImportError:
            continue  # an area whose extra is not installed offers no commands
        area.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    ensure_triton_mode()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `kassay jobs --json | head`: the reader left; no traceback (Python's documented way:
        # point stdout at /dev/null so the interpreter's final flush does not raise again)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as exc:
        from pydantic import ValidationError

        if not isinstance(exc, ValidationError) or exc.title != "Settings":
            raise
        # a bad KASSAY_* value: one line per setting, exit 2 like every other refusal
        for err in exc.errors():
            name = "KASSAY_" + "_".join(str(p) for p in err["loc"]).upper()
            print(f"kassay: bad setting {name}: {err['msg']}", file=sys.stderr)
        return 2
