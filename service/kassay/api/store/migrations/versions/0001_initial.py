"""The store's schema as it was when migrations began: jobs, job_labels, groups, cases,
artifacts, job_artifacts, case_keys, comparisons.

A frozen copy (a revision never imports kassay.api.store.tables, which moves on). It creates only the
tables a database lacks: a database made by `create_all` before migrations existed (every
earlier kassay) already holds some or all of them, with these very definitions (tables were only
ever added, never changed), and is adopted as it is.

Revision ID: 0001
Revises:
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# frozen: the columns of this revision, not whatever kassay.contract.results.STATUSES holds later
STATUS_COLUMNS = ("passed", "failed", "error", "crashed", "timeout", "unsupported", "skipped")


def _job_fk() -> sa.ForeignKey:
    return sa.ForeignKey("jobs.id", ondelete="CASCADE")


def _tables() -> dict[str, tuple[sa.Column | sa.Index, ...]]:
    """Each table's columns and indexes, in creation order (referenced tables first)."""
    return {
        "jobs": (
            sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("id", sa.String(40), nullable=False, unique=True),
            sa.Column("name", sa.String(200), nullable=False, index=True),
            sa.Column("state", sa.String(16), nullable=False, index=True),
            sa.Column("labels", sa.JSON, nullable=False),
            sa.Column("spec", sa.JSON, nullable=False),
            sa.Column("idempotency_key", sa.String(200), unique=True),
            sa.Column("body_hash", sa.String(64)),
            sa.Column("created_at", sa.Float, nullable=False),
            sa.Column("started_at", sa.Float),
            sa.Column("finished_at", sa.Float),
            sa.Column("total", sa.Integer, nullable=False),
            sa.Column("done", sa.Integer, nullable=False),
            *(sa.Column(name, sa.Integer, nullable=False) for name in STATUS_COLUMNS),
            sa.Column("cancel_requested", sa.Boolean, nullable=False),
            sa.Column("environments", sa.JSON, nullable=False),
        ),
        "job_labels": (
            sa.Column("job_id", sa.String(40), _job_fk(), primary_key=True),
            sa.Column("key", sa.String(200), primary_key=True),
            sa.Column("value", sa.String(1000), nullable=False),
            sa.Index("ix_job_labels_kv", "key", "value"),
        ),
        "groups": (
            sa.Column("job_id", sa.String(40), _job_fk(), primary_key=True),
            sa.Column("group_id", sa.String(64), primary_key=True),
            sa.Column("job_seq", sa.Integer, nullable=False),
            sa.Column("idx", sa.Integer, nullable=False),
            sa.Column("spec", sa.JSON, nullable=False),
            sa.Column("state", sa.String(16), nullable=False),
            sa.Column("attempts", sa.Integer, nullable=False),
            sa.Column("worker", sa.String(200)),
            sa.Column("owner", sa.String(64)),
            sa.Column("lease_expires_at", sa.Float),
            sa.Column("last_error", sa.Text),
            sa.Index("ix_groups_queue", "state", "job_seq", "idx"),
        ),
        "cases": (
            sa.Column("job_id", sa.String(40), _job_fk(), primary_key=True),
            sa.Column("case_id", sa.String(200), primary_key=True),
            sa.Column("idx", sa.Integer, nullable=False),
            sa.Column("group_id", sa.String(64), nullable=False),
            sa.Column("impl", sa.String(200), nullable=False),
            sa.Column("dtype", sa.String(32), nullable=False),
            sa.Column("status", sa.String(16)),
            sa.Column("result", sa.JSON),
            sa.Column("seq", sa.Integer),
            sa.Column("finished_at", sa.Float),
            sa.Index("ix_cases_job_seq", "job_id", "seq"),
            sa.Index("ix_cases_job_group", "job_id", "group_id"),
        ),
        "artifacts": (
            sa.Column("digest", sa.String(64), primary_key=True),
            sa.Column("filename", sa.String(255), nullable=False),
            sa.Column("kind", sa.String(16), nullable=False),
            sa.Column("size", sa.Integer, nullable=False),
            sa.Column("data", sa.LargeBinary, nullable=False),
            sa.Column("created_at", sa.Float, nullable=False),
        ),
        "job_artifacts": (
            sa.Column("job_id", sa.String(40), _job_fk(), primary_key=True),
            sa.Column("digest", sa.String(64), sa.ForeignKey("artifacts.digest"), primary_key=True),
            sa.Column("idx", sa.Integer, nullable=False),
            sa.Index("ix_job_artifacts_digest", "digest"),
        ),
        "case_keys": (
            sa.Column("job_id", sa.String(40), _job_fk(), primary_key=True),
            sa.Column("case_id", sa.String(200), primary_key=True),
            sa.Column("key", sa.String(40), nullable=False),
            sa.Column("job_seq", sa.Integer, nullable=False),
            sa.Index("ix_case_keys_key_seq", "key", "job_seq"),
        ),
        "comparisons": (
            sa.Column("job_id", sa.String(40), _job_fk(), primary_key=True),
            sa.Column("to_job_id", sa.String(40)),
            sa.Column("created_at", sa.Float, nullable=False),
            sa.Column("result", sa.JSON),
            sa.Column("note", sa.Text),
        ),
    }


def upgrade() -> None:
    have: set[str] = set()
    if not context.is_offline_mode():
        have = set(sa.inspect(op.get_bind()).get_table_names())
    for name, parts in _tables().items():
        if name not in have:
            op.create_table(name, *parts)


def downgrade() -> None:
    for name in reversed(list(_tables())):
        op.drop_table(name)
