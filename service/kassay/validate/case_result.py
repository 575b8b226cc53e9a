"""The one way a CaseResult is made from an input group: the engine (a case it ran), the worker's
supervisor (a case the executor could not report: crashed, timeout, group-level failure) and the
API's store (a case that never ran: skipped, worker lost) all build theirs here, so a case is
named alike whoever reports it.

Part of the torch-free contract: the supervisor and the API import it without torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kassay.validate.results import CaseResult, Status
from kassay.validate.spec import GroupSpec, case_id


def case_dtype(params: Mapping[str, Any]) -> str:
    """The dtype that names a case in results and tables, from a group's params dump: the
    params' `dtype`, or `amp-<autocast>` for an AMP case (float32 parameters under
    torch.autocast, flce's `autocast` option).

    The same naming as each op's `Op.case_dtype` (kassay.ops), which needs the op's runtime
    module; this reads the params dump so that processes without torch name cases alike.
    tests/unit/test_case_result.py holds the two equal for every op."""
    autocast = params.get("autocast")
    if autocast is not None and autocast != "none":
        return f"amp-{autocast}"
    return str(params.get("dtype", "float32"))


def case_result(
    group: GroupSpec,
    impl: str,
    status: Status,
    message: str = "",
    *,
    dtype: str | None = None,
    **fields: Any,
) -> CaseResult:
    """The result of `impl` in `group` with `status` and `message`. `dtype` defaults to
    case_dtype(group.params) (the store passes the one recorded at submission); `fields` are
    CaseResult's other fields (outputs, timing, memory, duration_s, worker, device,
    environment)."""
    return CaseResult(
        case_id=case_id(group.group_id, impl),
        group_id=group.group_id,
        suite_index=group.suite_index,
        op=group.op,
        impl=impl,
        params=group.params,
        regime=group.regime,
        seed=group.seed,
        dtype=dtype if dtype is not None else case_dtype(group.params),
        status=status,
        message=message,
        **fields,
    )
