"""Alembic's environment for the state of record (run by :func:`indexing.schema.upgrade`, never by hand).

Online: the caller hands a connection in ``config.attributes["connection"]``, inside its own
transaction and lock; each applied revision is also recorded in ``schema_migrations`` (the steps
ledger older releases read). Offline (:func:`indexing.schema.steps`): the SQL of each revision
for ``config.attributes["dialect"]``, literal values bound.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context

config = context.config
LEDGER = sa.text("INSERT INTO schema_migrations (version, applied_at) VALUES (:version, :at)")


def _record(ctx: Any, step: Any, heads: Any, run_args: Any) -> None:
    """Add an applied revision to the steps ledger (``schema_migrations``)."""
    for revision in step.up_revision_ids:
        ctx.connection.execute(LEDGER, {"version": int(revision), "at": float(config.attributes["now"])})


def run() -> None:
    """Apply (or, offline, print) the revisions asked for."""
    if context.is_offline_mode():
        context.configure(
            dialect_name=config.attributes["dialect"], literal_binds=True, transactional_ddl=False,
            on_version_apply=config.attributes.get("on_version_apply"),
        )
        context.run_migrations()
        return
    context.configure(connection=config.attributes["connection"], on_version_apply=_record)
    with context.begin_transaction():  # the caller's transaction: no nested one
        context.run_migrations()


run()
