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
Markdown file's YAML front matter (between ``---`` lines) becomes metadata. A document and the
rules every document passes: :mod:`indexing.document_rules`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from indexing.document_rules import SourceDocument, check_metadata, check_sizes, parse_document
from indexing.formats import FORMAT_SUFFIXES, PARSERS
from quarry.errors import InvalidDocument, InvalidRequest, PayloadTooLarge
from stores.base import Payload

TEXT_SUFFIXES = (".txt", ".md")
READ_SUFFIXES = TEXT_SUFFIXES + FORMAT_SUFFIXES
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)", re.DOTALL)


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
