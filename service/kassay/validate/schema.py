"""Write (or --check) the published JSON Schema of the report: docs/report.schema.json."""

from __future__ import annotations

import sys
from pathlib import Path

from kassay.reports import schema_json

DEFAULT = Path(__file__).resolve().parents[3] / "docs" / "report.schema.json"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = DEFAULT
    text = schema_json()
    if "--check" in args:
        if not path.exists() or path.read_text() != text:
            print(f"{path} is stale: run `python -m kassay.validate.schema`", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
