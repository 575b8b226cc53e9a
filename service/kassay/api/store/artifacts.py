"""Artifacts: the bytes of the code jobs bring, stored once per sha256, and which job named which.

The bytes live in the database (one table, so every API replica sharing a PostgreSQL sees them);
the dispatcher reads them back to send to a worker that does not hold them yet.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, insert, select
from sqlalchemy.exc import IntegrityError

from kassay.api.store.tables import artifacts, job_artifacts
from kassay.errors import NotFoundError


@dataclass
class ArtifactRecord:
    digest: str
    filename: str
    kind: str
    size: int
    created_at: float


_META = [artifacts.c.digest, artifacts.c.filename, artifacts.c.kind, artifacts.c.size]
_META.append(artifacts.c.created_at)


def _record(row: Any) -> ArtifactRecord:
    m = row._mapping
    return ArtifactRecord(m["digest"], m["filename"], m["kind"], m["size"], m["created_at"])


class Artifacts:
    """The artifacts of one database."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def put(
        self, digest: str, data: bytes, *, filename: str, kind: str
    ) -> tuple[ArtifactRecord, bool]:
        """Store an artifact under its digest; (record, created). The same bytes sent again are
        not stored twice: the first upload's record is returned."""
        existing = self.get(digest)
        if existing is not None:
            return existing, False
        now = time.time()
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    insert(artifacts).values(
                        digest=digest,
                        filename=filename,
                        kind=kind,
                        size=len(data),
                        data=data,
                        created_at=now,
                    )
                )
        except IntegrityError:  # a concurrent upload of the same bytes won
            record = self.get(digest)
            if record is None:
                raise
            return record, False
        return ArtifactRecord(digest, filename, kind, len(data), now), True

    def get(self, digest: str) -> ArtifactRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(*_META).where(artifacts.c.digest == digest)).first()
        return _record(row) if row is not None else None

    def require(self, digest: str) -> ArtifactRecord:
        record = self.get(digest)
        if record is None:
            raise NotFoundError(f"no artifact {digest}", details={"digest": digest})
        return record

    def data(self, digest: str) -> bytes:
        with self.engine.connect() as conn:
            data = conn.execute(
                select(artifacts.c.data).where(artifacts.c.digest == digest)
            ).scalar()
        if data is None:
            raise NotFoundError(f"no artifact {digest}", details={"digest": digest})
        return bytes(data)

    def missing(self, digests: Sequence[str]) -> list[str]:
        """The digests of `digests` that are not stored."""
        if not digests:
            return []
        with self.engine.connect() as conn:
            have = set(
                conn.execute(
                    select(artifacts.c.digest).where(artifacts.c.digest.in_(list(digests)))
                ).scalars()
            )
        return [d for d in digests if d not in have]

    def recent(self, *, limit: int = 100) -> list[ArtifactRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(*_META).order_by(artifacts.c.created_at.desc()).limit(limit)
            ).all()
        return [_record(r) for r in rows]

    def record_job(self, job_id: str, digests: Sequence[str]) -> None:
        """Remember that `job_id` runs these artifacts (idempotent)."""
        if not digests:
            return
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    insert(job_artifacts),
                    [{"job_id": job_id, "digest": d, "idx": i} for i, d in enumerate(digests)],
                )
        except IntegrityError:  # already recorded (an idempotent replay)
            pass

    def of_job(self, job_id: str) -> list[ArtifactRecord]:
        """The artifacts a job named, in the order it named them."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(*_META)
                .join(job_artifacts, job_artifacts.c.digest == artifacts.c.digest)
                .where(job_artifacts.c.job_id == job_id)
                .order_by(job_artifacts.c.idx)
            ).all()
        return [_record(r) for r in rows]
