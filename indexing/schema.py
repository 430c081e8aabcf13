"""The state of record's schema, versioned by hand: numbered SQL scripts per dialect.

``indexing/migrations/<dialect>/NNNN_<what>.sql`` is step ``NNNN``; a database records the steps
it has in ``schema_migrations(version, applied_at)``, and each backend applies the missing ones
in order, in one transaction, when it opens (PostgreSQL under an advisory lock). Step 1 is the
schema Quarry wrote before steps were recorded (``CREATE ... IF NOT EXISTS``), so a database of
that release upgrades like any other. ``:now`` in a script is the time of the migration (Unix s).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from quarry.errors import StoreError

_FOLDER = Path(__file__).parent / "migrations"
_COMMENT = re.compile(r"--[^\n]*")


@dataclass(frozen=True)
class Step:
    """One migration step: its number, file name and statements."""

    version: int
    name: str
    statements: list[str]


def steps(dialect: str, now: float) -> list[Step]:
    """The steps of ``dialect`` (``sqlite`` or ``postgres``) in order, ``:now`` bound to ``now``."""
    out = []
    for path in sorted((_FOLDER / dialect).glob("[0-9][0-9][0-9][0-9]_*.sql")):
        text = _COMMENT.sub("", path.read_text(encoding="utf-8")).replace(":now", repr(float(now)))
        statements = [s.strip() for s in text.split(";") if s.strip()]
        out.append(Step(int(path.name[:4]), path.name, statements))
    return out


def check_known(dialect: str, applied: set[int], location: str) -> None:
    """Refuse a database that holds steps this Quarry does not know (written by a newer one).

    Raises:
        StoreError: ``applied`` holds a step past the last one known.
    """
    known = max(s.version for s in steps(dialect, 0.0))
    newer = sorted(v for v in applied if v > known)
    if newer:
        raise StoreError(
            f"the docstore {location} has schema steps {newer} that this Quarry does not know (it knows up to "
            f"{known}): it was written by a newer release; run that release, or restore a backup"
        )
