"""Step 3: an API key's LLM token quota, in tokens per second (NULL: unlimited).

The quota is enforced over a moving window of 60 s (quarry/api/access.py ``TokenQuota``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``api_keys.token_rate``."""
    op.add_column("api_keys", sa.Column("token_rate", sa.Double().with_variant(sa.REAL(), "sqlite"), nullable=True))


def downgrade() -> None:
    """No way back."""
    raise NotImplementedError("the state of record is never downgraded; restore a backup instead")
