"""Alembic environment for tuner's tables, which share a database with Optuna's and never touch them."""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import create_engine, pool

from tuner.storage.schema import VERSION_TABLE, Base, include_name

config = context.config


def run(**target: Any) -> None:
    context.configure(
        **target,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        include_name=include_name,
        compare_type=True,
        # SQLite alters a table only by copying it; batch mode makes later migrations do so.
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    # `--sql`: the DDL as a script, for a database administrator to run.
    run(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
elif (connection := config.attributes.get("connection")) is not None:
    # The caller's connection, already in its transaction (storage.repository.Repository.migrate).
    run(connection=connection)
else:
    with create_engine(config.get_main_option("sqlalchemy.url"), poolclass=pool.NullPool).connect() as connection:
        run(connection=connection)
