"""Document sources: a BEIR folder, a JSONL file, or a folder of files.

A JSONL source is validated in full before anything is written: a malformed line raises
:class:`~quarry.errors.InvalidDocument` naming the file and the 1-based line number, so a bad
file stores nothing. A folder is read file by file (:func:`stream_folder`): ``.txt``, ``.md``
and, with the ``formats`` extra, ``.pdf``, ``.html``/``.htm`` and ``.docx``
(:mod:`indexing.formats`). A file that cannot be parsed or decoded is reported with the reason
and skipped or fails the run (``QUARRY_INGEST__ON_ERROR``); files of other formats are counted
and named in the :class:`SourceReport`, never silently passed over.

JSONL lines are objects ``{"id" | "_id": str, "text": str, "title"?: str, "metadata"?: {...}}``
(BEIR's ``corpus.jsonl`` is the same with ``_id``); any other top-level field is kept as
metadata, but ``sections``: ``[{"start": offset, "metadata": {...}}, ...]`` (the first at 0,
ascending) gives the document's sections (:class:`SourceDocument`), as a PDF's pages are read
here: how ``quarry ingest --server`` uploads a PDF without losing its pages. Metadata values
are flat: string, number, boolean, or a list of strings; field names are identifiers. A
Markdown file's YAML front matter (between ``---`` lines) becomes metadata.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from indexing.formats import FORMAT_SUFFIXES, PARSERS, Section
from quarry.errors import InvalidDocument, InvalidRequest, PayloadTooLarge, clip
from indexing.text import long_word
from stores.base import Payload
from stores.filters import FIELD_NAME

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
RESERVED_FIELDS = frozenset({"document_id", "chunk_id", "position", "title", "text"})
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # the integers a metadata field may hold
MAX_METADATA_BYTES = 32 * 1024  # a document's metadata as UTF-8 JSON; Milvus's JSON field holds 64 KiB
DOT_SEGMENTS = frozenset({".", ".."})  # refused as an id or a '/'-separated part of one
TEXT_SUFFIXES = (".txt", ".md")
READ_SUFFIXES = TEXT_SUFFIXES + FORMAT_SUFFIXES
DOCUMENT_KEYS = frozenset({"id", "_id", "text", "title", "metadata", "sections"})
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)", re.DOTALL)


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


@dataclass
class SourceReport:
    """What reading a source found besides its documents.

    Attributes:
        read: Documents yielded.
        errors: ``(path, reason)`` of files that could not be parsed or decoded (skipped under
            ``on_error="skip"``).
        not_read: Paths of files of formats Quarry does not read (or whose extra is missing).
        empty: Paths of files with no text.
    """

    read: int = 0
    errors: list[tuple[str, str]] = field(default_factory=list)
    not_read: list[str] = field(default_factory=list)
    empty: list[str] = field(default_factory=list)


def detect_format(path: Path) -> str:
    """``beir`` (folder with ``corpus.jsonl``), ``jsonl`` (a file) or ``folder`` (txt/md files).

    Raises:
        InvalidRequest: The path does not exist or holds nothing Quarry can read.
    """
    if path.is_dir() and (path / "corpus.jsonl").is_file():
        return "beir"
    if path.is_file() and path.suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if path.is_dir():
        return "folder"
    raise InvalidRequest(f"{path}: not a BEIR folder, a .jsonl file or a folder of .txt/.md files")


def read_documents(path: Path, *, max_document_chars: int = 1_000_000) -> list[SourceDocument]:
    """Read and validate every document of a source.

    Args:
        path: A BEIR folder, a ``.jsonl`` file or a folder of files (:func:`iter_folder`; here
            the first file that cannot be read fails the call). ``quarry ingest`` streams
            instead (:class:`Source`).
        max_document_chars: ``QUARRY_INGEST__MAX_DOCUMENT_CHARS``: a file of a folder over
            ``4 *`` this many bytes (UTF-8 takes at most 4 per character) is refused unread.

    Returns:
        The documents, in source order.

    Raises:
        InvalidDocument: A malformed line or document, or bytes that are not UTF-8 (the message
            names file and line).
        InvalidRequest: The path is not a readable source (missing, not permitted, an I/O error).
    """
    fmt = detect_format(path)
    try:
        if fmt == "beir":
            return list(iter_jsonl(path / "corpus.jsonl"))
        if fmt == "jsonl":
            return list(iter_jsonl(path))
        return list(iter_folder(path, max_document_chars=max_document_chars))
    except OSError as exc:  # unreadable file, I/O error: one error line, not a traceback
        where = exc.filename or path
        raise InvalidRequest(f"{where}: cannot be read: {exc.strerror or exc}") from exc


class Source:
    """A source read as a stream: ``total`` known up front, documents yielded one at a time.

    A JSONL file (or BEIR folder) is validated in a first pass that keeps only the ids (a bad
    line fails the run before anything is written); the second pass yields the documents. A
    folder yields its files one by one (:func:`iter_folder`), recording in :attr:`report` what
    it skipped. Memory stays flat in the number of documents (the ids of a JSONL file aside).

    Attributes:
        path: The source.
        format: ``beir``, ``jsonl`` or ``folder``.
        total: Documents (JSONL) or readable files (folder) to expect, for progress and ETA.
        report: What reading skipped; complete once the iteration is done.
    """

    def __init__(
        self, path: Path, *, on_error: str = "skip", max_document_chars: int = 1_000_000, max_token_chars: int = 1024,
        confine: Sequence[Path] | None = None,
    ) -> None:
        """Open and (a JSONL file) validate a source.

        ``confine`` (resolved folders): a folder's files that resolve outside all of them (links
        out) are file errors, never read (a REST job's source; the path itself is checked by
        the caller).

        Raises:
            InvalidDocument: A malformed JSONL line (file and line named).
            PayloadTooLarge: A JSONL document over ``max_document_chars``.
            InvalidRequest: The path is not a readable source.
        """
        self.path, self.format = path, detect_format(path)
        self.report = SourceReport()
        self._on_error = on_error
        self._confine = confine
        self._limits = {"max_document_chars": max_document_chars, "max_token_chars": max_token_chars}
        try:
            if self.format == "folder":
                self.total = sum(1 for p in path.rglob("*") if p.is_file() and p.suffix.lower() in READ_SUFFIXES)
            else:
                self.total = 0
                for doc in iter_jsonl(self._jsonl):
                    check_sizes([doc], **self._limits)
                    self.total += 1
        except OSError as exc:
            raise InvalidRequest(f"{exc.filename or path}: cannot be read: {exc.strerror or exc}") from exc

    @property
    def _jsonl(self) -> Path:
        return self.path / "corpus.jsonl" if self.format == "beir" else self.path

    def __iter__(self) -> Iterator[SourceDocument]:
        """The documents, in source order.

        Raises:
            InvalidDocument: Under ``on_error="fail"``, a file that cannot be read (named).
            InvalidRequest: The source cannot be read (I/O error).
        """
        try:
            if self.format == "folder":
                yield from iter_folder(
                    self.path, on_error=self._on_error, report=self.report, confine=self._confine, **self._limits
                )
                return
            for doc in iter_jsonl(self._jsonl):
                self.report.read += 1
                yield doc
        except OSError as exc:
            raise InvalidRequest(f"{exc.filename or self.path}: cannot be read: {exc.strerror or exc}") from exc


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(1-based line number, object)`` for each non-blank line of a JSONL file.

    The one JSONL reader: documents to ingest (:func:`iter_jsonl`) and BEIR's corpus and
    queries (:mod:`eval.beir`) are read with it.

    Raises:
        InvalidRequest: ``path`` does not exist or is not a file.
        InvalidDocument: A line is not valid JSON, not a JSON object or not UTF-8 (file and line named).
        OSError: The file cannot be read.
    """
    if not path.is_file():
        raise InvalidRequest(f"{path} does not exist or is not a file")
    with path.open("rb") as fh:
        for line_no, raw_line in enumerate(fh, start=1):
            try:
                line = raw_line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidDocument(
                    f"not valid UTF-8 text: byte {raw_line[exc.start]:#04x} at byte {exc.start} of the line",
                    line=line_no, source=str(path),
                ) from exc
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidDocument(f"invalid JSON: {exc.msg}", line=line_no, source=str(path)) from exc
            if not isinstance(raw, dict):
                raise InvalidDocument(
                    f"expected a JSON object, got {type(raw).__name__}", line=line_no, source=str(path)
                )
            yield line_no, raw


def iter_jsonl(path: Path) -> Iterator[SourceDocument]:
    """Parse a JSONL file of documents line by line (blank lines are skipped).

    Raises:
        InvalidRequest: ``path`` does not exist or is not a file.
        InvalidDocument: Bad JSON, missing/empty id or text, duplicate id, bad metadata.
    """
    seen: dict[str, int] = {}
    for line_no, raw in read_jsonl(path):
        try:
            doc = parse_document(raw)
        except InvalidDocument as exc:
            raise InvalidDocument(exc.message, line=line_no, source=str(path)) from exc
        if doc.id in seen:
            raise InvalidDocument(
                f"duplicate document id {doc.id!r} (first at line {seen[doc.id]})",
                line=line_no,
                source=str(path),
            )
        seen[doc.id] = line_no
        yield doc


def iter_folder(
    path: Path,
    *,
    max_document_chars: int = 1_000_000,
    max_token_chars: int | None = None,
    on_error: str = "fail",
    report: SourceReport | None = None,
    confine: Sequence[Path] | None = None,
) -> Iterator[SourceDocument]:
    """Every file below ``path`` Quarry reads, one document each; the id is the relative path.

    Files are read one at a time, in path order (memory does not grow with the folder).

    Args:
        path: The folder.
        max_document_chars: A file over ``4 * max_document_chars`` bytes cannot hold a document
            within the limit (UTF-8 takes at most 4 bytes a character): it is refused from its
            size, before it is read (a stray multi-GB log would otherwise be read whole first).
        max_token_chars: When given, a document holding a longer word is a file error too.
        on_error: ``"fail"`` raises at the first file that cannot be read; ``"skip"`` records it
            in ``report.errors`` and goes on.
        report: Filled with the files skipped, not read (other formats) and empty.
        confine: Resolved folders: a file that resolves outside all of them (a link out) is a
            file error, never opened.

    Raises:
        InvalidRequest: The folder holds no file of a format Quarry reads.
        InvalidDocument: Under ``on_error="fail"``: a file is not valid UTF-8, damaged, over the
            size limit, or has invalid front matter (the message names it).
        PayloadTooLarge: Under ``on_error="fail"``: a parsed document is over ``max_document_chars``.
    """
    report = report if report is not None else SourceReport()
    files = sorted(p for p in path.rglob("*") if p.is_file())
    if not any(f.suffix.lower() in READ_SUFFIXES for f in files):
        raise InvalidRequest(f"{path}: no {', '.join(READ_SUFFIXES)} files found")
    for file in files:
        rel = file.relative_to(path).as_posix()
        if file.suffix.lower() not in READ_SUFFIXES:
            report.not_read.append(rel)
            continue
        try:
            if confine is not None and not is_inside(file.resolve(), confine):
                raise InvalidDocument(f"{file}: links outside the allowed ingest roots; not read")
            doc = read_file(file, rel, max_document_chars=max_document_chars)
            if doc is not None and max_token_chars is not None:
                check_sizes([doc], max_document_chars=max_document_chars, max_token_chars=max_token_chars)
        except (InvalidDocument, PayloadTooLarge) as exc:
            if on_error == "fail":
                raise
            report.errors.append((str(file), exc.message.removeprefix(f"{file}: ")))
            continue
        except OSError as exc:
            if on_error == "fail":
                raise
            report.errors.append((str(file), f"cannot be read: {exc.strerror or exc}"))
            continue
        if doc is None:
            report.empty.append(rel)
            continue
        report.read += 1
        yield doc


def is_inside(path: Path, roots: Sequence[Path]) -> bool:
    """Whether the resolved ``path`` is one of the resolved ``roots`` or below one."""
    return any(path == root or path.is_relative_to(root) for root in roots)


def read_file(file: Path, rel: str, *, max_document_chars: int = 1_000_000) -> SourceDocument | None:
    """One file of a folder as a document (``None``: it has no text).

    Raises:
        InvalidDocument: Over the size limit, not UTF-8, bad front matter, or a damaged PDF/HTML/DOCX
            (:class:`indexing.formats.FormatError`).
        ConfigError: A PDF/HTML/DOCX without the ``formats`` extra.
        OSError: The file cannot be read.
    """
    size = file.stat().st_size
    if size > 4 * max_document_chars:
        raise InvalidDocument(
            f"the file is {size:,} bytes; a document holds at most {max_document_chars:,} characters "
            f"(QUARRY_INGEST__MAX_DOCUMENT_CHARS), {4 * max_document_chars:,} bytes of UTF-8: split it",
            source=str(file),
        )
    suffix = file.suffix.lower()
    metadata: Payload = {"source": rel, "format": {"htm": "html"}.get(suffix[1:], suffix[1:])}
    if suffix in PARSERS:
        parsed = PARSERS[suffix](file)
        return SourceDocument(rel, parsed.text, parsed.title, metadata, parsed.sections)
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidDocument(
            f"not valid UTF-8 text: byte {exc.object[exc.start]:#04x} at byte {exc.start}", source=str(file)
        ) from exc
    title = file.stem
    if suffix == ".md":
        text, front = front_matter(text, str(file))
        front_title = front.pop("title", None)
        title = front_title if isinstance(front_title, str) and front_title.strip() else title
        metadata = {**check_metadata(front, rel), **metadata}
    return SourceDocument(rel, text, title, metadata) if text.strip() else None


def front_matter(text: str, where: str) -> tuple[str, dict[str, Any]]:
    """Split YAML front matter (``---`` lines around it, at the very start) from a Markdown text.

    Dates become ISO strings; ``title`` is returned with the rest (the caller takes it as the title).

    Returns:
        ``(text after the front matter, its fields)``; ``(text, {})`` when there is none.

    Raises:
        InvalidDocument: The front matter is not YAML, or not a mapping.
    """
    import datetime as dt

    import yaml

    match = _FRONT_MATTER.match(text.lstrip("\ufeff"))
    if match is None:
        return text, {}
    try:
        fields = yaml.safe_load(match.group(1)) or {}
    except yaml.YAMLError as exc:
        raise InvalidDocument(f"front matter is not valid YAML: {exc}", source=where) from exc
    if not isinstance(fields, dict):
        raise InvalidDocument("front matter must be a mapping of fields", source=where)

    def flat(value: Any) -> Any:
        if isinstance(value, dt.date | dt.datetime):
            return value.isoformat()
        if isinstance(value, list):
            return [flat(v) if isinstance(v, dt.date | dt.datetime) else v for v in value]
        return value

    return text.lstrip("\ufeff")[match.end() :], {str(k): flat(v) for k, v in fields.items()}


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
