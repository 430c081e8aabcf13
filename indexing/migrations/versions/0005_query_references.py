"""Step 5: the reference of a collection version's query drift (:mod:`monitoring.drift`), per signal.

One row per (collection, store collection of a version, signal): ``body`` is the reference as
JSON, ``{"sum": [float, ...], "n": int}`` (the sum of its ``n`` unit query vectors, or of its
``n`` out-of-vocabulary shares). The first process to complete a reference writes it; every
other one, and any later restart, adopts it. Times are Unix seconds.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TEXT: Any = sa.Text()
INT: Any = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
REAL: Any = sa.Double().with_variant(sa.REAL(), "sqlite")


def upgrade() -> None:
    """Create ``query_references``."""
    op.create_table(
        "query_references",
        sa.Column("collection_id", INT, primary_key=True),
        sa.Column("physical", TEXT, primary_key=True),
        sa.Column("signal", TEXT, primary_key=True),
        sa.Column("body", TEXT, nullable=False),
        sa.Column("updated_at", REAL, nullable=False),
    )


def downgrade() -> None:
    """No way back."""
    raise NotImplementedError("the state of record is never downgraded; restore a backup instead")
