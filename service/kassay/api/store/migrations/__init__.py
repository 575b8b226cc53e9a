"""Alembic migrations of the store's schema (kassay.api.store.tables), for SQLite and PostgreSQL.

Shipped inside the package so that `pip install kassay[api]` has them; `kassay db upgrade` runs
them (kassay.api.store.migrate). There is no alembic.ini: the configuration is made in code.

A change to kassay.api.store.tables needs a new revision in versions/ (tests/unit/api/test_migrations.py
fails while the two disagree). To draft one against a database at the current head:

    python -c "from alembic import command; from kassay.api.store.migrate import alembic_config;
    command.revision(alembic_config('sqlite:///draft.db'), message='what changed',
    autogenerate=True, rev_id='0002')"

then read and edit the draft: SQLite runs it in batch mode (table copies), PostgreSQL as
ALTERs, and an existing database's rows must survive it.
"""
