r"""One validation at the edge for the client's texts that name things: what may reach a store, a file or SQL.

Every text of a request that names something (a collection, a document, a job, a cursor, a
model, a path on the server) is checked here before any store, file system or SQL sees it; the
texts that are data (a query, a filter's values, a document's text and metadata) are checked by
their own parsers, which name the document or filter field at fault
(:func:`indexing.documents.parse_document`, :func:`stores.filters.parse_filter`, the search's query
check), and the rule below for every other string of a body.

Rules (each broken one is a 400 ``InvalidRequest`` in the error envelope, never a 5xx: a NUL is
refused by PostgreSQL, a lone UTF-16 surrogate cannot be encoded for SQLite or any driver, a
control character is invisible in logs and fools route patterns, and a name longer than the
file system's 255 bytes fails the lock file's ``open``):

* **a name** (:func:`name`): the ``{name}`` of a route, the collection of a chat ``model``
  (``quarry/<name>``): :data:`indexing.collections.NAME` (a letter, then letters, digits, ``_``;
  at most 63), the only names a collection can have.
* **an identifier** (:func:`identifier`): every other path parameter (``document_id``, ``job_id``),
  every query parameter (``cursor``, ``on_error``, ...), a model's name or URL, an ingest job's
  ``path``: no NUL, no lone surrogate, no control character (U+0000-U+001F, U+007F-U+009F), at most
  :data:`MAX_IDENTIFIER_CHARS` (a document id: 256, as stored ids; a job id: 64).
* **any other text of a body** (:func:`text`, :class:`Checked`): no NUL and no lone surrogate, keys
  included. The ids of ``POST .../documents/delete`` are such texts (at most 256 characters): a
  legacy id with a control character, stored before ids were checked, is deleted there.

:func:`check_params` runs as the first dependency of every route (path and query parameters);
request bodies derive from :class:`Checked`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated, Any, ClassVar

from fastapi import Request
from pydantic import AfterValidator, BaseModel, ValidationInfo, model_validator

from indexing.collections import NAME
from quarry.errors import InvalidRequest, clip

CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_BAD_TEXT = re.compile(r"[\x00\ud800-\udfff]")
MAX_IDENTIFIER_CHARS = 1024  # a model URL or an ingest path; names and ids have their own, lower limits
# path parameters with a limit of their own (a route's {name} is a collection name: NAME)
PARAM_CHARS = {"document_id": 256, "job_id": 64}
QUERY_CHARS = 256  # a query parameter's value: a cursor is a document id


def _char(ch: str) -> str:
    if ch == "\x00":
        return "a NUL character"
    if "\ud800" <= ch <= "\udfff":
        return f"an unpaired UTF-16 surrogate ({ch!r})"
    return f"a control character (U+{ord(ch):04X})"


def is_text(value: str) -> bool:
    """Whether ``value`` holds no NUL and no lone UTF-16 surrogate (:func:`text` would pass it)."""
    return (value.isascii() and "\x00" not in value) or _BAD_TEXT.search(value) is None


def text(value: str, where: str) -> str:
    """``value`` when it holds no NUL and no lone UTF-16 surrogate.

    Raises:
        InvalidRequest: It does; the message names ``where`` and the character's offset.
    """
    if value.isascii() and "\x00" not in value:
        return value
    bad = _BAD_TEXT.search(value)
    if bad is not None:
        raise InvalidRequest(f"{where} holds {_char(bad.group())} at character {bad.start()}; send printable Unicode")
    return value


def identifier(value: str, where: str, max_chars: int = MAX_IDENTIFIER_CHARS) -> str:
    """``value`` when it is an identifier: no NUL, surrogate or control character; at most ``max_chars``.

    Raises:
        InvalidRequest: It is not; the message names ``where``, the character and its offset.
    """
    if len(value) > max_chars:
        raise InvalidRequest(f"{where} is {len(value):,} characters; the limit is {max_chars:,}: {clip(value)}")
    text(value, where)
    bad = CONTROL.search(value)
    if bad is not None:
        raise InvalidRequest(f"{where} holds {_char(bad.group())} at character {bad.start()}: {clip(value)}")
    return value


def name(value: str, where: str = "collection name") -> str:
    """``value`` when it is a collection name (:data:`indexing.collections.NAME`).

    Raises:
        InvalidRequest: It is not: no collection can have it.
    """
    if NAME.fullmatch(value) is None:
        identifier(value, where, 63)  # names the character when there is a worse fault than the pattern
        raise InvalidRequest(
            f"invalid {where} {clip(value)}: start with a letter; letters, digits and '_' only; at most 63"
        )
    return value


async def check_params(request: Request) -> None:
    """The first dependency of every route: its path and query parameters (see the module doc).

    Raises:
        InvalidRequest: A parameter breaks its rule.
    """
    for param, value in request.path_params.items():
        if param == "name":
            name(value)
        else:
            identifier(value, f"path parameter {param!r}", PARAM_CHARS.get(param, MAX_IDENTIFIER_CHARS))
    for param, value in request.query_params.multi_items():
        identifier(param, "a query parameter's name", QUERY_CHARS)
        identifier(value, f"query parameter {param!r}", QUERY_CHARS)


def _identifier(value: str, info: ValidationInfo) -> str:
    return identifier(value, info.field_name or "a field")


# A body field that names something (a model, a path): an identifier (400 otherwise).
Identifier = Annotated[str, AfterValidator(_identifier)]


def check_json(value: Any, where: str = "body", skip: Iterable[str] = ()) -> None:
    """Refuse a NUL or a lone surrogate in any string of a JSON value, object keys included.

    ``skip``: the top-level keys of an object not to walk (a parser of their own checks them).

    Raises:
        InvalidRequest: A string breaks :func:`text`; the message gives its JSON path.
    """
    if isinstance(value, str):
        text(value, where)
    elif isinstance(value, dict):
        skipped = frozenset(skip)
        for key, item in value.items():
            if isinstance(key, str):
                text(key, f"a key of {where}")
            if key not in skipped:
                check_json(item, f"{where}.{key}" if where != "body" else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_json(item, f"{where}[{i}]")


class Checked(BaseModel):
    """A request body whose strings are checked by :func:`check_json` before anything else.

    ``parsed_later``: fields a parser of their own checks, with a message naming the document or
    filter field (documents, filters, a query).
    """

    parsed_later: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _edge(cls, data: Any) -> Any:
        check_json(data, skip=cls.parsed_later)
        return data
