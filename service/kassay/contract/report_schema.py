"""The report's JSON Schema (`kassay.report/v1`), as published in docs/report.schema.json.

python -m kassay.contract.report_schema           # write docs/report.schema.json
python -m kassay.contract.report_schema --check   # exit 1 if it is stale
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from kassay.contract.results import Report

DEFAULT = Path(__file__).resolve().parents[3] / "docs" / "report.schema.json"


def report_schema() -> dict[str, Any]:
    return Report.model_json_schema()


def schema_json() -> str:
    return json.dumps(report_schema(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = DEFAULT
    text = schema_json()
    if "--check" in args:
        if not path.exists() or path.read_text() != text:
            print(
                f"{path} is stale: run `python -m kassay.contract.report_schema`", file=sys.stderr
            )
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
