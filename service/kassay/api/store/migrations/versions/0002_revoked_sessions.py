"""Signed-out browser sessions: the cookie's HMAC and when it would have expired (#31: sign-out
left the old cookie valid).

A frozen copy of the table (a revision never imports kassay.api.store.tables).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "revoked_sessions",
        sa.Column("mac", sa.String(64), primary_key=True),
        sa.Column("expires_at", sa.Float, nullable=False, index=True),
    )


def downgrade() -> None:
    op.drop_table("revoked_sessions")
