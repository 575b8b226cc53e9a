"""/v1/artifacts: upload the code a job brings (a wheel or a single module), read what is stored.

An artifact is stored once per sha256 of its bytes: the same bytes uploaded again answer 200 with
the stored record instead of 201. Uploading needs the `code` scope (see kassay.api.auth).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from kassay.api.auth import require_code, require_read
from kassay.api.deps import Services, services
from kassay.api.route_common import ERROR_RESPONSES, read_body
from kassay.api.schemas import Artifact
from kassay.artifacts import inspect_artifact, sha256
from kassay.contract.spec import NO_CONTROL

router = APIRouter(prefix="/v1/artifacts", tags=["artifacts"])

DigestPath = Annotated[str, Path(pattern=r"^[0-9a-f]{64}$", description="sha256, lowercase hex")]


@router.post(
    "",
    status_code=201,
    response_model=Artifact,
    responses=ERROR_RESPONSES,
    dependencies=[Depends(require_code)],
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {
                    "schema": {"type": "string", "format": "binary"},
                }
            },
        }
    },
)
async def upload_artifact(
    request: Request,
    response: Response,
    svc: Annotated[Services, Depends(services)],
    filename: Annotated[
        str,
        Query(
            min_length=4,
            max_length=255,
            pattern=NO_CONTROL,
            description="the file's name: NAME-VERSION-...whl (a wheel) or NAME.py (a module)",
        ),
    ],
) -> Artifact:
    """Store a wheel or a single-module .py file by its sha256 (201; 200 with the stored record
    when the same bytes were uploaded before; 413 past
    KASSAY_MAX_ARTIFACT_BYTES; 422 when it is not a wheel or module kassay can load impls
    from). A job names it in `artifacts`."""
    data = await read_body(request, svc.settings.max_artifact_bytes)
    meta = await run_in_threadpool(inspect_artifact, data, filename)
    digest = sha256(data)
    record, created = await run_in_threadpool(
        svc.store.artifacts.put, digest, data, filename=filename, kind=meta.kind
    )
    response.headers["Location"] = f"/v1/artifacts/{digest}"
    if not created:
        response.status_code = 200
    return Artifact.of(record, entry_points=sorted(meta.entry_points))


@router.get("", response_model=list[Artifact], dependencies=[Depends(require_read)])
def list_artifacts(
    svc: Annotated[Services, Depends(services)],
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[Artifact]:
    """Stored artifacts, newest first."""
    return [Artifact.of(r) for r in svc.store.artifacts.recent(limit=limit)]


@router.get(
    "/{digest}",
    response_model=Artifact,
    responses=ERROR_RESPONSES,
    dependencies=[Depends(require_read)],
)
def get_artifact(digest: DigestPath, svc: Annotated[Services, Depends(services)]) -> Artifact:
    """One stored artifact's record."""
    return Artifact.of(svc.store.artifacts.require(digest))
