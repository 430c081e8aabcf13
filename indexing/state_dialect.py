"""What the two dialects spell differently, as SQLAlchemy compiler extensions (``sqlalchemy.ext.compiler``).

* :class:`json_id`: the ``"id"`` of a JSON text column, as text (a version's chunking id);
* :class:`json_in`: ``column IN`` the strings of one JSON-array parameter.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement


class json_id(FunctionElement[str]):  # noqa: N801 - an SQL function's name
    """``"id"`` of a JSON text column, as text (SQLite ``json_extract``, PostgreSQL ``->>``)."""

    type = sa.Text()
    inherit_cache = True


@compiles(json_id, "sqlite")
def _json_id_sqlite(element: json_id, compiler: Any, **kw: Any) -> str:
    return f"json_extract({compiler.process(element.clauses, **kw)}, '$.id')"


@compiles(json_id, "postgresql")
def _json_id_postgres(element: json_id, compiler: Any, **kw: Any) -> str:
    return f"(CAST({compiler.process(element.clauses, **kw)} AS json) ->> 'id')"


class json_in(FunctionElement[Any]):  # noqa: N801 - an SQL function's name
    """``column IN (the strings of a JSON array bound as one text parameter)``.

    One parameter whatever the list's length: SQLAlchemy's expanding ``IN`` re-renders the
    statement for every call (~60 µs of a ~100 µs search-page read on SQLite).
    """

    type = sa.types.NullType()  # not Boolean: SQLite would compare it "= 1" and lose the index
    inherit_cache = True


@compiles(json_in, "sqlite")
def _json_in_sqlite(element: json_in, compiler: Any, **kw: Any) -> str:
    column, values = (compiler.process(c, **kw) for c in element.clauses)
    return f"{column} IN (SELECT value FROM json_each({values}))"


@compiles(json_in, "postgresql")
def _json_in_postgres(element: json_in, compiler: Any, **kw: Any) -> str:
    column, values = (compiler.process(c, **kw) for c in element.clauses)
    # = ANY(ARRAY(...)): an init plan, so the primary key's index takes the list (IN (SELECT ...) was a
    # hash semi-join over every chunk of the collection)
    return f"{column} = ANY(ARRAY(SELECT json_array_elements_text(CAST({values} AS json))))"
