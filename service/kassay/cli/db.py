"""`kassay db upgrade` and `kassay db current`: the store's schema migrations (Alembic).

Run `kassay db upgrade` once per release before (or while) the API replicas start: the API
refuses a database behind its schema. Concurrent runs on one database wait for each other.
Exit codes: 0 done / at the newest revision, 1 behind (`current`), 2 the database could not be
reached or upgraded.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import Any


def register(sub: Any) -> None:
    if importlib.util.find_spec("alembic") is None:
        return  # the api extra is not installed: no database to migrate
    p = sub.add_parser("db", help="the API's database: schema migrations")
    dbsub = p.add_subparsers(dest="db_command", metavar="DB_COMMAND", required=True)
    up = dbsub.add_parser("upgrade", help="bring the database to this kassay's schema")
    _url_arg(up)
    up.add_argument("--revision", default="head", help="target revision (default: head)")
    up.set_defaults(func=cmd_upgrade)
    cur = dbsub.add_parser("current", help="the database's schema revision and this kassay's")
    _url_arg(cur)
    cur.set_defaults(func=cmd_current)


def _url_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database-url", default=None, help="default: KASSAY_DATABASE_URL")


def _url(args: argparse.Namespace) -> str:
    if args.database_url:
        return str(args.database_url)
    from kassay.settings import Settings

    return Settings().database_url


def cmd_upgrade(args: argparse.Namespace) -> int:
    from kassay.api.store.migrate import safe_url, upgrade

    url = _url(args)
    try:
        before, after = upgrade(url, args.revision)
    except Exception as exc:
        print(f"kassay db upgrade: {safe_url(url)}: {exc}", file=sys.stderr)
        return 2
    if before == after:
        print(f"{safe_url(url)}: already at revision {after}")
    else:
        print(f"{safe_url(url)}: upgraded from {before or 'no revision'} to {after}")
    return 0


def cmd_current(args: argparse.Namespace) -> int:
    from kassay.api.store.database import make_engine
    from kassay.api.store.migrate import safe_url, state

    url = _url(args)
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            st = state(conn)
    except Exception as exc:
        print(f"kassay db current: {safe_url(url)}: {exc}", file=sys.stderr)
        return 2
    finally:
        engine.dispose()
    where = "empty" if st.empty else (st.current or "no revision (made before migrations)")
    print(f"{safe_url(url)}: {where}; this kassay: {st.head}")
    return 0 if st.up_to_date else 1
