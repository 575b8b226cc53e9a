"""The one way a CaseResult is made from an input group: the engine (a case it ran), the worker's
supervisor (a case the executor could not report: crashed, timeout, group-level failure) and the
API's store (a case that never ran: skipped, worker lost) all build theirs here, so a case is
named alike whoever reports it.

Part of the torch-free contract: the supervisor and the API import it without torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kassay.contract.results import CaseResult, Status
from kassay.contract.spec import GroupSpec, case_id


def case_dtype(op: str, params: Mapping[str, Any]) -> str:
    """The dtype that names a case in results and tables, from the op's torch-free contract
    (`Op.case_dtype`: the params' `dtype`, or `amp-<autocast>` for flce's AMP case). Params that
    no longer validate (a group of an op this build does not know) fall back to their `dtype`."""
    from kassay.errors import KassayError
    from kassay.ops import get_op

    try:
        contract = get_op(op)
        return contract.case_dtype(contract.parse_params(dict(params)))
    except (KassayError, ValueError):
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
    case_dtype(group.op, group.params) (the store passes the one recorded at submission); `fields` are
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
        dtype=dtype if dtype is not None else case_dtype(group.op, group.params),
        status=status,
        message=message,
        **{"coverage": group.coverage, **fields},
    )
