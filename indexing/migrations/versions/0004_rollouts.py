"""Step 4: a collection's rollout (gray release) of a candidate version, one row per collection.

``body`` is the rollout record as JSON (:class:`indexing.rollout.Rollout`); ``candidate`` and
``state`` are copied out of it for reading by hand. Times are Unix seconds.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TEXT: Any = sa.Text()
INT: Any = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
REAL: Any = sa.Double().with_variant(sa.REAL(), "sqlite")


def upgrade() -> None:
    """Create ``rollouts``."""
    op.create_table(
        "rollouts",
        sa.Column("collection_id", INT, primary_key=True),
        sa.Column("candidate", INT, nullable=False),
        sa.Column("state", TEXT, nullable=False),
        sa.Column("body", TEXT, nullable=False),
        sa.Column("updated_at", REAL, nullable=False),
    )


def downgrade() -> None:
    """No way back."""
    raise NotImplementedError("the state of record is never downgraded; restore a backup instead")
