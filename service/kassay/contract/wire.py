"""pydantic <-> protobuf conversion for the kassay.v1 worker contract: the one wire module, used
by the API (kassay.api.dispatch) and the worker (kassay.worker.server.service) alike.

The protobuf messages mirror the pydantic models field for field, so most of the work is generic
(walk the message descriptor). Conventions:

- A pydantic None is an absent `optional` field (or an absent sub-message), and back.
- The tolerance/timing policies are read back through their pydantic models: a field the sender
  left out takes the model's default, and invalid values fail here with the field path
  (InvalidSpecError, which the worker maps to INVALID_ARGUMENT).
- An op's params travel as data: a JSON object (`params_json`), so a new op needs no proto
  change. The worker's edge reads them back through the params model of the op `op` names
  (`params_model`, the caller's: kassay.ops is a floor above); a validated dump round-trips
  exactly.
- Environment extras (the model allows them) travel as JSON text in `extra`.

Importing this module is cheap and imports no torch (op contracts are torch-free).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from google.protobuf.message import Message
from pydantic import BaseModel, ValidationError

from kassay.contract.results import CaseResult, Environment
from kassay.contract.spec import GroupSpec, TimingPolicy, TolerancePolicy, spec_error
from kassay.contract.v1 import worker_pb2 as pb
from kassay.errors import InvalidSpecError

Loc = tuple[str | int, ...]

_ENV_FIELDS = frozenset(pb.Environment.DESCRIPTOR.fields_by_name) - {"extra"}


def _invalid(loc: Loc, msg: str) -> InvalidSpecError:
    path = ".".join(str(p) for p in loc) or "(root)"
    return InvalidSpecError(f"{path}: {msg}", details={"errors": [{"loc": list(loc), "msg": msg}]})


def _is_map(f: Any) -> bool:
    return f.message_type is not None and f.message_type.GetOptions().map_entry


# --------------------------------------------------------------------------- generic walkers


def fill(msg: Message, data: Mapping[str, Any], loc: Loc = ()) -> Message:
    """Set `msg`'s fields from a plain dict (a pydantic dump). None values stay absent; an
    unknown key or a value of the wrong type raises InvalidSpecError naming the field."""
    fields = msg.DESCRIPTOR.fields_by_name
    for key, value in data.items():
        f = fields.get(key)
        here = (*loc, key)
        if f is None:
            raise _invalid(here, f"unknown field for {msg.DESCRIPTOR.name}")
        if value is None:
            continue
        try:
            if _is_map(f):
                getattr(msg, key).update(value)
            elif f.is_repeated and f.message_type is not None:
                container = getattr(msg, key)
                for i, item in enumerate(value):
                    fill(container.add(), item, (*here, i))
            elif f.is_repeated:
                getattr(msg, key).extend(value)
            elif f.message_type is not None:
                sub = getattr(msg, key)
                sub.SetInParent()
                fill(sub, value, here)
            else:
                setattr(msg, key, value)
        except (TypeError, ValueError) as exc:
            raise _invalid(here, f"cannot be sent as protobuf {f.type}: {exc}") from None
    return msg


def read(msg: Message, *, omit_absent: bool = False) -> dict[str, Any]:
    """A plain dict of `msg`'s fields: absent optional fields and sub-messages become None (or
    are left out with omit_absent, so that a pydantic model fills its defaults)."""
    out: dict[str, Any] = {}
    for f in msg.DESCRIPTOR.fields:
        value = getattr(msg, f.name)
        if _is_map(f):
            out[f.name] = dict(value)
        elif f.is_repeated:
            out[f.name] = (
                [read(v, omit_absent=omit_absent) for v in value]
                if f.message_type is not None
                else list(value)
            )
        elif f.has_presence and not msg.HasField(f.name):
            if not omit_absent:
                out[f.name] = None
        elif f.message_type is not None:
            out[f.name] = read(value, omit_absent=omit_absent)
        else:
            out[f.name] = value
    return out


def _validate(model: type[BaseModel], data: dict[str, Any], loc: Loc) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise spec_error(exc, loc) from None


# ------------------------------------------------------------------------------------ params


#: the params model of an op by name (kassay.ops: `get_op(op).params_model`), raising
#: InvalidSpecError (UnknownOpError) for an op it does not know. The codec takes it from its
#: caller: the contract is the floor below the ops and imports none of them.
ParamsModel = Callable[[str], type[BaseModel]]


def set_params(msg: Message, params: Mapping[str, Any]) -> None:
    """Put an op's params into msg's `params_json` (GroupSpec or CaseResult). The params are a
    validated dump already (the API's admission, the engine's case): the encoder checks nothing
    (the receiving edge does, `get_params`)."""
    msg.params_json = json.dumps(dict(params), sort_keys=True)  # type: ignore[attr-defined]


def get_params(
    msg: Message, op: str, loc: Loc = (), params_model: ParamsModel | None = None
) -> dict[str, Any]:
    """msg's `params_json` as a dict: through op `op`'s params model when `params_model` is
    given (an edge that runs them: defaults filled in, bad values refused naming the field),
    else as the JSON object it is (a result from a trusted worker)."""
    raw = _json_object(msg.params_json, (*loc, "params_json"))  # type: ignore[attr-defined]
    if raw is None:
        raise _invalid((*loc, "params_json"), "missing: the op's params as a JSON object")
    if not op:
        raise _invalid((*loc, "op"), "must name the op")
    if params_model is None:
        return raw
    params = _validate(params_model(op), raw, (*loc, "params"))
    return dict(params.model_dump())


# ------------------------------------------------------------------------------------ groups


def group_to_proto(group: GroupSpec) -> pb.GroupSpec:
    """GroupSpec (pydantic) -> kassay.v1.GroupSpec."""
    msg = pb.GroupSpec(
        group_id=group.group_id,
        suite_index=group.suite_index,
        op=group.op,
        regime=group.regime,
        seed=group.seed,
        impls=list(group.impls),
        baseline=group.baseline,
        coverage=group.coverage,
        artifacts=list(group.artifacts),
        skip=group.skip,
    )
    set_params(msg, group.params)
    if group.convergence is not None:
        msg.convergence = group.convergence.model_dump_json()
    fill(msg.tolerance, group.tolerance.model_dump(), ("tolerance",))
    fill(msg.timing, group.timing.model_dump(), ("timing",))
    return msg


def group_from_proto(
    msg: pb.GroupSpec, loc: Loc = (), *, params_model: ParamsModel | None = None
) -> GroupSpec:
    """kassay.v1.GroupSpec -> GroupSpec, validating the policies, and the params through
    `params_model` when given (the worker's edge gives it: InvalidSpecError with the field path
    under `loc` on a bad value)."""
    if not msg.group_id:
        raise _invalid((*loc, "group_id"), "must not be empty")
    if not msg.impls:
        raise _invalid((*loc, "impls"), "must list at least one impl")
    if msg.skip:
        raise _invalid((*loc, "skip"), f"a skipped grid point is never run ({msg.skip})")
    op = msg.op
    params = get_params(msg, op, loc, params_model)
    tolerance = (
        _validate(TolerancePolicy, read(msg.tolerance, omit_absent=True), (*loc, "tolerance"))
        if msg.HasField("tolerance")
        else TolerancePolicy.model_validate({})
    )
    timing = (
        _validate(TimingPolicy, read(msg.timing, omit_absent=True), (*loc, "timing"))
        if msg.HasField("timing")
        else TimingPolicy.model_validate({})
    )
    return _validate(
        GroupSpec,
        {
            "group_id": msg.group_id,
            "suite_index": msg.suite_index,
            "op": op,
            "params": params,
            "regime": msg.regime or "normal",
            "seed": msg.seed,
            "impls": list(msg.impls),
            "baseline": msg.baseline or "torch",
            "tolerance": tolerance,
            "timing": timing,
            "coverage": msg.coverage,
            "artifacts": list(msg.artifacts),
            "convergence": _json_object(msg.convergence, (*loc, "convergence")),
        },
        loc,
    )


def _json_object(text: str, loc: Loc) -> dict[str, Any] | None:
    """A JSON object field (empty: None)."""
    if not text:
        return None
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise _invalid(loc, f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise _invalid(loc, "must be a JSON object")
    return obj


def groups_from_proto(
    msgs: Sequence[pb.GroupSpec], *, params_model: ParamsModel | None = None
) -> list[GroupSpec]:
    return [
        group_from_proto(m, ("groups", i), params_model=params_model) for i, m in enumerate(msgs)
    ]


# ------------------------------------------------------------------------------- environment


def environment_to_proto(env: Environment, msg: pb.Environment | None = None) -> pb.Environment:
    msg = pb.Environment() if msg is None else msg
    data = env.model_dump()
    extra = {k: data.pop(k) for k in list(data) if k not in _ENV_FIELDS}
    fill(msg, data, ("environment",))
    for k, v in extra.items():
        msg.extra[k] = json.dumps(v, sort_keys=True, default=str)
    return msg


def environment_from_proto(msg: pb.Environment) -> Environment:
    data = read(msg)
    extra = data.pop("extra")
    for k, v in extra.items():
        try:
            data[k] = json.loads(v)
        except ValueError:
            data[k] = v
    return Environment.model_validate(data)


# ----------------------------------------------------------------------------------- results

_RESULT_SPECIAL = ("params", "environment", "convergence")


def result_to_proto(result: CaseResult, msg: pb.CaseResult | None = None) -> pb.CaseResult:
    """CaseResult (pydantic) -> kassay.v1.CaseResult."""
    msg = pb.CaseResult() if msg is None else msg
    data = result.model_dump(exclude=set(_RESULT_SPECIAL))
    fill(msg, data)
    set_params(msg, result.params)
    if result.environment is not None:
        environment_to_proto(result.environment, msg.environment)
    if result.convergence is not None:
        msg.convergence = result.convergence.model_dump_json()
    return msg


def result_from_proto(msg: pb.CaseResult) -> CaseResult:
    """kassay.v1.CaseResult -> CaseResult (its params as the worker's engine dumped them)."""
    data = read(msg)
    for key in ("params_json", *_RESULT_SPECIAL):
        data.pop(key, None)
    data["params"] = get_params(msg, msg.op)
    data["environment"] = (
        environment_from_proto(msg.environment) if msg.HasField("environment") else None
    )
    data["convergence"] = _json_object(msg.convergence, ("convergence",))
    return CaseResult.model_validate(data)


__all__ = [
    "ParamsModel",
    "environment_from_proto",
    "environment_to_proto",
    "fill",
    "get_params",
    "group_from_proto",
    "group_to_proto",
    "groups_from_proto",
    "read",
    "result_from_proto",
    "result_to_proto",
    "set_params",
]
