"""The job store's schema (SQLAlchemy Core): jobs, their labels, input groups and cases; the
artifacts code jobs bring and which job named which.

Times are float epoch seconds (portable across SQLite and PostgreSQL, cheap to compare).
A case row exists from submission on; its status and result fill in when the worker reports it,
so an unfinished case is a row whose status is NULL.

Every change to these tables needs an Alembic revision (kassay/api/store/migrations/versions; a test
fails while they disagree): databases are created and upgraded by `kassay db upgrade`, never by
create_all. History: `case_keys` indexes every case result by its case key (kassay.validate.compare_reports)
for the series of one case over jobs; `comparisons` records the verdict of a job whose spec
asks for a comparison (compare_to).
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

from kassay.contract.results import STATUSES

metadata = MetaData()

STATUS_COLUMNS = STATUSES  # a count column per case status

jobs = Table(
    "jobs",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(40), nullable=False, unique=True),
    Column("name", String(200), nullable=False, index=True),
    Column("state", String(16), nullable=False, index=True),
    Column("labels", JSON, nullable=False),
    Column("spec", JSON, nullable=False),
    Column("idempotency_key", String(200), unique=True),
    Column("body_hash", String(64)),
    Column("created_at", Float, nullable=False),
    Column("started_at", Float),
    Column("finished_at", Float),
    Column("total", Integer, nullable=False),
    Column("done", Integer, nullable=False, default=0),
    *(Column(name, Integer, nullable=False, default=0) for name in STATUS_COLUMNS),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("environments", JSON, nullable=False),
)

job_labels = Table(
    "job_labels",
    metadata,
    Column("job_id", String(40), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("key", String(200), primary_key=True),
    Column("value", String(1000), nullable=False),
    Index("ix_job_labels_kv", "key", "value"),
)

groups = Table(
    "groups",
    metadata,
    Column("job_id", String(40), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("group_id", String(64), primary_key=True),
    Column("job_seq", Integer, nullable=False),
    Column("idx", Integer, nullable=False),
    Column("spec", JSON, nullable=False),
    Column("state", String(16), nullable=False),  # pending | leased | done | cancelled
    Column("attempts", Integer, nullable=False, default=0),
    Column("worker", String(200)),
    Column("owner", String(64)),
    Column("lease_expires_at", Float),
    Column("last_error", Text),
    Index("ix_groups_queue", "state", "job_seq", "idx"),
)

cases = Table(
    "cases",
    metadata,
    Column("job_id", String(40), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("case_id", String(200), primary_key=True),
    Column("idx", Integer, nullable=False),
    Column("group_id", String(64), nullable=False),
    Column("impl", String(200), nullable=False),
    Column("dtype", String(32), nullable=False),
    Column("status", String(16)),
    Column("result", JSON),
    Column("seq", Integer),
    Column("finished_at", Float),
    Index("ix_cases_job_seq", "job_id", "seq"),
    Index("ix_cases_job_group", "job_id", "group_id"),
)

# Code jobs bring artifacts (a wheel or a single module), stored once per sha256 of their bytes.
artifacts = Table(
    "artifacts",
    metadata,
    Column("digest", String(64), primary_key=True),
    Column("filename", String(255), nullable=False),
    Column("kind", String(16), nullable=False),  # wheel | module
    Column("size", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
    Column("created_at", Float, nullable=False),
)

# Which artifacts each code job named (and so ran: its groups run only with all of them loaded).
job_artifacts = Table(
    "job_artifacts",
    metadata,
    Column("job_id", String(40), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("digest", String(64), ForeignKey("artifacts.digest"), primary_key=True),
    Column("idx", Integer, nullable=False),
    Index("ix_job_artifacts_digest", "digest"),
)

case_keys = Table(
    "case_keys",
    metadata,
    Column("job_id", String(40), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("case_id", String(200), primary_key=True),
    Column("key", String(40), nullable=False),
    Column("job_seq", Integer, nullable=False),
    Index("ix_case_keys_key_seq", "key", "job_seq"),
)

comparisons = Table(
    "comparisons",
    metadata,
    Column("job_id", String(40), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("to_job_id", String(40)),  # NULL: no job matched the spec's compare_to
    Column("created_at", Float, nullable=False),
    Column("result", JSON),  # the Comparison; NULL with to_job_id NULL
    Column("note", Text),  # why there is no comparison
)

revoked_sessions = Table(
    "revoked_sessions",
    metadata,
    # a signed-out browser session: the cookie's HMAC, refused until the cookie would expire
    Column("mac", String(64), primary_key=True),
    Column("expires_at", Float, nullable=False, index=True),
)
