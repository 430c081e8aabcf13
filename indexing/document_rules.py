"""A document as Quarry reads it, and the one set of document rules every source and the REST body pass.

:func:`parse_document` validates one JSON object (a JSONL line, a BEIR ``corpus.jsonl`` row, a
REST body's document): its id, text, title, sections and flat metadata; :func:`check_sizes`
bounds a batch; :func:`check_unicode` and :func:`is_blank` are shared with the query path.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from indexing.formats import Section
from indexing.text import long_word
from quarry.errors import InvalidDocument, InvalidRequest, PayloadTooLarge, clip
from stores.base import Payload
from stores.filters import FIELD_NAME

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
RESERVED_FIELDS = frozenset({"document_id", "chunk_id", "position", "title", "text"})
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # the integers a metadata field may hold
MAX_METADATA_BYTES = 32 * 1024  # a document's metadata as UTF-8 JSON; Milvus's JSON field holds 64 KiB
DOT_SEGMENTS = frozenset({".", ".."})  # refused as an id or a '/'-separated part of one
DOCUMENT_KEYS = frozenset({"id", "_id", "text", "title", "metadata", "sections"})


@dataclass(frozen=True)
class SourceDocument:
    """One document to ingest.

    Attributes:
        id: Caller's document id (unique within a collection).
        text: Body text.
        title: Optional title, indexed with every chunk of the document.
        metadata: Flat metadata, filterable.
        sections: Where its pages or heading sections start (offsets into ``text``, ascending)
            and what their chunks carry (``page``, ``section``); empty: one section. A chunk
            never crosses a section boundary.
    """

    id: str
    text: str
    title: str = ""
    metadata: Payload = field(default_factory=dict)
    sections: tuple[Section, ...] = ()


def parse_document(raw: Any) -> SourceDocument:
    """Validate one JSON object as a document: the one set of document rules.

    A JSONL line (:func:`iter_jsonl`) and a document of the REST API's upsert body (whose
    pydantic model, ``quarry.api.models.DocumentIn``, only declares the fields and their JSON
    types) both go through here.

    Raises:
        InvalidDocument: Not an object, missing/empty id or text, non-string title, bad metadata,
            a lone surrogate or a NUL character in a string, a control character in the id, an id
            that is or holds a ``.`` or ``..`` segment between slashes.
    """
    if not isinstance(raw, dict):
        raise InvalidDocument(f"expected a JSON object, got {type(raw).__name__}")
    doc_id = raw.get("id", raw.get("_id"))
    if isinstance(doc_id, int) and not isinstance(doc_id, bool):
        doc_id = str(doc_id)
    doc_id = _check_id(doc_id)
    text, title = raw.get("text"), raw.get("title", "") or ""
    if not isinstance(text, str):
        raise InvalidDocument(f"document {doc_id!r}: 'text' must be a string")
    if not isinstance(title, str):
        raise InvalidDocument(f"document {doc_id!r}: 'title' must be a string")
    if not (text.strip() or title.strip()):
        raise InvalidDocument(f"document {doc_id!r}: 'text' and 'title' are both empty")
    metadata = check_metadata(_with_extra_fields(raw, doc_id), doc_id)
    fields: list[tuple[str, object]] = [("'id'", doc_id), ("'text'", text), ("'title'", title)]
    for key, value in metadata.items():
        fields += [(f"metadata field {clip(key)}", v) for v in (value if isinstance(value, list) else [value])]
    for where, field_value in fields:
        if isinstance(field_value, str):
            check_unicode(field_value, f"document {doc_id[:40]!r}: {where}", InvalidDocument)
            if "\x00" in field_value:  # PostgreSQL's text and jsonb refuse it
                raise InvalidDocument(
                    f"document {doc_id[:40]!r}: {where} holds a NUL character (\\u0000) at character "
                    f"{field_value.index(chr(0))}; remove it"
                )
    return SourceDocument(doc_id, text, title, metadata, _sections(raw.get("sections"), doc_id, len(text)))


def _sections(value: Any, doc_id: str, length: int) -> tuple[Section, ...]:
    """A line's ``sections``: ``[{"start", "metadata"?}]``, starts from 0, strictly ascending, inside the text.

    Raises:
        InvalidDocument: Not that shape, or a start out of order or past the text; bad metadata.
    """
    if value is None:
        return ()
    where = f"document {doc_id[:40]!r}: 'sections'"
    if not isinstance(value, list) or not all(isinstance(s, dict) and set(s) <= {"start", "metadata"} for s in value):
        raise InvalidDocument(f"{where} must be a list of {{\"start\": offset, \"metadata\": {{...}}}} objects")
    out: list[Section] = []
    for i, raw in enumerate(value):
        start = raw.get("start")
        low = out[-1].start + 1 if out else 0
        if not isinstance(start, int) or isinstance(start, bool) or not low <= start < max(length, 1) or (
            not out and start != 0
        ):
            raise InvalidDocument(f"{where}[{i}].start must be an integer offset into the text, the first 0, "
                                  f"ascending; got {clip(str(start))}")
        out.append(Section(start, check_metadata(raw.get("metadata") or {}, doc_id)))
    return tuple(out)


def _with_extra_fields(raw: dict[str, Any], doc_id: str) -> Any:
    """``metadata`` plus the line's other top-level fields (kept, not dropped).

    Raises:
        InvalidDocument: A top-level field is also in ``metadata``.
    """
    meta = raw.get("metadata") or {}
    extra = {k: v for k, v in raw.items() if k not in DOCUMENT_KEYS}
    if not extra or not isinstance(meta, dict):
        return meta
    both = sorted(set(extra) & set(meta))
    if both:
        raise InvalidDocument(
            f"document {doc_id!r}: field {clip(both[0])} is both a top-level field and in 'metadata'; "
            "top-level fields other than id, text, title and metadata are kept as metadata"
        )
    return {**meta, **extra}


def _check_id(doc_id: object) -> str:
    """A document id: at most 256 characters, none a control character, no ``.`` or ``..`` segment."""
    if not isinstance(doc_id, str) or not doc_id.strip():
        raise InvalidDocument("missing or empty 'id' (or '_id'): a non-empty string is required")
    if len(doc_id) > 256:
        raise InvalidDocument(f"document id is longer than 256 characters: {doc_id[:40]!r}...")
    control = _CONTROL.search(doc_id)
    if control is not None:  # invisible in logs and tables, and a trailing newline fools route patterns
        raise InvalidDocument(
            f"document id {doc_id[:40]!r} holds a control character (U+{ord(control.group()):04X}) at "
            f"character {control.start()}; ids are printable text"
        )
    if DOT_SEGMENTS & set(doc_id.split("/")):
        # HTTP clients remove dot segments from a URL (RFC 3986, 5.2.4) before sending it:
        # DELETE .../collections/c/documents/.. reaches the server as DELETE .../collections/c,
        # which drops the whole collection.
        raise InvalidDocument(
            f"document id {doc_id[:40]!r} is or holds a '.' or '..' path segment, which HTTP clients "
            "resolve away in DELETE /v1/collections/{name}/documents/{id} (deleting another resource): "
            "rename the document"
        )
    return doc_id


def check_sizes(docs: Sequence[SourceDocument], *, max_document_chars: int, max_token_chars: int) -> None:
    """Refuse documents over the server's size limits (``QUARRY_INGEST__MAX_*``), before any is written.

    Args:
        docs: The documents of one ingestion.
        max_document_chars: Longest text plus title, in characters.
        max_token_chars: Longest word, in characters (see :func:`indexing.text.long_word`).

    Raises:
        PayloadTooLarge: A document is longer than ``max_document_chars`` (HTTP 413).
        InvalidDocument: A document holds a word longer than ``max_token_chars``.
    """
    for doc in docs:
        size = len(doc.text) + len(doc.title)
        if size > max_document_chars:
            raise PayloadTooLarge(
                f"document {doc.id[:40]!r} is {size:,} characters (text and title); the limit is "
                f"{max_document_chars:,} (QUARRY_INGEST__MAX_DOCUMENT_CHARS): split it into several documents"
            )
        for where, value in (("text", doc.text), ("title", doc.title)):
            word = long_word(value, max_token_chars)
            if word is not None:
                raise InvalidDocument(
                    f"document {doc.id[:40]!r}: its {where} holds a word of over {max_token_chars:,} characters "
                    f"at character {word.start()} ({word.group()[:24]!r}...); the limit is "
                    "QUARRY_INGEST__MAX_TOKEN_CHARS"
                )


def check_unicode(text: str, where: str, error: type[InvalidRequest]) -> None:
    r"""Reject a lone UTF-16 surrogate (JSON allows ``"\ud800"``): no tokenizer or store takes one.

    Raises:
        error: ``text`` cannot be encoded as UTF-8; the message gives the character offset.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(
            f"{where} holds an unpaired UTF-16 surrogate ({text[exc.start]!r}) at character {exc.start}; "
            "send valid Unicode"
        ) from exc


# Characters that show nothing: control, format (zero-width, BOM, bidi marks), surrogate and separator
# categories, plus the default-ignorable letters and marks Unicode lists outside them (Hangul fillers,
# variation selectors, the combining grapheme joiner) and the blank braille pattern.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zs", "Zl", "Zp"})
_INVISIBLE = re.compile(
    "[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u2800\u3164\ufe00-\ufe0f\uffa0\U000e0100-\U000e01ef]"
)


def is_blank(text: str) -> bool:
    r"""Whether ``text`` holds no visible character: empty, or only whitespace and invisible characters.

    ``"   "``, ``"\u200b\u200b"``, ``"\u0000"`` and ``"\ufeff"`` are all blank: a tokenizer finds
    no term in them and a model embeds them as noise, so a search for one answers arbitrary neighbours.
    Stops at the first visible character (a normal query: the first).
    """
    return not any(
        not ch.isspace() and unicodedata.category(ch) not in _INVISIBLE_CATEGORIES and not _INVISIBLE.match(ch)
        for ch in text
    )


def check_metadata(meta: Any, doc_id: str) -> Payload:
    """Validate flat metadata: identifier keys; str, int, float, bool or list-of-str values.

    Raises:
        InvalidDocument: Nested objects, mixed lists, NaN or infinite numbers, integers outside
            64 bits, reserved or invalid field names, metadata over :data:`MAX_METADATA_BYTES` as JSON.
    """
    if not isinstance(meta, dict):
        raise InvalidDocument(f"document {doc_id!r}: 'metadata' must be an object")
    for key, value in meta.items():
        if not FIELD_NAME.fullmatch(key) or key in RESERVED_FIELDS:
            raise InvalidDocument(
                f"document {doc_id!r}: invalid metadata field name {clip(key)} "
                f"(identifiers only; reserved: {', '.join(sorted(RESERVED_FIELDS))})"
            )
        if isinstance(value, list):
            if not all(isinstance(v, str) for v in value):
                raise InvalidDocument(f"document {doc_id!r}: list field {clip(key)} must hold strings only")
        elif not isinstance(value, str | int | float | bool) or value is None:
            raise InvalidDocument(
                f"document {doc_id!r}: field {clip(key)} must be a string, number, boolean or list of strings"
            )
        elif isinstance(value, float) and not math.isfinite(value):  # Python's json takes NaN, Infinity
            raise InvalidDocument(f"document {doc_id!r}: field {clip(key)} is {value}; numbers must be finite")
        elif isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
            # JSON allows any integer; stores, filters and the response encoder (orjson) hold 64 bits:
            # a stored 2**70 made every search that returned its document a 500.
            raise InvalidDocument(
                f"document {doc_id!r}: field {clip(key)} is an integer outside the 64-bit range "
                f"[-2**63, 2**63 - 1]: send it as a string or a float"
            )
    size = len(json.dumps(meta, ensure_ascii=False).encode("utf-8", "surrogatepass"))  # lone ones: refused next
    if size > MAX_METADATA_BYTES:
        # The vector stores keep metadata in the chunk's payload: Milvus refuses a JSON field over
        # 64 KiB (a 500 StoreError, with Milvus's text, before this check).
        raise InvalidDocument(
            f"document {doc_id!r}: its metadata is {size:,} bytes as JSON; the limit is {MAX_METADATA_BYTES:,}: "
            "keep large values in the text"
        )
    return dict(meta)
