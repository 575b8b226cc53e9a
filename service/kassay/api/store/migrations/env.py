"""Alembic's environment for kassay's store: runs the revisions on the connection the caller
hands in (kassay.api.store.migrate), or on an engine made from the configured URL. SQLite runs
in batch mode (render_as_batch): its ALTER TABLE cannot change or drop columns, so a revision's
table changes become copy-and-rename there."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from kassay.api.store.database import make_engine
from kassay.api.store.tables import metadata

config = context.config


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():  # `alembic upgrade --sql`: print the DDL
    url = config.get_main_option("sqlalchemy.url") or ""
    context.configure(
        url=url,
        target_metadata=metadata,
        literal_binds=True,
        render_as_batch=url.startswith("sqlite"),
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    given = config.attributes.get("connection")
    if given is not None:
        _run(given)
    else:
        engine = make_engine(config.get_main_option("sqlalchemy.url") or "")
        try:
            with engine.connect() as conn:
                _run(conn)
                conn.commit()
        finally:
            engine.dispose()
